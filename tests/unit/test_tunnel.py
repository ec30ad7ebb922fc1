"""The node tunnel and the network shim, as the agent starts them, with plain processes for TF: a
server bound under the shim lives only in its node's private namespace, a client under another
node's shim reaches it through both tunnels, and nothing else gets in. Also the Rust crate's own
tests (known-answer vectors, relays), run by cargo."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from tfos.errors import AuthenticationError
from tfos.tunnel import addresses, build
from tfos.tunnel import node as tunnel_node
from tfos.tunnel.agent import NodeTunnel, shim_environment
from tfos.wire import channel as C
from tfos.wire import messages as M

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux network namespaces")

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket()
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen(4)
    print("up", flush=True)
    c, _ = s.accept()
    while True:
        data = c.recv(1 << 16)
        if not data:
            break
        c.sendall(data)
    c.close()
""")

CLIENT = textwrap.dedent("""
    import hashlib, os, socket, sys, threading
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    data = os.urandom(int(sys.argv[3]))
    t = threading.Thread(target=lambda: (s.sendall(data), s.shutdown(socket.SHUT_WR)))
    t.start()
    got = bytearray()
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    t.join()
    print("same" if bytes(got) == data else f"differs: {len(got)} of {len(data)}")
""")


def _cfg(key, node_dir, i, cluster):
    cluster_cfg = M.ClusterConfig(cluster, key, "127.0.0.1", 1, (("worker", 0), ("worker", 1)), 0, 60.0, "/l", "file:///")
    return M.NodeConfig(cluster_cfg, i, "worker", i, "127.0.0.1", str(node_dir), "/f", "/w", sys.executable)


def _start_two(tmp_path, netns: str, cluster: str, started: list):
    """Two nodes' tunnels of one cluster as the agent starts them (appended to ``started`` as they start)."""
    key = C.new_key(True)
    for i in range(2):
        node_dir = tmp_path / f"n{i}"
        node_dir.mkdir(mode=0o700)
        t = NodeTunnel(_cfg(key, node_dir, i, cluster), netns)
        t.start()
        started.append(t)
    return key


@pytest.fixture(params=["auto", "off"], ids=["netns", "loopback"])
def tunnels(request, tmp_path):
    started = []
    try:
        key = _start_two(tmp_path, request.param, "tunnel-test", started)
        infos = [t.info for t in started]
        nodes = [M.NodeInfo(i, "worker", i, "127.0.0.1", infos[i].tf_port, 0, 1, infos[i].port, infos[i].mode)
                 for i in range(2)]
        for i, info in enumerate(infos):
            # in loopback mode the two nodes share this host; call them apart so that each needs its tunnel
            tunnel_node.request(info.control, "PEERS " + json.dumps(
                [[addresses.node_address(info.block, j), "127.0.0.1", infos[j].port, False] for j in range(2) if j != i]))
        yield key, started
    finally:
        for t in started:
            t.stop()


def _env(tunnel):
    env = dict(os.environ)
    env.update(shim_environment(tunnel.info, tunnel.shim, env))
    return env


def test_a_server_under_the_shim_is_reached_only_through_the_tunnels(tunnels):
    key, (a, b) = tunnels
    mode = a.info.mode
    assert mode == ("netns" if a.netns == "auto" else "loopback")
    port = 7123
    # netns mode: B's server is in B's namespace and A's client reaches it through both tunnels;
    # loopback mode (one host, one shared namespace): it reaches B's server on the host's loopback
    server = subprocess.Popen([sys.executable, "-c", SERVER, b.info.address, str(port)], stdout=subprocess.PIPE,
                              text=True, env=_env(b))
    try:
        assert server.stdout.readline().strip() == "up"
        if mode == "netns":  # the host's namespace has nothing at B's address: the server lives in B's own
            with pytest.raises(OSError):
                socket.create_connection((b.info.address, port), timeout=5).close()
        out = subprocess.run([sys.executable, "-c", CLIENT, b.info.address, str(port), str(20 << 20)], capture_output=True,
                             text=True, env=_env(a), timeout=120)
        assert out.stdout.strip() == "same", (out.stdout, out.stderr)
    finally:
        server.kill()
        server.wait(10)


def test_the_tunnel_refuses_a_stranger_and_a_clear_client(tunnels):
    key, (a, _b) = tunnels
    with pytest.raises(AuthenticationError):
        C.Channel.connect("127.0.0.1", a.info.port, C.new_key(True), timeout=10)
    with pytest.raises(Exception, match="speaks encrypted tfos channels but this client is clear"):
        C.Channel.connect("127.0.0.1", a.info.port, M.ChannelKey(key.secret, False), timeout=10)


