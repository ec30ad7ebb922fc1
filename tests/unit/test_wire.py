"""The wire protocol: typed messages, framing, mutual authentication with the cluster secret."""

import os
import pickle
import socket
import struct
import threading

import pytest

from tfos.feed.driver.scheduler import FeedScheduler
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.errors import AuthenticationError, ProtocolError, RequestRefused, TFOSTimeoutError
from tfos.wire import channel as C
from tfos.wire import crypto
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient


def test_messages_roundtrip_and_are_versioned():
    msg = M.NodeExited("c1", 3, -9, "tb", "tail", "/log", True)
    data = M.encode(msg)
    assert b'"type":"NodeExited"' in data and b'"v":%d' % M.PROTOCOL_VERSION in data
    assert M.decode(data) == msg


def test_nested_configs_roundtrip_typed():
    cluster = M.ClusterConfig("cid", M.ChannelKey("ab" * 32, True), "10.0.0.1", 4000, (("chief", 0), ("worker", 0)), 1, 600.0, "/logs",
                              "file:///", env={"A": "1"})
    node = M.NodeConfig(cluster, 1, "worker", 0, "h1", "/n", "/n/f", "/w", "/py", ("/a",), ("0",), 77)
    back = M.decode(M.encode(node))
    assert back == node and isinstance(back.cluster, M.ClusterConfig)
    assert back.cluster.roles == (("chief", 0), ("worker", 0)) and back.spark_gpus == ("0",)
    reply = M.ClusterSpecReply((M.NodeInfo(0, "chief", 0, "h", 1, 2, 3),), {"x": [1]})
    assert M.decode(M.encode(reply)).nodes[0].address == "h:1"


