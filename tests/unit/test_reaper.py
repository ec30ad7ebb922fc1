"""The reaper between the node agent and the TF process (``tfos.cluster.agent.reaper``): no descendant of
the TF process survives it. Real processes, no Spark, no TensorFlow."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfos.cluster.agent.reaper import REAPER_MODULE, descendants, reaper_command
from tfos.testing import wait_for

# The "TF process" under the reaper: it starts a child, which starts a grandchild and a setsid'ed
# grandchild; all note "role pid" in PIDFILE and sleep. Once the family is complete, the TF process
# sleeps (EXIT=sleep) or exits with EXIT.
FAMILY = r'''
import os, subprocess, sys, time
role, pidfile, exit_as = sys.argv[1:4]
with open(pidfile, "a") as f:
    f.write(f"{role} {os.getpid()}\n")
def spawn(role, **kw):
    return subprocess.Popen([sys.executable, __file__, role, pidfile, exit_as], **kw)
if role == "tf":
    spawn("child")
    deadline = time.monotonic() + 30
    while len(open(pidfile).read().splitlines()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    if exit_as != "sleep":
        sys.exit(int(exit_as))
elif role == "child":
    spawn("grandchild")
    spawn("setsid", start_new_session=True)
time.sleep(600)
'''
ROLES = {"tf", "child", "grandchild", "setsid"}


@pytest.mark.parametrize("parents,root,expected", [
    ({}, 1, []),
    ({10: 1}, 10, []),
    ({10: 1, 11: 10, 12: 11, 13: 12}, 10, [11, 12, 13]),
    ({10: 1, 11: 10, 12: 10, 13: 11, 14: 12, 15: 1, 16: 15}, 10, [11, 12, 13, 14]),
    ({11: 10, 12: 10}, 10, [11, 12]),  # the root itself need not be in the map
    ({10: 1, 11: 10, 12: 11}, 11, [12]),  # a subtree
    ({10: 1, 11: 10}, 99, []),  # an unknown root
    ({10: 12, 11: 10, 12: 11}, 10, [11, 12]),  # a cycle ends
    ({0: 0, 1: 0, 2: 0, 5: 1}, 1, [5]),  # pid 0 is its own parent
])
def test_descendants(parents, root, expected):
    assert descendants(parents, root) == expected


def test_reaper_command():
    assert reaper_command("/py", 5, (7,), ["/py", "-u", "-m", "tfos.cluster.node"]) == [
        "/py", "-m", "tfos.cluster.agent.reaper", "--grace", "5.0", "--pass-fd", "7", "--", "/py", "-u", "-m", "tfos.cluster.node"]
    assert reaper_command("/py", 0.5, (), ["x"]) == ["/py", "-m", "tfos.cluster.agent.reaper", "--grace", "0.5", "--", "x"]


def test_reaper_loads_no_tensorflow_and_few_tfos_modules():
    out = subprocess.run([sys.executable, "-c", f"import sys, {REAPER_MODULE}; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in out if m.startswith(("tensorflow", "pyspark", "keras", "numpy"))]
    assert {m for m in out if m.startswith("tfos")} <= {"tfos", "tfos.errors", "tfos.topology", "tfos.host", "tfos.lazy",
                                                         "tfos.host.versions", "tfos.host.deadline",
                                                         "tfos.host.processes", "tfos.cluster", "tfos.cluster.agent", REAPER_MODULE}


def _reaper(command, grace, **popen_kw):
    return subprocess.Popen([sys.executable, "-m", REAPER_MODULE, "--grace", str(grace), "--", *command],
                            start_new_session=True, **popen_kw)


def _family(tmp_path, exit_as="sleep"):
    script, pidfile = tmp_path / "family.py", tmp_path / "pids.txt"
    script.write_text(FAMILY)
    return [sys.executable, str(script), "tf", str(pidfile), exit_as], pidfile


def _read_family(pidfile, timeout=30.0):
    """{role: psutil.Process} once the whole family noted its pid."""
    def complete():
        lines = pidfile.read_text().splitlines() if pidfile.exists() else []
        return {line.split()[0] for line in lines} == ROLES
    assert wait_for(complete, timeout), f"family incomplete: {pidfile.read_text() if pidfile.exists() else ''}"
    found = {}
    for line in pidfile.read_text().splitlines():
        role, pid = line.split()
        try:
            found[role] = psutil.Process(int(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(procs):
    for p in procs:
        try:
            if isinstance(p, subprocess.Popen):
                if p.poll() is None:
                    p.kill()
                p.wait(10)
            elif _running(p):
                p.kill()
        except (psutil.Error, OSError, subprocess.TimeoutExpired):
            pass


def test_killed_agent_leaves_no_descendant_of_the_tf_process(tmp_path):
    """The agent (here a throwaway parent) is SIGKILLed: the reaper gets SIGTERM (PR_SET_PDEATHSIG)
    and stops the TF process, its child, its grandchild and its setsid'ed grandchild."""
    command, pidfile = _family(tmp_path)
    reaper_pidfile = tmp_path / "reaper.pid"
    agent_code = f"""
import signal, subprocess, sys, time
from tfos.host import processes
reaper = subprocess.Popen({[sys.executable, "-m", REAPER_MODULE, "--grace", "2", "--", *command]!r},
                          start_new_session=True, preexec_fn=lambda: processes.die_with_parent(signal.SIGTERM))
open({str(reaper_pidfile)!r}, "w").write(str(reaper.pid))
time.sleep(600)
"""
    agent = subprocess.Popen([sys.executable, "-c", agent_code])
    family = {}
    try:
        family = _read_family(pidfile)
        assert wait_for(lambda: reaper_pidfile.exists() and reaper_pidfile.read_text(), 10)
        family["reaper"] = psutil.Process(int(reaper_pidfile.read_text()))
        assert family["tf"].ppid() == family["reaper"].pid
        assert all(_running(p) for p in family.values())
        agent.kill()
        agent.wait(10)
        assert wait_for(lambda: not any(_running(p) for p in family.values()), 10), \
            {role: p.pid for role, p in family.items() if _running(p)}
    finally:
        _kill([agent, *family.values()])


