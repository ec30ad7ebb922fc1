"""The wire protocol: typed messages, framing, mutual authentication with the cluster secret."""

import pickle
import socket
import struct
import threading

import pytest

from tfos import protocol as P
from tfos.cluster.driver_service import ClusterState, ControlServer
from tfos.errors import AuthenticationError, ProtocolError


def test_messages_roundtrip_and_are_versioned():
    msg = P.NodeExited("c1", 3, -9, "tb", "tail", "/log", True)
    data = P.encode(msg)
    assert b'"type":"NodeExited"' in data and b'"v":1' in data
    assert P.decode(data) == msg


@pytest.mark.parametrize("payload,match", [
    (b"not json", "not valid JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"type":"Ack","v":99}', "version mismatch"),
    (b'{"type":"os.system","v":1}', "unknown message type"),
    (b'{"type":"Heartbeat","v":1,"cluster_id":"x"}', "bad Heartbeat"),
    (pickle.dumps({"type": "Ack"}), "not valid JSON"),
])
def test_decode_rejects(payload, match):
    with pytest.raises(ProtocolError, match=match):
        P.decode(payload)


def test_encode_rejects_non_messages():
    with pytest.raises(ProtocolError):
        P.encode({"type": "Ack"})


@pytest.fixture
def control():
    state = ClusterState("cid", [("chief", 0), ("worker", 0)])
    secret = P.new_secret()
    server = ControlServer(state, secret, "127.0.0.1").start()
    yield state, secret, server
    server.stop()


def test_authenticated_request(control):
    state, secret, server = control
    reply = P.call(("127.0.0.1", server.port), secret, P.Heartbeat("cid", 1), timeout=5)
    assert reply == P.HeartbeatReply(stop=False)
    state.request_stop([1])
    assert P.call(("127.0.0.1", server.port), secret, P.Heartbeat("cid", 1), timeout=5).stop is True


def test_wrong_secret_is_rejected(control):
    state, _secret, server = control
    with pytest.raises(AuthenticationError):
        P.call(("127.0.0.1", server.port), P.new_secret(), P.Heartbeat("cid", 0), timeout=5)
    assert state.nodes[0].last_heartbeat == 0.0  # nothing was processed


def test_raw_pickle_without_handshake_is_rejected(control):
    """A client that skips the handshake and sends a pickle gets disconnected unprocessed."""
    state, _secret, server = control
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    hello = s.recv(64)
    assert hello.startswith(P.MAGIC)
    s.sendall(pickle.dumps(("RegisterNode", {"node_index": 0})) + b"\0" * 64)
    s.settimeout(5)
    assert s.recv(64) == b""  # closed by the server
    s.close()
    assert state.nodes[0].info is None


def test_server_must_prove_the_secret_too():
    """A fake endpoint without the secret cannot impersonate the driver."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def fake():
        c, _ = srv.accept()
        c.sendall(struct.pack(">4sH16s", P.MAGIC, P.PROTOCOL_VERSION, b"n" * 16))
        c.recv(48)
        c.sendall(b"x" * 32)
        c.close()

    t = threading.Thread(target=fake)
    t.start()
    with pytest.raises(AuthenticationError, match="failed to prove"):
        P.Channel.connect("127.0.0.1", srv.getsockname()[1], P.new_secret(), timeout=5)
    t.join()
    srv.close()


def test_oversized_json_frame_is_refused(control):
    _state, secret, server = control
    ch = P.Channel.connect("127.0.0.1", server.port, secret, timeout=5)
    ch.sock.sendall(struct.pack(">cI", P.KIND_JSON, P.MAX_JSON_FRAME + 1))
    ch.settimeout(5)
    assert ch.sock.recv(16) == b""
    ch.close()


def test_cluster_id_mismatch_is_an_error(control):
    _state, secret, server = control
    with pytest.raises(Exception, match="this is cid"):
        P.call(("127.0.0.1", server.port), secret, P.Heartbeat("other", 0), timeout=5)


def test_connect_timeout_names_the_setting():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    from tfos.errors import TFOSTimeoutError

    with pytest.raises(TFOSTimeoutError, match="raise feed_timeout"):
        P.Channel.connect("127.0.0.1", port, P.new_secret(), timeout=0.5, setting="feed_timeout")