@pytest.mark.parametrize("payload,match", [
    (b"not json", "not valid JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"type":"Ack","v":99}', "version mismatch"),
    (b'{"type":"os.system","v":V}', "unknown message type"),
    (b'{"type":["Ack"],"v":V}', "unknown message type"),
    (b'{"type":"Heartbeat","v":V,"cluster_id":"x"}', "missing field 'node_index'"),
    (b'{"type":"Heartbeat","v":V,"cluster_id":7,"node_index":0}', "cluster_id: expected str"),
    (b'{"type":"Heartbeat","v":V,"cluster_id":"x","node_index":true}', "node_index: expected int"),
    (b'{"type":"Heartbeat","v":V,"cluster_id":"x","node_index":1e400}', "node_index: expected int"),
    (b'{"type":"Heartbeat","v":V,"cluster_id":"x","node_index":123456789012345678901234567890}', "out of range"),
    (b'{"type":"RegisterNode","v":V,"cluster_id":"x","node":{"node_index":0}}', "RegisterNode.node: missing"),
    (b'{"type":"Report","v":V,"cluster_id":"x","node_index":0,"values":[1]}', "values: expected dict"),
    (b'[' * 100000 + b']' * 100000, "not valid JSON"),
    (pickle.dumps({"type": "Ack"}), "not valid JSON"),
])
def test_decode_rejects(payload, match):
    payload = payload.replace(b'"v":V', b'"v":%d' % M.PROTOCOL_VERSION)  # this version's frames
    with pytest.raises(ProtocolError, match=match):
        M.decode(payload)


def test_encode_rejects_non_messages():
    with pytest.raises(ProtocolError):
        M.encode({"type": "Ack"})


@pytest.fixture(params=[False, True], ids=["clear", "encrypted"])
def control(request):
    state = NodeRegistry("cid", [("chief", 0), ("worker", 0)])
    key = C.new_key(request.param)
    server = ControlService(state, FeedScheduler(state, [0, 1]).handlers(), key, "127.0.0.1").start()
    yield state, key, server
    server.stop()


def _client(server, key, node=1, cluster="cid"):
    return DriverClient("127.0.0.1", server.port, key, cluster, node)


def test_authenticated_request(control):
    state, key, server = control
    assert _client(server, key).heartbeat() is False
    state.request_stop([1])
    assert _client(server, key).heartbeat() is True


def test_typed_client_session_serves_many_requests(control):
    state, key, server = control
    client = _client(server, key, node=-1)
    with client.session(timeout=5):
        assert [client.assign_chunk("f", 10) for _ in range(4)] == [[(0, 10)], [(1, 10)], [(0, 10)], [(1, 10)]]


def test_driver_refuses_a_partition_whose_columns_drift_from_the_feeds_first(control):
    """Two partitions may feed different nodes, so only the driver sees both schemas."""
    state, key, server = control
    first = (M.Column("a", "number", "int64"), M.Column("b", "number", "double"))
    client = _client(server, key, node=-1)
    assert client.assign_chunk("f", 10, partition=0, columns=first) == [(0, 10)]
    assert client.assign_chunk("f", 10, partition=1, columns=first[:1] + (M.Column("b", "number", "int64"),)) == [(1, 10)]
    with pytest.raises(RequestRefused, match=r"partition 2, row 0: column 'c' appears"):
        client.assign_chunk("f", 10, partition=2, columns=first + (M.Column("c", "number", "int64"),))
    assert client.assign_chunk("g", 10, partition=0, columns=first[:1]) == [(0, 10)]  # another feed starts afresh


def test_a_second_copy_of_a_node_is_refused_and_fails_the_cluster(control):
    """A barrier stage retried by Spark starts every node again while the first copies may run."""
    state, key, server = control
    assert _client(server, key, node=1).agent_started("h1", 100, 101, "/log") is False
    assert _client(server, key, node=1).agent_started("h1", 100, 101, "/log") is False  # the same agent again
    with pytest.raises(RequestRefused, match="node 1 is already running \\(agent 100 on h1\\)"):
        _client(server, key, node=1).agent_started("h2", 200, 201, "/log")
    assert state.nodes[1].agent.agent_pid == 100
    assert [f.node_index for f in state.failures] == [1] and "spark.task.maxFailures" in state.failures[0].reason
    assert not state.nodes[0].stop  # recorded only: the supervisor's loop decides, then stops the nodes


def test_unknown_node_index_is_an_error_reply_and_changes_nothing(control):
    state, key, server = control
    with pytest.raises(RequestRefused, match="unknown node index 7"):
        _client(server, key, node=7).heartbeat()
    assert all(n.last_heartbeat == 0.0 for n in state.nodes.values())


def test_wrong_secret_is_rejected(control):
    state, _key, server = control
    with pytest.raises(AuthenticationError):
        _client(server, C.new_key(_key.encrypt), node=0).heartbeat()
    assert state.nodes[0].last_heartbeat == 0.0  # nothing was processed


def test_raw_pickle_without_handshake_is_rejected(control):
    """A client that skips the handshake and sends a pickle gets disconnected unprocessed."""
    state, _key, server = control
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    hello = s.recv(64)
    assert hello.startswith(crypto.MAGIC)
    s.sendall(pickle.dumps(("RegisterNode", {"node_index": 0})) + b"\0" * 64)
    s.settimeout(5)
    try:
        assert s.recv(64) == b""  # closed by the server...
    except ConnectionResetError:
        pass  # ...or reset, as it closed with the unread pickle in its buffer
    s.close()
    assert state.nodes[0].info is None


def test_server_must_prove_the_key_too():
    """A fake endpoint without the key cannot impersonate the driver."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def fake():
        c, _ = srv.accept()
        c.sendall(crypto.hello(crypto.CLEAR, b"n" * 16, bytes(32)))
        c.recv(crypto.AUTH.size)
        c.sendall(b"x" * 32)
        c.close()

    t = threading.Thread(target=fake)
    t.start()
    with pytest.raises(AuthenticationError, match="failed to prove"):
        C.Channel.connect("127.0.0.1", srv.getsockname()[1], C.new_key(), timeout=5)
    t.join()
    srv.close()


def test_oversized_json_frame_is_refused(control):
    _state, key, server = control
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch._sendall(struct.pack(">cI", C.KIND_JSON, C.MAX_JSON_FRAME + 1))
    ch.settimeout(5)
    assert isinstance(ch.recv(), M.ErrorReply)  # answered, then closed
    assert ch.sock.recv(16) == b""
    ch.close()


def test_control_service_accepts_no_data_frames(control):
    state, key, server = control
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch._sendall(struct.pack(">cI", C.KIND_ARROW, 1024))
    ch.settimeout(5)
    reply = ch.recv()
    assert isinstance(reply, M.ErrorReply) and "exceeds this channel's limit" in reply.message
    ch.close()


def test_cluster_id_mismatch_is_an_error(control):
    _state, key, server = control
    with pytest.raises(RequestRefused, match="this is cid"):
        _client(server, key, node=0, cluster="other").heartbeat()


def test_connect_timeout_names_the_setting():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TFOSTimeoutError, match="raise feed_timeout"):
        C.Channel.connect("127.0.0.1", port, C.new_key(), timeout=0.5, setting="feed_timeout")


def test_get_node_failure_answers_with_the_nodes_error_or_nothing():
    """An inference task that lost its node asks the driver why; the wait is bounded."""
    import threading
    import time

    from tfos.cluster.driver.registry import NodeRegistry
    from tfos.errors import NodeFailure

    reg = NodeRegistry("c", [("worker", 0), ("worker", 1)])
    t0 = time.monotonic()
    assert reg.on_get_node_failure(M.GetNodeFailure("c", 1, 0.2)).text == ""
    assert time.monotonic() - t0 < 2

    def later():
        time.sleep(0.3)
        reg.fail(NodeFailure(1, "worker", 1, "h", "TF process exited with code -9 (killed by signal 9)"))

    threading.Thread(target=later).start()
    text = reg.on_get_node_failure(M.GetNodeFailure("c", 1, 5)).text
    assert "node 1 (worker:1 on h)" in text and "killed by signal 9" in text
    # node 0 was stopped because node 1 failed (the supervisor's loop asks every node to stop): its
    # feed tasks report node 1's failure
    reg.request_stop([0, 1])
    text = reg.on_get_node_failure(M.GetNodeFailure("c", 0, 0)).text
    assert text.startswith("node 0 was stopped because another node failed") and "killed by signal 9" in text
    with pytest.raises(ProtocolError):
        reg.on_get_node_failure(M.GetNodeFailure("c", 7, 0))


def test_registry_names_the_silent_nodes_until_the_monitor_decides():
    import time

    from tfos.cluster.driver.registry import NodeRegistry

    reg = NodeRegistry("c", [("chief", 0), ("worker", 0), ("worker", 1)])
    for i in (0, 1):  # node 2's agent never started: not silent, just not there
        reg.on_agent_started(M.AgentStarted("c", i, "h", 100 + i, 200 + i, "/l"))
    assert reg.silent(0.2) == []
    time.sleep(0.3)
    reg.on_heartbeat(M.Heartbeat("c", 0))
    assert reg.silent(0.2) == [1]
    reg.check_heartbeats(0.2)  # the verdict: node 1 lost; no longer pending
    assert [f.node_index for f in reg.failures] == [1] and reg.silent(0.2) == []


def channel_pair(encrypt: bool) -> tuple[C.Channel, C.Channel]:
    """Two ends of one authenticated connection (a socket pair), in the given mode."""
    a, b = socket.socketpair()
    key = C.new_key(encrypt)
    client, server = C.Channel(a, "server"), C.Channel(b, "client")
    t = threading.Thread(target=server.server_handshake, args=(key,))
    t.start()
    client.client_handshake(key)
    t.join(10)
    a.settimeout(None)
    b.settimeout(None)
    return client, server


@pytest.mark.parametrize("encrypt", [False, True], ids=["clear", "encrypted"])
@pytest.mark.parametrize("size", [10, 1 << 20, (8 << 20) + 1, (17 << 20) + 5, 20_000_001])
def test_data_frames_arrive_whole_in_64_byte_aligned_buffers(size, encrypt):
    """Aligned buffers let TF use the fed columns without a copy; frames beyond the first 17 MiB
    receive buffer grow it without losing what arrived."""
    sender, receiver = channel_pair(encrypt)
    with sender, receiver:
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        t = threading.Thread(target=sender.send_data, args=(data,))
        t.start()
        kind, value = receiver.recv_frame()
        t.join(10)
    assert kind == C.KIND_ARROW and value.to_pybytes() == data and value.address % 64 == 0


@pytest.mark.parametrize("encrypt", [False, True], ids=["clear", "encrypted"])
@pytest.mark.parametrize("rows", [1, 17, 1300, 1344])
def test_a_fed_chunk_travels_in_parts_and_its_columns_arrive_64_byte_aligned(rows, encrypt):
    """The sender hands the batch's own buffers to the socket (no IPC copy); the receiver places
    the record batch's body 64-byte aligned, so the first column (and every column, when the row
    count is a multiple of 16, as fed chunks are) reaches TF without a copy."""
    import numpy as np

    from tfos.wire import arrow

    x = np.arange(rows * 784, dtype=np.float32).reshape(rows, 784)
    batch = arrow.rows_to_batch([(x[i], i, float(i)) for i in range(rows)])
    parts = arrow.ipc_parts(batch)
    assert b"".join(memoryview(p).cast("B").tobytes() for p in parts) == arrow.to_ipc(batch).to_pybytes()
    assert any(memoryview(p).nbytes == rows * 784 * 4 and p.address == batch.column(0).values.buffers()[1].address
               for p in parts if not isinstance(p, bytes))  # the features as they lie, not a copy
    sender, receiver = channel_pair(encrypt)
    with sender, receiver:
        t = threading.Thread(target=sender.send_data, args=(parts,))
        t.start()
        kind, value = receiver.recv_frame()
        t.join(10)
    got = arrow.from_ipc(value)
    cols = [arrow.column_to_numpy(got.column(j), got.schema.field(j)) for j in range(3)]
    assert np.array_equal(cols[0], x) and list(cols[1]) == list(range(rows))
    aligned = [c.ctypes.data % 64 == 0 for c in cols]
    assert aligned[0] and (all(aligned) or rows % 16)


@pytest.fixture
def silent_peer():
    """An authenticated endpoint that takes requests and never answers (a host whose network was cut
    after the connection was made looks like this to the driver)."""
    key = C.new_key()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    held = []

    def serve():
        c, _ = srv.accept()
        ch = C.Channel(c, "driver")
        ch.server_handshake(key)
        held.append(ch)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], key
    t.join(5)
    for ch in held:
        ch.close()
    srv.close()


def test_end_feed_gives_up_when_the_cluster_learns_the_node_died(silent_peer):
    from tfos.wire.clients import end_feed

    port, key = silent_peer
    calls = []

    def node_failed():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("node 1 failed")

    with pytest.raises(RuntimeError, match="node 1 failed"):
        end_feed("127.0.0.1", port, key, 1, "f1", "input", 10, timeout=600, while_waiting=node_failed)
    assert len(calls) == 3  # three half-second slices, not the 600 s feed_timeout


def test_end_feed_to_a_silent_node_times_out_naming_the_setting(silent_peer):
    from tfos.wire.clients import end_feed

    port, key = silent_peer
    with pytest.raises(TFOSTimeoutError, match="raise feed_timeout"):
        end_feed("127.0.0.1", port, key, 1, "f1", "input", 10, timeout=1.0, while_waiting=lambda: None)


def test_an_agent_whose_heartbeat_connection_closes_is_lost_after_the_grace_not_the_timeout(control):
    """The agent holds one connection for its heartbeats: its end, with no heartbeat after it, is
    the agent's (process or host gone), judged in seconds rather than at heartbeat_timeout."""
    import time

    state, key, server = control
    for node in (0, 1):
        _client(server, key, node=node).agent_started("h", 100 + node, 200 + node, "/log")
    beats = [_client(server, key, node=node) for node in (0, 1)]
    for b in beats:
        b.keep_connection()
        assert [b.heartbeat_reply().stop for _ in range(3)] == [False] * 3  # one connection, kept
    beats[1].close()  # node 1's agent dies
    with pytest.raises(RequestRefused):  # another attempt's heartbeat: refused, and its connection's end is no one's
        _client(server, key, node=0, cluster="cid-old").heartbeat()
    deadline = time.monotonic() + 5
    while state.nodes[1].disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    state.check_heartbeats(60.0, grace=0.2)
    assert state.failures == []  # within the grace: it may still come back
    time.sleep(0.3)
    beats[0].heartbeat_reply()
    state.check_heartbeats(60.0, grace=0.2)
    assert [f.node_index for f in state.failures] == [1]
    assert "connection to the driver closed" in state.failures[0].reason
    beats[0].close()


