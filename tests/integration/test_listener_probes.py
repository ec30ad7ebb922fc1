"""Probes of both listeners (the driver's control service and a TF process's feed hub) with bad
input and resource abuse: memory stays bounded, nothing hangs, the accept loop survives, state is
unchanged, and a legitimate client is served afterwards. No Spark."""

import os
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

from tfos.feed.driver.scheduler import FeedScheduler
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.errors import FeedError, RequestRefused
from tfos.wire import arrow
from tfos.wire import channel as C
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient, FeedClient

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2 ** 20


@pytest.fixture(params=[False, True], ids=["clear", "encrypted"])
def server(request):
    """The probe server in its own process (its RSS is what we measure), under RLIMIT_NOFILE=200,
    with clear or encrypted channels: every probe holds in both modes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(HERE), "probe_server.py"), "200",
                             str(int(request.param))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        control, feed, key, encrypt = proc.stdout.readline().split()
        yield proc, int(control), int(feed), M.ChannelKey(key, encrypt == "1")
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(10)


def _legit_driver_request(port, key):
    return DriverClient("127.0.0.1", port, key, "probe", 0).heartbeat(timeout=10)


def _legit_feed(port, key, rows=1000):
    client = FeedClient(0, "127.0.0.1", port, key, timeout=20)
    try:
        client.begin("f1", "input", 0, True)
        client.send_batch(arrow.to_ipc(arrow.rows_to_batch([(i, float(i)) for i in range(rows)])))
        client.end_partition(rows)
        return client.next_reply()
    finally:
        client.close()


def _authenticated(port, key):
    return C.Channel.connect("127.0.0.1", port, key, timeout=10)


def test_memory_stays_bounded_under_abuse_and_legit_clients_are_served_after(server):
    proc, control, feed, key = server
    assert _legit_driver_request(control, key) is False
    base = _rss_mb(proc.pid)
    # 1. A 2 GiB length prefix, then silence: nothing may be reserved from the prefix.
    ch = _authenticated(feed, key)
    ch.send(M.FeedBegin("f0", "input", 0, True))
    ch._sendall(struct.pack(">cI", C.KIND_ARROW, C.MAX_DATA_FRAME) + b"\0" * 1000)
    # 2. A compression bomb: ~0.5 MiB of zstd that would expand to 800 MB.
    big = pa.record_batch([pa.array(np.zeros(100_000_000, np.int64))], names=["x"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, big.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(big)
    bomb = sink.getvalue()
    del big
    assert bomb.size < 1 << 20
    bomb_ch = _authenticated(feed, key)
    bomb_ch.send(M.FeedBegin("f0", "input", 1, True))
    bomb_ch.send_data(bomb)
    bomb_ch.settimeout(10)
    reply = bomb_ch.recv()
    assert isinstance(reply, M.ErrorReply) and "compressed" in reply.message
    # 3. 300 idle connections (never authenticating), spread over both listeners, beyond RLIMIT_NOFILE.
    idle = []
    for i in range(300):
        try:
            idle.append(socket.create_connection(("127.0.0.1", control if i % 2 else feed), timeout=5))
        except OSError:
            break
    time.sleep(1.0)
    peak = _rss_mb(proc.pid)
    print(f"rss base {base:.0f} MB, peak {peak:.0f} MB, idle connections {len(idle)}")
    assert peak - base < 64, (base, peak)
    for s in idle:
        s.close()
    ch.close()
    bomb_ch.close()
    time.sleep(0.5)
    # The accept loops survived EMFILE and the abuse: legitimate clients are served.
    assert _legit_driver_request(control, key) is False
    assert _legit_feed(feed, key) == M.FeedAck(1000, False)
    assert _rss_mb(proc.pid) - base < 64


def test_handshake_has_one_deadline_against_a_slow_drip(server):
    proc, control, _feed, _key = server
    s = socket.create_connection(("127.0.0.1", control), timeout=20)
    s.recv(64)
    t0 = time.monotonic()
    closed = False
    try:
        for _ in range(40):  # one byte per 0.5 s: 20 s of drip if nobody stops it
            s.sendall(b"x")
            time.sleep(0.5)
    except OSError:
        closed = True
    if not closed:
        s.settimeout(5)
        try:
            closed = s.recv(16) == b""
        except OSError:
            closed = True
    assert closed and time.monotonic() - t0 < 15  # the 10 s handshake deadline, not 10 s per byte
    s.close()


@pytest.fixture(params=[False, True], ids=["clear", "encrypted"])
def control(request):
    registry = NodeRegistry("cid", [("chief", 0), ("worker", 0)])
    key = C.new_key(request.param)
    service = ControlService(registry, FeedScheduler(registry, [0, 1]).handlers(), key, "127.0.0.1").start()
    yield registry, key, service
    service.stop()


def _raw_request(service, key, payload: bytes):
    ch = _authenticated(service.port, key)
    try:
        ch._sendall(struct.pack(">cI", C.KIND_JSON, len(payload)) + payload)
        ch.settimeout(10)
        return ch.recv()
    finally:
        ch.close()


V = M.PROTOCOL_VERSION  # the version the service speaks: these frames fail on their content, not on it


@pytest.mark.parametrize("payload,match", [
    (b'{"type":7,"v":%d}' % V, "unknown message type"),
    (b'{"type":"Heartbeat","v":%d,"cluster_id":"cid","node_index":99999999999999999999999}' % V, "out of range"),
    (b'{"type":"Heartbeat","v":%d,"cluster_id":"cid","node_index":"0"}' % V, "expected int"),
    (b'{"type":"Heartbeat","v":%d,"cluster_id":"cid","node_index":5}' % V, "unknown node index 5"),
    (b'{"type":"RegisterNode","v":%d,"cluster_id":"cid","node":{"node_index":0,"job_name":"chief","task_index":0,'
     b'"host":"h","tf_port":"x","feed_port":0,"pid":1}}' % V, "tf_port: expected int"),
    (b'{"type":"Report","v":%d,"cluster_id":"cid","node_index":0,"values":' % V + b'[' * 50000 + b']' * 50000 + b'}',
     "not valid JSON"),
    (b'\xff\xfe garbage', "not valid JSON"),
])
def test_malformed_messages_get_an_error_reply_and_change_nothing(control, payload, match):
    registry, key, service = control
    reply = _raw_request(service, key, payload)
    assert isinstance(reply, M.ErrorReply) and match in reply.message
    assert all(n.info is None and n.last_heartbeat == 0.0 and not n.metrics for n in registry.nodes.values())
    assert DriverClient("127.0.0.1", service.port, key, "cid", 0).heartbeat() is False  # still serving


def test_random_bytes_as_an_arrow_frame_are_answered_not_a_dead_thread(server):
    _proc, _control, feed, key = server
    ch = _authenticated(feed, key)
    ch.send(M.FeedBegin("f9", "input", 3, True))
    ch.send_data(os.urandom(4096))
    ch.settimeout(10)
    reply = ch.recv()
    assert isinstance(reply, M.ErrorReply) and "not an Arrow IPC stream" in reply.message
    ch.close()
    assert _legit_feed(feed, key) == M.FeedAck(1000, False)


@pytest.mark.parametrize("second,match", [
    ([("a", i) for i in range(5)], "column '_0' holds string, but earlier rows of this feed hold int64"),
    ([(1, 2.0, 3) for _ in range(5)], "column '_2' appears"),
])
def test_schema_drift_between_partitions_is_refused_by_the_hub_naming_partition_row_column(server, second, match):
    _proc, _control, feed, key = server
    first = FeedClient(0, "127.0.0.1", feed, key, timeout=20)
    first.begin("drift", "input", 0, True)
    first.send_batch(arrow.to_ipc(arrow.rows_to_batch([(i, float(i)) for i in range(10)])))
    first.end_partition(10)
    assert first.next_reply() == M.FeedAck(10, False)
    first.close()
    other = FeedClient(0, "127.0.0.1", feed, key, timeout=20)
    other.begin("drift", "input", 7, True)
    other.send_batch(arrow.to_ipc(arrow.rows_to_batch(second)))
    other.end_partition(len(second))
    with pytest.raises(RequestRefused, match=f"partition 7, row 0: {match}"):
        other.next_reply()
    other.close()


def test_schema_drift_within_a_partition_is_a_feed_error_in_the_task():
    from tfos.feed.executor.producer import rows_to_chunks
    from tfos.feed.executor.sender import Sender

    cfg = M.FeedConfig("c", C.new_key(), "127.0.0.1", 1, "f", "input", 5.0, (0,), ((0, "127.0.0.1", 1),), 4)
    sender = Sender(cfg, 3, train=True)
    chunks = list(rows_to_chunks([(1, [0.0] * 4)] * 4 + [(1, [0.0] * 2)] * 4, 3, 4))
    sender.check(chunks[0])
    sender.rows_checked = 4
    with pytest.raises(FeedError, match=r"partition 3, row 4: column '_1' holds fixed_size_list.*\[2\].*\[4\]"):
        sender.check(chunks[1])


def test_non_json_progress_values_are_converted_and_reach_the_driver(control):
    """ctx.report(step=np.int64(3)) used to kill the reporter thread (and make main_fun exit 1)."""
    import numpy as np

    from tfos.cluster.node.reporting import Reporter

    registry, key, service = control
    reporter = Reporter(DriverClient("127.0.0.1", service.port, key, "cid", 0), interval=0.05, timeline=True)
    reporter.report({"step": np.int64(3), "loss": np.float32(0.5), "hist": np.arange(3), "odd": object(),
                     "nan": float("nan")})
    reporter.event("step", "step", 1.0, 2.0, {"n": np.int32(7)})
    reporter.close()
    m = registry.nodes[0].metrics
    assert m["step"] == 3 and m["loss"] == 0.5 and m["hist"] == [0, 1, 2] and m["nan"] == "nan"
    assert m["odd"].startswith("<object") and registry.nodes[0].events[0]["args"] == {"n": 7}
