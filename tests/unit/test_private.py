"""Host-local state on a shared host: per-user private directories, fresh node directories, the
claim registry's lock deadline and repair, and a second Unix user next to the first."""

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tfos.errors import TFOSTimeoutError
from tfos.host import claims as C
from tfos.host import private as P

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as / create files of another user")
NOBODY = 65534


@pytest.fixture
def tmp(monkeypatch, tmp_path_factory):
    """A shared, world-writable 'tmp' like /tmp (reachable by every user), as tempfile.gettempdir()."""
    import pathlib
    import shutil

    tmp_path_factory.getbasetemp()  # pytest's own temp root is fixed before gettempdir() is redirected
    shared = pathlib.Path(tempfile.mkdtemp(prefix="tfos-test-shared-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    yield shared
    shutil.rmtree(shared, ignore_errors=True)


def test_private_dir_is_created_0700_and_reused(tmp):
    path = P.private_dir("cluster1")
    assert path == str(tmp / f"tfos-{os.getuid()}" / "cluster1")
    for p in (os.path.dirname(path), path):
        assert oct(os.stat(p).st_mode & 0o777) == oct(0o700)
    assert P.private_dir("cluster1") == path


def test_a_planted_symlink_is_never_followed(tmp, tmp_path):
    target = tmp_path / "attacker"
    target.mkdir(mode=0o700)
    os.symlink(target, tmp / f"tfos-{os.getuid()}")
    with pytest.raises(P.UnsafeDirectoryError, match="symlink"):
        P.private_dir()


def test_a_group_or_world_accessible_directory_is_refused(tmp):
    os.mkdir(tmp / f"tfos-{os.getuid()}", 0o700)
    os.chmod(tmp / f"tfos-{os.getuid()}", 0o777)
    with pytest.raises(P.UnsafeDirectoryError, match="mode 777"):
        P.private_dir()


@ROOT_ONLY
def test_a_directory_pre_created_by_another_user_is_refused(tmp):
    planted = tmp / f"tfos-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(P.UnsafeDirectoryError, match=f"belongs to uid {NOBODY}"):
        P.private_dir("c")


def test_node_directories_are_fresh_and_function_files_never_follow_links(tmp):
    parent = P.private_dir("c2")
    node = P.fresh_dir(parent, "node-0")
    with pytest.raises(P.UnsafeDirectoryError, match="already exists"):
        P.fresh_dir(parent, "node-0")
    os.symlink("/etc/passwd", os.path.join(node, "main_fun.pkl"))
    with pytest.raises(OSError):
        P.write_private_file(os.path.join(node, "main_fun.pkl"), b"x")
    P.write_private_file(os.path.join(node, "other.pkl"), b"data")
    assert oct(os.stat(os.path.join(node, "other.pkl")).st_mode & 0o777) == oct(0o600)
    P.remove_tree(node)
    assert not os.path.exists(node) and not os.path.exists(parent)  # the empty cluster directory goes too


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"gpus": [1], "ports": {"1": "x", "2": -5}}', b""])
def test_a_corrupt_registry_is_repaired_not_fatal(tmp_path, content):
    path = tmp_path / "claims.json"
    path.write_bytes(content)
    with C.claims(str(path)) as reg:
        assert reg == {"gpus": {}, "ports": {}}
        reg["gpus"]["0"] = os.getpid()
    assert json.loads(path.read_text()) == {"gpus": {"0": os.getpid()}, "ports": {}}


def test_a_symlink_planted_as_the_registry_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "claims.json"
    os.symlink(victim, path)
    with C.claims(str(path)) as reg:
        reg["ports"]["20001"] = os.getpid()
    assert victim.read_text() == "keep me" and not os.path.islink(path)


def test_a_foreign_process_holding_the_lock_is_a_clear_timeout(tmp_path):
    path = tmp_path / "claims.json"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(path) + '.lock'!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(TFOSTimeoutError, match="stayed locked by another process for 1s"):
            with C.claims(str(path), timeout=1.0):
                pass
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()
    with C.claims(str(path), timeout=5.0) as reg:  # free again once the holder is gone
        assert reg["gpus"] == {}


@ROOT_ONLY
def test_a_second_unix_user_gets_its_own_private_state_next_to_the_first(tmp):
    with C.claims() as reg:  # the first user (root) has its registry and a claim
        reg["gpus"]["0"] = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the second user: same host, same tmp
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            path = P.private_dir("cluster-b")
            with C.claims() as reg:
                reg["gpus"]["0"] = os.getpid()  # its own registry: root's claim is not in its way
            node = P.fresh_dir(path, "node-0")
            os.write(w, json.dumps({"path": path, "node": node, "registry": C.registry_path()}).encode())
            os._exit(0)
        except BaseException as e:  # report to the parent, never run its test code
            os.write(w, json.dumps({"error": repr(e)}).encode())
            os._exit(1)
    os.close(w)
    out = json.loads(os.read(r, 65536).decode())
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert status == 0, out
    assert out["path"] == str(tmp / f"tfos-{NOBODY}" / "cluster-b")
    assert os.stat(tmp / f"tfos-{NOBODY}").st_uid == NOBODY
    assert out["registry"] != C.registry_path()
    with C.claims() as reg:
        assert reg["gpus"] == {"0": os.getpid()}


@pytest.mark.parametrize("setup,ok", [
    ("plain", True),            # this user's file, 0755, in this user's 0755 directory
    ("group_writable", False),  # another user of the group could swap the code
    ("dir_world_writable", False),
    ("symlink", False),         # code is loaded from the file itself, never through a link
    ("foreign_owner", False),   # a file of another user (root may always be trusted: it could do anything anyway)
])
def test_code_is_loaded_only_from_files_no_other_user_can_change(tmp_path, setup, ok):
    if setup == "foreign_owner" and os.getuid() != 0:
        pytest.skip("needs root to create a file of another user")
    d = tmp_path / "lib"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    f = d / "plugin.so"
    f.write_bytes(b"\x7fELF")
    os.chmod(f, 0o755)
    path = str(f)
    if setup == "group_writable":
        os.chmod(f, 0o775)
    elif setup == "dir_world_writable":
        os.chmod(d, 0o777)
    elif setup == "symlink":
        os.symlink(f, d / "link.so")
        path = str(d / "link.so")
    elif setup == "foreign_owner":
        os.chown(f, NOBODY, NOBODY)
    if ok:
        P.check_trusted_file(path)
    else:
        with pytest.raises(P.UnsafeDirectoryError):
            P.check_trusted_file(path)
