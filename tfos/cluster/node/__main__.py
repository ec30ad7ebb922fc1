"""``python -m tfos.cluster.node``: the TF process's entry point, with its NodeConfig as one encoded line
on stdin. Only here does the process end itself (``os._exit``): when its agent dies, and at the end
so that TF's and user threads cannot keep a finished node alive."""

import faulthandler
import logging
import os
import sys
import traceback

from tfos.errors import TFOSError
from tfos.host.processes import STACKS_FILE, STACKS_SIGNAL
from tfos.host import processes
from tfos.cluster.node.exits import write_error
from tfos.cluster.node.hints import hint
from tfos.cluster.node.runtime import run_node
from tfos.wire import messages as M


def main() -> None:
    cfg = M.decode(sys.stdin.buffer.readline())
    if not isinstance(cfg, M.NodeConfig):
        raise TFOSError(f"the TF process expects a NodeConfig on stdin, got {type(cfg).__name__}")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    processes.start_pipe_watchdog(cfg.watchdog_fd, lambda: os._exit(70))
    # every thread's Python stack on SIGUSR1, for the driver's stall watchdog and cluster.dump_stacks()
    stacks = open(os.path.join(cfg.node_dir, STACKS_FILE), "w")
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    sys.path[:0] = [p for p in cfg.sys_path if p not in sys.path]
    code = 1
    try:
        code = run_node(cfg)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            write_error(cfg.node_dir, traceback.format_exc())
    except BaseException as e:
        tb = traceback.format_exc()
        tip = hint(tb)
        tb += f"{tip}\n" if tip else ""
        sys.stderr.write(tb)
        write_error(cfg.node_dir, tb, e)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: TF's and user threads must not keep a finished node alive at interpreter exit.
    os._exit(code)


if __name__ == "__main__":
    main()
