"""``python -m tfos.cluster.agent.reaper --grace SECS [--pass-fd FD ...] -- COMMAND...``: the reaper.

A tiny process that the node agent puts between itself and the TF process, so that no descendant
of the TF process survives it. All of the code here runs in the reaper process (except
:func:`reaper_command`, which the agent calls to build the command line). It imports only the
standard library and ``tfos.host.processes``: never TensorFlow or user code.

* It is the child subreaper of its descendants (``PR_SET_CHILD_SUBREAPER``), so orphans of the TF
  process, setsid'ed ones included, are re-parented to it rather than to init.
* It gets SIGTERM when the agent dies (``PR_SET_PDEATHSIG``, set by the agent; checking
  ``getppid()`` as a fallback), and the TF process gets SIGKILL when the reaper dies.
* It starts COMMAND (the TF process) in a new session. COMMAND inherits its stdin, stdout, stderr
  and the ``--pass-fd`` descriptors, at the same numbers.
* On SIGTERM (the agent stops the node, or the agent died) it SIGTERMs the TF process group and
  every descendant, waits up to ``--grace`` seconds, SIGKILLs what is left and reaps it.
* When the TF process exits by itself it stops the leftover descendants (SIGTERM, a short grace,
  SIGKILL). Then the reaper exits as the TF process did: the same exit code, or killed by the
  same signal, so the agent sees the TF process's return code.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from tfos.host import processes
from tfos.host.deadline import Deadline

logger = logging.getLogger(__name__)

REAPER_MODULE = "tfos.cluster.agent.reaper"
#: How long the reaper waits for SIGKILLed descendants to be gone before it gives up.
KILL_WAIT_SECS = 5.0
#: The grace given to descendants left over when the TF process exits by itself (capped by --grace).
LEFTOVER_GRACE_SECS = 2.0
POLL_SECS = 0.1


def reaper_command(python: str, grace_secs: float, pass_fds: tuple[int, ...], command: list[str]) -> list[str]:
    """The reaper's command line, running ``command`` (called by the node agent)."""
    fds = [a for fd in pass_fds for a in ("--pass-fd", str(fd))]
    return [python, "-m", REAPER_MODULE, "--grace", repr(float(grace_secs)), *fds, "--", *command]


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """The pids below ``root`` in the tree given by ``parents`` ({pid: ppid}), parents before their
    children. ``root`` itself is not included; cycles are ignored."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, seen, queue = [], {root}, [root]
    while queue:
        for child in sorted(children.get(queue.pop(0), ())):
            if child not in seen:
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found


def process_parents() -> dict[int, int]:
    """{pid: ppid} of every process on this host, read from /proc (empty where there is no /proc)."""
    parents = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return parents
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass  # the process exited meanwhile
    return parents


class Reaper:
    """The reaper's state: the TF process it started and how it ended."""

    def __init__(self, command: list[str], grace_secs: float, pass_fds: tuple[int, ...] = ()):
        self.command = command
        self.grace_secs = max(0.0, grace_secs)
        self.pass_fds = pass_fds
        self.parent = os.getppid()
        self.stop_requested = False
        self.child: subprocess.Popen | None = None
        self.status: int | None = None  # the TF process's wait status, once reaped

    def request_stop(self, *_) -> None:
        """The SIGTERM handler: the agent asks to stop, or it died (PR_SET_PDEATHSIG)."""
        self.stop_requested = True

    def run(self) -> int:
        """Run the TF process to its end; return the reaper's exit code (see :meth:`exit_like_child`)."""
        processes.become_subreaper()
        try:
            self.child = subprocess.Popen(self.command, pass_fds=self.pass_fds, start_new_session=True,
                                          preexec_fn=processes.die_with_parent)
        except OSError as e:
            logger.error("could not start %s: %s", self.command, e)
            return 127
        for fd in self.pass_fds:  # the TF process holds them now
            os.close(fd)
        while self.status is None and not self.stop_requested and os.getppid() == self.parent:
            self.reap()
            time.sleep(POLL_SECS)
        if self.status is None:
            why = "asked to stop" if self.stop_requested else "the node agent is gone"
            logger.info("%s; stopping TF process %d and its descendants", why, self.child.pid)
            self.kill_all(self.grace_secs)
        else:
            self.kill_all(min(self.grace_secs, LEFTOVER_GRACE_SECS))
        return self.exit_like_child()

    def reap(self) -> bool:
        """Reap every exited child (the TF process or re-parented orphans); False once none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child.pid:
                self.status = status
                self.child.returncode = os.waitstatus_to_exitcode(status)  # keep Popen consistent

    def signal_all(self, sig: int) -> int:
        """Send ``sig`` to the TF process group and to every descendant; return how many were found."""
        try:
            os.killpg(self.child.pid, sig)  # also works after the group leader exited
        except (ProcessLookupError, PermissionError):
            pass
        pids = descendants(process_parents(), os.getpid())
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return len(pids)

    def kill_all(self, grace_secs: float) -> None:
        """SIGTERM everything below the reaper, wait up to ``grace_secs``, then SIGKILL what is left
        (again and again, for processes forked meanwhile) for up to KILL_WAIT_SECS; reap all."""
        if not self.signal_all(signal.SIGTERM) and not self.reap():
            return
        deadline = Deadline(grace_secs)
        while self.reap() and not deadline.expired():
            time.sleep(POLL_SECS / 2)
        deadline, first = Deadline(KILL_WAIT_SECS), True
        while self.reap():
            if deadline.expired():
                logger.error("descendants still running %.0fs after SIGKILL: %s", KILL_WAIT_SECS,
                             descendants(process_parents(), os.getpid()))
                return
            left = self.signal_all(signal.SIGKILL)
            if first and left:
                logger.warning("SIGKILLed %d processes left of TF process %d", left, self.child.pid)
            first = False
            time.sleep(POLL_SECS / 2)

    def exit_like_child(self) -> int:
        """The TF process's exit code; if a signal killed it, kill the reaper with that signal."""
        if self.status is None:
            logger.error("could not reap TF process %d", self.child.pid)
            return 1
        if os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
            except (ImportError, OSError, ValueError):
                pass  # no core file of the reaper for a TF process's SIGSEGV/SIGABRT
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
            return 128 + sig  # only if the signal did not end the reaper
        return os.waitstatus_to_exitcode(self.status)


def main(argv: list[str] | None = None) -> int:
    """The reaper's entry point (``python -m tfos.cluster.agent.reaper``)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=f"python -m {REAPER_MODULE}", usage="%(prog)s [options] -- COMMAND...")
    parser.add_argument("--grace", type=float, required=True, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--pass-fd", type=int, action="append", default=[], help="a descriptor COMMAND inherits")
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("no command given after --")
    args = parser.parse_args(argv[:argv.index("--")])
    command = argv[argv.index("--") + 1:]
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,  # stderr is the node log
                        format=f"%(asctime)s %(levelname)s {REAPER_MODULE}: %(message)s")  # not __main__
    reaper = Reaper(command, args.grace, tuple(args.pass_fd))
    signal.signal(signal.SIGTERM, reaper.request_stop)
    signal.signal(signal.SIGINT, reaper.request_stop)
    return reaper.run()


if __name__ == "__main__":
    raise SystemExit(main())
