"""Run an unchanged TF script as a node's program (``TFCluster.run_script``; TF process).

The script is the program a user already runs on a plain multi-worker setup: it reads
``TF_CONFIG`` (set by tfos before this runs, ports released; past exec's 128 KiB limit for one
environment string, the script is started through a launcher that sets it from a file) and is started as a child of the TF
process, ``python -u <script> <argv>`` in the executor's working directory. Its output goes line
by line into the node's log; a non-zero exit raises :class:`~tfos.errors.ScriptError` with the
exit code and the last lines, which the driver shows in its NodeFailedError. The child dies with
the TF process (PDEATHSIG) and is terminated, then killed, if the TF process stops first; the
node's reaper covers anything the script itself started.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import subprocess
import sys

from tfos.errors import ScriptError
from tfos.host import private, processes

logger = logging.getLogger(__name__)

#: Lines of the script's output kept for the error message.
TAIL_LINES = 30
#: How long the script may take to exit after closing its output.
EXIT_WAIT_SECS = 60.0


@dataclasses.dataclass(frozen=True)
class Script:
    """The script as the driver read it, with the Python modules beside it (``siblings``: name and
    source, e.g. a tutorial's ``mnist_setup.py``): none of them need exist on the executors."""

    name: str
    source: bytes
    argv: tuple = ()
    siblings: tuple = ()


#: Linux refuses to exec with one environment string longer than this (MAX_ARG_STRLEN, E2BIG):
#: a TF_CONFIG naming thousands of hosts. Past it the script gets TF_CONFIG from a file (LAUNCHER).
ENV_STRING_MAX = 128 * 1024 - 1

#: ``python -c LAUNCHER <tf_config file> <script> <argv>``: sets TF_CONFIG from the file, then runs
#: the script as ``python <script> <argv>`` would (its folder first on sys.path, its argv, __main__).
LAUNCHER = ("import os, runpy, sys; f, script = sys.argv[1], sys.argv[2]; "
            "os.environ['TF_CONFIG'] = open(f, encoding='utf-8').read(); "
            "sys.argv = sys.argv[2:]; sys.path[0] = os.path.dirname(os.path.abspath(script)); "
            "runpy.run_path(script, run_name='__main__')")


def script_command(python: str, path: str, argv, tf_config_file: str | None = None) -> list[str]:
    """Pure: the child's command line (through LAUNCHER when TF_CONFIG comes from a file)."""
    if tf_config_file:
        return [python, "-u", "-c", LAUNCHER, tf_config_file, path, *map(str, argv)]
    return [python, "-u", path, *map(str, argv)]


def needs_file(name: str, value: str) -> bool:
    """Pure: True when ``name=value`` is too long for one environment string of exec."""
    return len(name.encode()) + 1 + len(value.encode()) > ENV_STRING_MAX


def run_script(script: Script, ctx) -> None:
    """main_fun of ``TFCluster.run_script``: run ``script`` to its end on this node."""
    folder = os.path.join(ctx.node_dir, "script")  # the script's own folder, as on the driver: siblings import
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name, source in script.siblings:
        private.write_private_file(os.path.join(folder, os.path.basename(name)), source)
    path = os.path.join(folder, os.path.basename(script.name) or "main.py")
    private.write_private_file(path, script.source)
    env, config_file = dict(os.environ), None
    if needs_file("TF_CONFIG", env.get("TF_CONFIG", "")):  # a cluster of thousands of hosts
        config_file = os.path.join(folder, "tf_config.json")
        private.write_private_file(config_file, env.pop("TF_CONFIG").encode())
    cmd = script_command(sys.executable, path, script.argv, config_file)
    logger.info("node %d (%s:%d) runs %s", ctx.node_index, ctx.job_name, ctx.task_index,
                " ".join(cmd) if config_file is None else f"{path} (TF_CONFIG from {config_file})")
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(cmd, cwd=ctx.working_dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                            preexec_fn=lambda: processes.die_with_parent(signal.SIGTERM), start_new_session=True)
    try:
        for line in proc.stdout:  # ends when the script exits (or closes its output)
            tail.append(line.rstrip("\n"))
            sys.stdout.write(line)
        sys.stdout.flush()
        code = proc.wait(timeout=EXIT_WAIT_SECS)
    except subprocess.TimeoutExpired:
        raise ScriptError(f"{script.name} closed its output but did not exit within {EXIT_WAIT_SECS:.0f}s") from None
    finally:
        processes.terminate(proc, 5.0, "script")
        proc.stdout.close()
    if code != 0:
        lines = "\n".join(tail)
        raise ScriptError(f"{script.name} exited with code {code} on node {ctx.node_index} "
                          f"({ctx.job_name}:{ctx.task_index}); its last lines:\n{lines}")
    logger.info("%s finished on node %d", script.name, ctx.node_index)


def script_main(args: Script, ctx) -> None:
    """The main_fun handed to the nodes: ``args`` is the :class:`Script`."""
    run_script(args, ctx)