def test_the_tunnel_answers_a_port_where_nothing_listens_with_an_error(tunnels):
    key, (a, _b) = tunnels
    from tfos.errors import RequestRefused

    with C.Channel.connect("127.0.0.1", a.info.port, key, timeout=10) as ch:
        ch.settimeout(15)
        with pytest.raises(RequestRefused, match="nothing accepts connections"):
            ch.request(M.TunnelOpen(7999))


def test_the_shim_fails_closed_when_the_tunnel_is_gone(tmp_path):
    """A bind it must redirect, with no tunnel behind it, fails: nothing listens on an open port."""
    _, shim = build.require()
    env = dict(os.environ, LD_PRELOAD=shim, TFOS_TUNNEL_CONTROL=str(tmp_path / "none.sock"), TFOS_TUNNEL_BLOCK="127.77",
               TFOS_TUNNEL_SELF="127.77.0.1", TFOS_TUNNEL_TF_PORT="7124")
    code = ("import socket\ns = socket.socket()\ntry:\n    s.bind(('0.0.0.0', 7124))\n    print('bound')\n"
            "except OSError as e:\n    print('refused', e.errno)\nt = socket.socket()\nt.bind(('0.0.0.0', 0))\n"
            "print('other ports pass', t.getsockname()[1] > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "refused 13" in out.stdout and "other ports pass True" in out.stdout, (out.stdout, out.stderr)
    assert "refusing to listen on 127.77.0.1:7124" in out.stderr
    assert tunnel_node.shim_loaded() is False  # not in this (the test's) process


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="switching users needs root")
def test_in_loopback_mode_another_user_cannot_use_the_tunnel(tmp_path):
    """Without a private namespace the egress listeners are on the host's loopback: a process of
    another user connecting there is dropped before anything reaches the other node."""
    started = []
    try:
        _start_two(tmp_path, "off", "tunnel-user-test", started)
        a, b = started
        port = 7125
        tunnel_node.request(a.info.control, "PEERS " + json.dumps([[b.info.address, "127.0.0.1", b.info.port, False]]))
        # A's tunnel makes its egress listener for B's port when its own user asks for a socket there
        with socket.socket(socket.AF_UNIX) as u:
            u.connect(a.info.control)
            u.sendall(f"CONNECT 2 1 0 {b.info.address} {port}\n".encode())
            assert u.recv(1) == b"Y"
        stranger = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
             f"import socket\ns = socket.create_connection(('{b.info.address}', {port}), timeout=10)\n"
             "s.settimeout(10)\ns.sendall(b'x' * 100)\nprint('answer', s.recv(10))"],
            capture_output=True, text=True, timeout=60)
        assert "answer b''" in stranger.stdout or "Connection reset" in stranger.stderr, (stranger.stdout,
                                                                                          stranger.stderr)
        with open(os.path.join(a.cfg.node_dir, "tunnel.log")) as f:
            assert "not a process of uid 0" in f.read()
    finally:
        for t in started:
            t.stop()


def test_the_crates_own_tests_pass():
    """cargo test: the known-answer vectors shared with tfos/wire, the relays, the namespace helper."""
    cargo = build._cargo()
    assert cargo, "cargo is needed (Rust): the node tunnel is built with it"
    from tfos.host.private import user_cache_dir

    vectors = pathlib.Path(__file__).resolve().parents[1] / "vectors" / "channel-v5.json"
    env = dict(os.environ, CARGO_TARGET_DIR=user_cache_dir("tunnel-target"), TFOS_VECTORS=str(vectors))
    out = subprocess.run([cargo, "test", "--release", "--locked", "--manifest-path", str(build.CRATE / "Cargo.toml")],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test result: ok" in out.stdout


def test_a_build_made_elsewhere_is_used_from_tfos_tunnel_dir(tmp_path, monkeypatch):
    """Executors without cargo, or YARN containers with no home of the user, take a shipped build;
    a directory without one is refused naming the variable."""
    binary, shim = build.require()
    monkeypatch.setenv("TFOS_TUNNEL_DIR", str(tmp_path))
    with pytest.raises(build.TunnelUnavailable, match=f"TFOS_TUNNEL_DIR={tmp_path} holds no tunnel build"):
        build.require()
    for path in (binary, shim):
        shutil.copy2(path, tmp_path)
    assert build.require() == (str(tmp_path / build.BINARY), str(tmp_path / build.SHIM))
    os.chmod(tmp_path / build.BINARY, 0o777)  # another user could change it: not run
    with pytest.raises(Exception, match="can be changed by another user"):
        build.require()
