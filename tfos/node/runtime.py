"""Start-up of the TF process and the call of ``main_fun`` (runs in the TF process).

Watch the agent (exit when it dies), hold a TF server port, start the feed hub
(InputMode.SPARK), register with the driver, wait for the whole cluster spec, set TF_CONFIG
and the backend's environment, then call ``main_fun(args, ctx)`` through the backend's node
hooks. A raised exception is written to ``error.txt`` in the node directory (the agent
forwards it to the driver) and the process exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

from tfos.errors import TFOSError
from tfos.host import claims, processes
from tfos.node.context import NodeContext
from tfos.node.reporting import Reporter
from tfos.topology import InputMode
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)


def load_function_file(path: str):
    """``(main_fun, args, node_hooks)`` from the node's private function file (written by the
    barrier task with cloudpickle; deleted once read)."""
    from pyspark import cloudpickle

    with open(path, "rb") as f:
        loaded = cloudpickle.load(f)
    os.remove(path)
    return loaded


def run_node(cfg: M.NodeConfig) -> int:
    c = cfg.cluster
    driver = DriverClient.for_node(cfg)
    held = claims.reserve_tf_port(os.getpid())
    hub = None
    if c.input_mode == InputMode.SPARK:
        from tfos.node.hub import FeedHub

        hub = FeedHub(c.secret, c.feed_queue_chunks, on_terminate=driver.feed_terminated).start()
    info = M.NodeInfo(cfg.node_index, cfg.job_name, cfg.task_index, cfg.host, held.getsockname()[1],
                      hub.port if hub else 0, os.getpid())
    driver.register(info)
    reply = driver.cluster_spec(c.reservation_timeout)
    main_fun, args, hooks = load_function_file(cfg.fn_path)
    reporter = Reporter(driver, c.report_interval, c.timeline)
    ctx = NodeContext(cfg, reply.nodes, held, hub, hooks, reporter)
    if hub is not None:
        hub.reporter = reporter
    os.environ["TF_CONFIG"] = json.dumps(ctx.tf_config)
    me = next(n for n in reply.nodes if n.node_index == cfg.node_index)
    os.environ.update(hooks.env(me, reply.nodes, reply.backend))
    logger.info("node %d is %s:%d; TF_CONFIG=%s", ctx.node_index, ctx.job_name, ctx.task_index,
                os.environ["TF_CONFIG"])
    if c.release_port:
        ctx.release_port()
    try:
        with ctx.trace("main_fun", "node"):
            hooks.run(main_fun, args, ctx)
    finally:
        reporter.close()
    if hub is not None:
        hub.close()
    return 0


def main() -> None:
    cfg = M.decode(sys.stdin.buffer.readline())
    if not isinstance(cfg, M.NodeConfig):
        raise TFOSError(f"the TF process expects a NodeConfig on stdin, got {type(cfg).__name__}")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    processes.start_pipe_watchdog(cfg.watchdog_fd, lambda: os._exit(70))
    sys.path[:0] = [p for p in cfg.sys_path if p not in sys.path]
    code = 1
    try:
        code = run_node(cfg)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _write_error(cfg, traceback.format_exc())
    except BaseException:
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_error(cfg, tb)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: TF's and user threads must not keep a finished node alive at interpreter exit.
    os._exit(code)


def _write_error(cfg: M.NodeConfig, tb: str) -> None:
    try:
        with open(os.path.join(cfg.node_dir, "error.txt"), "w") as f:
            f.write(tb)
    except OSError:
        pass