def test_tf_process_exiting_takes_its_descendants_and_passes_its_exit_code(tmp_path):
    command, pidfile = _family(tmp_path, exit_as="3")
    reaper = _reaper(command, grace=5)
    family = {}
    try:
        family = _read_family(pidfile)
        assert reaper.wait(15) == 3
        assert not any(_running(p) for p in family.values()), \
            {role: p.pid for role, p in family.items() if _running(p)}
    finally:
        _kill([reaper, *family.values()])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_tf_process_killed_by_a_signal_kills_the_reaper_with_it(sig):
    reaper = _reaper([sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(sig)})"], grace=5)
    try:
        assert reaper.wait(15) == -sig
    finally:
        _kill([reaper])


def test_sigterm_to_the_reaper_sigkills_a_child_ignoring_it_after_the_grace(tmp_path):
    pidfile, grace = tmp_path / "tf.pid", 1.5
    code = (f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    reaper = _reaper([sys.executable, "-c", code], grace=grace)
    tf = None
    try:
        assert wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20)
        tf = psutil.Process(int(pidfile.read_text()))
        t0 = time.monotonic()
        reaper.send_signal(signal.SIGTERM)
        assert reaper.wait(grace + 10) == -signal.SIGKILL  # the TF process's fate
        elapsed = time.monotonic() - t0
        assert grace - 0.2 < elapsed < grace + 2, elapsed
        assert not _running(tf)
    finally:
        _kill([reaper] + ([tf] if tf else []))


def test_tf_process_inherits_stdin_stdout_and_passed_fds(tmp_path):
    """As the agent uses it: the config line on stdin, output to the node log, the watchdog pipe."""
    watch_r, watch_w = os.pipe()
    code = ("import os, sys; line = sys.stdin.readline().strip(); "
            f"eof = os.read({watch_r}, 1) == b''; print('got', line, eof, flush=True)")
    reaper = subprocess.Popen(reaper_command(sys.executable, 5, (watch_r,), [sys.executable, "-c", code]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(watch_r,),
                              start_new_session=True)
    os.close(watch_r)
    try:
        reaper.stdin.write(b"config\n")
        reaper.stdin.close()
        os.close(watch_w)  # the "agent" is gone: the TF process's watchdog read sees EOF
        watch_w = None
        assert reaper.wait(15) == 0
        assert reaper.stdout.read().decode().strip() == "got config True"
    finally:
        if watch_w is not None:
            os.close(watch_w)
        _kill([reaper])
