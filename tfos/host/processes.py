"""Process supervision: terminate-then-kill, parent-death signals and watchdogs, the executor
JVM lookup, and log tails. Used by the barrier task, the node agent, the TF process and the
driver (for its TensorBoard child)."""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading

from tfos.host.deadline import Deadline

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _prctl(option: int, arg: int) -> bool:
    """prctl(2) on Linux; False elsewhere or when it fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except OSError:
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """preexec_fn: ask Linux to send ``sig`` (default SIGKILL) to this child when its parent thread
    exits."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


#: how long a caller waits for the spawner thread to start its child
SPAWN_TIMEOUT_SECS = 60.0


class _Spawner:
    """One thread that lives as long as the process and starts the children handed to it. Linux
    sends the parent-death signal when the *thread* that started a child ends, not the process:
    a child started with :func:`die_with_parent` from a short-lived thread (tf.data's generator
    threads end with each iterator; a notebook's worker thread) would be killed with that thread."""

    def __init__(self):
        self.jobs: "queue.Queue" = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def popen(self, args, **kwargs) -> subprocess.Popen:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="tfos-spawner", daemon=True)
                self.thread.start()
        box: "queue.Queue" = queue.Queue(maxsize=1)
        self.jobs.put((box, args, kwargs))
        try:
            got = box.get(timeout=SPAWN_TIMEOUT_SECS)
        except queue.Empty:
            raise TimeoutError(f"could not start {args[0]!r} within {SPAWN_TIMEOUT_SECS:.0f}s") from None
        if isinstance(got, BaseException):
            raise got
        return got

    def _run(self) -> None:
        while True:
            box, args, kwargs = self.jobs.get()
            try:
                box.put(subprocess.Popen(args, **kwargs))
            except BaseException as e:  # the caller raises it
                box.put(e)


_spawner = _Spawner()


def popen_dying_with_process(args, sig: int = signal.SIGKILL, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)`` for a child that gets ``sig`` when this process dies
    (PR_SET_PDEATHSIG), whichever thread calls: the child is started from a thread that lives as
    long as the process. ``preexec_fn`` must not be given."""
    if "preexec_fn" in kwargs:
        raise ValueError("popen_dying_with_process sets preexec_fn itself")
    if threading.current_thread() is threading.main_thread():  # it lives as long as the process
        return subprocess.Popen(args, preexec_fn=lambda: die_with_parent(sig), **kwargs)
    return _spawner.popen(args, preexec_fn=lambda: die_with_parent(sig), **kwargs)


def become_subreaper() -> bool:
    """Make this process the Linux child subreaper of its descendants: orphans among them (even
    setsid'ed ones) are re-parented to it rather than to init. False where unsupported."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def start_pipe_watchdog(fd: int, on_parent_death) -> threading.Thread:
    """Call ``on_parent_death()`` when the write end of pipe ``fd`` (held by the parent) closes,
    which the kernel does when the parent dies, even by SIGKILL."""

    def watch():
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        on_parent_death()

    t = threading.Thread(target=watch, name="tfos-parent-watchdog", daemon=True)
    t.start()
    return t


def terminate(proc: subprocess.Popen, grace_secs: float, what: str = "process") -> int | None:
    """SIGTERM the process (group), wait ``grace_secs``, then SIGKILL. Returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    for sig, wait in ((signal.SIGTERM, grace_secs), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            logger.warning("%s %d ignored %s for %.0fs", what, proc.pid, signal.Signals(sig).name, wait)
    return proc.poll()


def jvm_ancestor(pid: int | None = None, max_depth: int = 6) -> int | None:
    """The nearest ancestor whose executable is ``java`` (the Spark executor), if any."""
    pid = pid or os.getpid()
    for _ in range(max_depth):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            return None
        if comm == "java":
            return ppid
        if ppid <= 1:
            return None
        pid = ppid
    return None


def tail(path: str, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def children_peak_rss_mb() -> int:
    """The peak resident memory, in MiB, of the largest process this one has waited for, including
    the descendants those processes waited for (``getrusage(RUSAGE_CHILDREN).ru_maxrss``): for the
    node agent, whose one child (the reaper) waits for the TF process, the TF process's peak."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024


#: The signal on which the TF process writes every thread's Python stack (faulthandler) to
#: STACKS_FILE in its node directory; the node agent sends it when the driver asks.
STACKS_SIGNAL = signal.SIGUSR1
STACKS_FILE = "stacks.txt"
#: The most of a stack dump the agent reads and sends.
MAX_STACKS_BYTES = 256 * 1024


def read_new_output(path: str, start: int, settle_secs: float = 0.3, timeout: float = 3.0) -> str:
    """What was appended to ``path`` after byte ``start``, once it stopped growing for ``settle_secs``
    (a signal handler writing it): at most MAX_STACKS_BYTES, "" if nothing came within ``timeout``."""
    import time

    deadline = Deadline(timeout)
    size, stable_since = start, time.monotonic()
    while not deadline.expired():
        try:
            now = os.path.getsize(path)
        except OSError:
            now = start
        if now != size:
            size, stable_since = now, time.monotonic()
        elif size > start and time.monotonic() - stable_since >= settle_secs:
            break
        time.sleep(0.05)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(MAX_STACKS_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
