"""Host-local process hygiene and the claim registry."""

import os
import signal
import subprocess
import sys
import time

from tfos.host import claims as host_claims
from tfos.host import processes
from tfos.testing import wait_for


def test_terminate_escalates_to_sigkill_when_sigterm_is_ignored():
    proc = subprocess.Popen([sys.executable, "-c",
                             "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('ready', flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    proc.stdout.readline()
    t0 = time.monotonic()
    code = processes.terminate(proc, grace_secs=0.5)
    assert code == -signal.SIGKILL
    assert time.monotonic() - t0 < 5


def test_child_dies_with_its_parent_even_on_sigkill(tmp_path):
    """The TF process's pipe watchdog + PDEATHSIG: killing the parent -9 ends the child."""
    pidfile = tmp_path / "child.pid"
    parent_code = f"""
import os, subprocess, sys, time
from tfos.host import processes as host
r, w = os.pipe()
child = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time\\nfrom tfos.host import processes as host\\n"
    "host.start_pipe_watchdog(int(sys.argv[1]), lambda: os._exit(70))\\ntime.sleep(600)", str(r)],
    pass_fds=(r,), preexec_fn=host.die_with_parent, start_new_session=True)
os.close(r)
open({str(pidfile)!r}, "w").write(str(child.pid))
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20)
    child = int(pidfile.read_text())
    assert processes.alive(child)
    parent.kill()
    parent.wait()
    assert wait_for(lambda: not _running(child), 10), "child outlived its killed parent"


def test_a_child_started_on_a_short_lived_thread_outlives_the_thread_not_the_process(tmp_path):
    """Linux's parent-death signal follows the thread that started the child: plain Popen with
    die_with_parent on a thread that ends kills the child with it; popen_dying_with_process starts
    it from a thread that lasts, so it lives until the process dies."""
    import threading

    started = {}

    def start(name, fn):
        t = threading.Thread(target=lambda: started.__setitem__(name, fn()))
        t.start()
        t.join()  # the starting thread has ended

    start("plain", lambda: subprocess.Popen(["sleep", "60"], preexec_fn=processes.die_with_parent))
    start("owned", lambda: processes.popen_dying_with_process(["sleep", "60"]))
    try:
        assert started["plain"].wait(10) == -signal.SIGKILL
        time.sleep(0.5)
        assert started["owned"].poll() is None
    finally:
        for p in started.values():
            processes.terminate(p, 2.0, "sleep")
    parent_code = f"""
import sys, threading, time
from tfos.host import processes as host
t = threading.Thread(target=lambda: open({str(tmp_path / 'pid')!r}, "w").write(
    str(host.popen_dying_with_process(["sleep", "600"]).pid)))
t.start(); t.join()
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    assert wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 20)
    child = int((tmp_path / "pid").read_text())
    assert _running(child)
    parent.kill()
    parent.wait()
    assert wait_for(lambda: not _running(child), 10), "child outlived its killed parent"


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_claims_drop_dead_owners_and_ports_are_held(tmp_path):
    path = str(tmp_path / "claims.json")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with host_claims.claims(path) as reg:
        reg["gpus"]["0"] = dead.pid
        reg["gpus"]["1"] = os.getpid()
    with host_claims.claims(path) as reg:
        assert reg["gpus"] == {"1": os.getpid()}


def test_reserved_tf_port_is_outside_ephemeral_range_and_recorded():
    s = host_claims.reserve_tf_port(os.getpid())
    try:
        port = s.getsockname()[1]
        lo, hi = host_claims.ephemeral_port_range()
        assert not lo <= port <= hi
        with host_claims.claims() as reg:
            assert reg["ports"][str(port)] == os.getpid()
        s2 = host_claims.reserve_tf_port(os.getpid())
        assert s2.getsockname()[1] != port
        s2.close()
    finally:
        s.close()


def test_tail(tmp_path):
    p = tmp_path / "log"
    p.write_text("\n".join(f"line {i}" for i in range(100)))
    assert processes.tail(str(p), 3) == "line 97\nline 98\nline 99"
    assert processes.tail(str(tmp_path / "missing")) == ""
