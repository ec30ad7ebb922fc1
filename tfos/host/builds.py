"""Native parts tfos compiles on a host (TensorFlow's hdfs:// plugin, the Gloo op): built once per
source and version into this user's cache, one build at a time, each step a child process that
dies with its caller and is stopped on a timeout. Runs wherever a build is asked for."""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from tfos.errors import TFOSError
from tfos.host.private import user_cache_dir

logger = logging.getLogger(__name__)

#: Environment variables that say this process runs in a resource manager's container.
CONTAINERS = (("CONTAINER_ID", "a YARN container"), ("KUBERNETES_SERVICE_HOST", "a Kubernetes pod"))


def first_use_build_refused(env, switch: str) -> str | None:
    """Pure: why a part missing here must not be built on first use, or None when it may. Never when
    its switch (``switch=0``) says so; never in a resource manager's container, whose memory limit is
    sized for training (a compiler beside TensorFlow would get the container killed) and whose cache
    goes with it: build on the hosts ahead (``tfos build``) instead."""
    if env.get(switch, "1") == "0":
        return f"{switch}=0"
    for variable, what in CONTAINERS:
        if env.get(variable):
            return f"this process runs in {what}"
    return None


def build_once(out: Path, lock_name: str, build: Callable[[], str]) -> str:
    """``out``'s path, calling ``build`` first unless it is there. ``out``'s directory (below the
    user's cache) is created 0700 only to build into; builds wait for each other on ``lock_name``,
    so that the ones after the first find its result."""
    if out.is_file():
        return str(out)
    user_cache_dir(out.parent.name)
    with open(Path(user_cache_dir()) / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            return str(out)
        return build()


def run_step(args: list[str], log: BinaryIO, timeout: float, what: str, error: type[TFOSError],
             env: dict | None = None) -> None:
    """Run one build command with its output in ``log`` (an open file); ``error`` on a timeout or a
    failure, with the log's last lines. The command has its own process group (terminated with its
    children) and gets SIGTERM if the caller dies."""
    from tfos.host.processes import popen_dying_with_process, tail, terminate

    proc = popen_dying_with_process(args, signal.SIGTERM, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise error(f"building {what} took over {timeout:g}s; see {log.name}") from None
    finally:
        terminate(proc, 5.0, os.path.basename(args[0]))
    if code != 0:
        raise error(f"building {what} failed ({os.path.basename(args[0])} exit {code}):\n{tail(str(log.name), 30)}")


def install(built: Path, out: Path) -> str:
    """Put ``built`` at ``out`` (0700) in one rename: a reader sees the whole file or none."""
    tmp = out.with_suffix(".tmp")
    if built != tmp:
        shutil.copyfile(built, tmp)
    os.chmod(tmp, 0o700)
    os.replace(tmp, out)
    return str(out)


def command(prog: str, description: str, build: Callable[[], str | Sequence[str]],
            where: Callable[[], str | Sequence[str] | None], what: str) -> Callable[..., int]:
    """The ``build|path`` command of one compiled part (``python -m <module> build|path``, which
    ``tfos build`` runs): ``build`` compiles what is missing and prints the paths, ``path`` prints
    where they are (``where`` returning None: not built, exit 1). ``what``: the build's outputs, as
    the help names them. Errors are logged, exit 1."""

    def main(argv=None) -> int:
        parser = argparse.ArgumentParser(prog=prog, description=description)
        parser.add_argument("command", choices=["build", "path"],
                            help=f"build: compile {what} unless built (prints the paths); path: where they are")
        args = parser.parse_args(argv)
        try:
            paths = build() if args.command == "build" else where()
        except TFOSError as e:
            logger.error("%s", e)
            return 1
        if paths is None:
            logger.error("%s is not built here: run '%s build'", what, prog)
            return 1
        sys.stdout.write("\n".join([str(paths)] if isinstance(paths, (str, os.PathLike)) else map(str, paths)) + "\n")
        return 0

    return main


def run_command(main: Callable[..., int]) -> None:
    """``if __name__ == "__main__"`` of a build module: its log lines plain on stderr, its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