def test_an_agent_that_reconnects_within_the_grace_is_not_lost(control):
    import time

    state, key, server = control
    _client(server, key, node=1).agent_started("h", 101, 201, "/log")
    beat = _client(server, key, node=1)
    beat.keep_connection()
    beat.heartbeat_reply()
    beat.close()
    deadline = time.monotonic() + 5
    while state.nodes[1].disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.heartbeat_reply()  # a new connection
    time.sleep(0.3)
    state.check_heartbeats(60.0, grace=0.2)
    assert state.failures == []
    beat.close()


def test_a_kept_client_carries_the_requests_of_many_threads_on_one_connection(control):
    """The TF process's reports keep one connection: no handshake per report on the driver."""
    state, key, server = control
    client = _client(server, key, node=1).keep_connection()
    client.report({"step": 0}, [])
    first = client._ch

    def report(t):
        for i in range(25):
            client.report({f"t{t}": i}, [{"name": "x", "ph": "X", "ts": i, "dur": 1}])

    threads = [threading.Thread(target=report, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert client._ch is first and len(state.nodes[1].events) == 150
    assert all(state.nodes[1].metrics[f"t{t}"] == 24 for t in range(6))
    client.close()


def test_the_cluster_spec_is_encoded_once_and_registrations_do_not_wake_its_waiters():
    reg = NodeRegistry("cid", [("worker", i) for i in range(3)])
    wakes = []

    class Counting(threading.Condition):
        def wait(self, timeout=None):
            woken = super().wait(timeout)
            wakes.append(woken)
            return woken

    reg._spec_cond = Counting(reg._lock)
    replies = []
    waiters = [threading.Thread(target=lambda i=i: replies.append(reg.on_cluster_spec(M.GetClusterSpec("cid", i, 30))))
               for i in range(2)]
    for t in waiters:
        t.start()
    for i in range(3):
        assert reg.on_register(M.RegisterNode("cid", M.NodeInfo(i, "worker", i, f"h{i}", 1, 0, 10 + i))) == M.Ack()
    import time
    time.sleep(0.3)
    assert wakes == [] and replies == []  # three registrations woke neither waiter
    reg.set_backend_config({"b": 1})
    for t in waiters:
        t.join(10)
    assert len(replies) == 2 and replies[0] is replies[1] and isinstance(replies[0], M.Encoded)
    spec = M.decode(M.encode(replies[0]))
    assert [n.host for n in spec.nodes] == ["h0", "h1", "h2"] and spec.backend == {"b": 1}


@pytest.mark.parametrize("event", ["abort", "fail", "stop"])
def test_a_cluster_spec_waiter_is_told_at_once_when_the_start_ends(event):
    import time

    from tfos.errors import NodeFailure

    reg = NodeRegistry("cid", [("worker", 0), ("worker", 1)])
    replies = []
    t = threading.Thread(target=lambda: replies.append(reg.on_cluster_spec(M.GetClusterSpec("cid", 0, 30))))
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    {"abort": lambda: reg.abort("stopped"),
     "fail": lambda: reg.fail(NodeFailure(1, "worker", 1, "h", "boom")),
     "stop": lambda: reg.request_stop([0])}[event]()
    t.join(10)
    assert time.monotonic() - t0 < 1.0
    assert isinstance(replies[0], M.ErrorReply) and "cluster start aborted" in replies[0].message


@pytest.mark.parametrize("size,kept", [(100, False), (200_000, False), (600_000, True)])
def test_an_encrypted_channel_keeps_a_send_stage_only_after_a_frame_larger_than_it(size, kept):
    """A cluster spec to each of thousands of nodes must not leave each connection holding a stage."""
    a, b = channel_pair(True)
    got = []
    t = threading.Thread(target=lambda: got.append(b.recv_frame()[1]))
    t.start()
    payload = os.urandom(size)
    a.send_data(payload)
    t.join(10)
    assert got[0].to_pybytes() == payload and (a._stage is not None) is kept
    a.close()
    b.close()


def _frame(msg) -> bytes:
    payload = M.encode(msg)
    return C._HEADER.pack(C.KIND_JSON, len(payload)) + payload


def test_kept_connections_wait_parked_without_a_thread_each(control):
    """Thousands of nodes keep two connections each: they must not hold a driver thread each."""
    import time

    state, key, server = control
    before = threading.active_count()
    clients = [_client(server, key, node=i % 2).keep_connection() for i in range(60)]
    for c in clients:
        assert c.heartbeat_reply().stop is False
    time.sleep(0.2)  # the connections' first threads hand them over and end
    assert threading.active_count() - before < 10
    for c in clients:  # every parked connection still answers
        assert c.heartbeat_reply().stop is False
        c.close()


def test_a_request_that_waits_does_not_hold_up_the_quick_ones(control):
    import time

    state, key, server = control
    waiting = _client(server, key, node=0).keep_connection()
    waiting.heartbeat_reply()  # parked
    answers = []
    t = threading.Thread(target=lambda: answers.append(_spec_or_error(waiting, 1.5)))
    t.start()
    beats = _client(server, key, node=1).keep_connection()
    t0 = time.monotonic()
    for _ in range(20):
        beats.heartbeat_reply()
    assert time.monotonic() - t0 < 1.0 and answers == []  # answered while the spec wait goes on
    t.join(10)
    assert "did not register" in answers[0]
    assert waiting.heartbeat_reply().stop is False  # its connection is parked again after the wait
    waiting.close()
    beats.close()


def _spec_or_error(client, wait):
    from tfos.errors import RequestRefused

    try:
        return client.cluster_spec(wait)
    except RequestRefused as e:
        return str(e)


def test_requests_sent_together_are_all_answered_in_order(control):
    """Two requests in one write (one encrypted record): the second is already read when the first
    is answered, so no selector would report it."""
    state, key, server = control
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch.settimeout(5)
    assert isinstance(ch.request(M.Heartbeat("cid", 1)), M.HeartbeatReply)  # parked now
    state.request_stop([1])
    ch._sendall_parts([memoryview(_frame(M.Heartbeat("cid", 1))), memoryview(_frame(M.Heartbeat("cid", 0)))])
    assert ch.recv() == M.HeartbeatReply(stop=True) and ch.recv() == M.HeartbeatReply(stop=False)
    ch.close()


def test_a_malformed_request_on_a_parked_connection_is_answered_and_closes_it(control):
    from tfos.errors import ChannelClosed

    state, key, server = control
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch.settimeout(5)
    ch.request(M.Heartbeat("cid", 1))
    ch._sendall_parts([memoryview(C._HEADER.pack(C.KIND_JSON, 5) + b"{oops")])
    reply = ch.recv()
    assert isinstance(reply, M.ErrorReply) and "JSON" in reply.message
    with pytest.raises(ChannelClosed):
        ch.recv()
    assert state.failures == []  # and nothing changed
    ch.close()


def test_a_parked_connection_silent_for_the_idle_timeout_is_closed_and_its_agent_lost(control):
    import time

    from tfos.errors import ChannelClosed

    state, key, server = control
    server._listener.idle_timeout = 0.3
    _client(server, key, node=1).agent_started("h", 101, 201, "/log")
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch.settimeout(5)
    ch.request(M.Heartbeat("cid", 1))
    with pytest.raises(ChannelClosed):  # the sweep runs every second
        ch.recv()
    deadline = time.monotonic() + 5
    while state.nodes[1].disconnected_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.nodes[1].disconnected_at is not None
    ch.close()


@pytest.mark.parametrize("msg,waits", [
    (M.Heartbeat("c", 0), False),
    (M.Report("c", 0, {"step": 1}, []), False),
    (M.Report("c", 0, {}, [], history=[{"loss": 1.0}]), True),  # the MLflow run's metrics: a call out
    (M.Report("c", 0, {}, [], output=["a line"]), True),  # printed on the driver's console
    (M.RegisterNode("c", M.NodeInfo(0, "worker", 0, "h", 1, 0, 2)), False),
    (M.AssignChunk("c", "f", 10), False),
    (M.GetClusterSpec("c", 0, 60.0), True),
    (M.FeedGate("c", 0, "f", 10), True),
    (M.Gather("c", 0, "k", 1), True),
    (M.StoreGet("c", 0, "s", ("k",), 1.0), True),
    (M.GetNodeFailure("c", 0, 1.0), True),
])
def test_which_requests_get_a_thread_of_their_own(msg, waits):
    from tfos.cluster.driver import service

    assert service.waits(msg) is waits


def test_a_request_cut_short_on_a_parked_connection_is_refused_and_the_others_go_on(control):
    """The parking thread reads a request whole within REQUEST_DEADLINE of its first byte."""
    import time

    from tfos.errors import ChannelClosed

    state, key, server = control
    ch = C.Channel.connect("127.0.0.1", server.port, key, timeout=5)
    ch.settimeout(10)
    ch.request(M.Heartbeat("cid", 1))
    frame = _frame(M.Heartbeat("cid", 1))
    ch._sendall_parts([memoryview(frame[:3])]) if not key.encrypt else ch.sock.sendall(b"\x00\x00")
    t0 = time.monotonic()
    try:
        reply = ch.recv()
        assert isinstance(reply, M.ErrorReply) and "did not arrive whole" in reply.message
    except ChannelClosed:
        pass
    assert time.monotonic() - t0 < 6
    other = _client(server, key, node=0).keep_connection()
    assert other.heartbeat_reply().stop is False
    other.close()
    ch.close()
