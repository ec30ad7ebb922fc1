"""Encrypted tfos channels (protocol v5): the key schedule and record format against known answers
(the vectors the Rust tunnel checks too), and a man in the middle that changes, replays, reorders,
drops, splices, truncates records or rewrites the handshake's mode: every such connection ends in
ProtocolError before the changed bytes are parsed."""

import hashlib
import hmac
import json
import os
import socket
import struct
import threading

import pytest

from tfos.errors import AuthenticationError, ChannelClosed, ProtocolError
from tfos.wire import channel as C
from tfos.wire import crypto
from tfos.wire import messages as M

VECTORS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "vectors", "channel-v5.json")


# --------------------------------------------------------------------------- known answers

def _handshake_bytes(encrypt: bool, v: dict):
    """Run the real handshake over a socket pair with the vectors' fixed keys and nonces; return
    what crossed the wire each way and the two channels."""
    a, b = socket.socketpair()
    key = M.ChannelKey(v["secret"], encrypt)
    server_eph = crypto.Ephemeral(bytes.fromhex(v["server_private"])) if encrypt else None
    client_eph = crypto.Ephemeral(bytes.fromhex(v["client_private"])) if encrypt else None
    wire = {"server": bytearray(), "client": bytearray()}

    class Tap(C.Channel):  # records the handshake's raw bytes as they are sent
        def _raw_sendall(self, data):
            wire[self.peer] += bytes(data)
            super()._raw_sendall(data)

    server, client = Tap(b, "server"), Tap(a, "client")
    t = threading.Thread(target=server.server_handshake, args=(key,),
                         kwargs={"ephemeral": server_eph, "nonce": bytes.fromhex(v["server_nonce"])})
    t.start()
    client.client_handshake(key, ephemeral=client_eph, nonce=bytes.fromhex(v["client_nonce"]))
    t.join(10)
    return bytes(wire["server"]), bytes(wire["client"]), client, server


def _hkdf_oracle(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out, independent of the library's HKDF."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def compute_vectors() -> dict:
    """The vectors as this implementation makes them (``python tests/unit/test_channel_crypto.py``
    rewrites the file; a change to it is a protocol change)."""
    v = {"secret": bytes(range(32)).hex(), "server_private": (b"\x11" * 32).hex(), "client_private": (b"\x22" * 32).hex(),
         "server_nonce": (b"\x33" * 16).hex(), "client_nonce": (b"\x44" * 16).hex()}
    for encrypt in (False, True):
        s, c, client, server = _handshake_bytes(encrypt, v)
        out = {"hello": s[:crypto.HELLO.size].hex(), "auth": c.hex(), "finish": s[crypto.HELLO.size:].hex()}
        if encrypt:
            records = []
            for side, ch, text in (("client", client, b"{\"type\":\"Ack\",\"v\":5}"), ("client", client, b""),
                                   ("server", server, bytes(range(200)))):
                records.append({"from": side, "seq": ch._tx.seq, "plaintext": text.hex(),
                                "record": ch._tx.seal(text).hex()})
            out["records"] = records
            out["tunnel_open"] = _frame(M.TunnelOpen(7000)).hex()
        v["encrypted" if encrypt else "clear"] = out
        client.close()
        server.close()
    return v


def _frame(msg) -> bytes:
    payload = M.encode(msg)
    return struct.pack(">cI", C.KIND_JSON, len(payload)) + payload


def test_the_wire_bytes_match_the_known_answers():
    with open(VECTORS) as f:
        stored = json.load(f)
    assert compute_vectors() == stored


def test_the_key_schedule_is_hkdf_over_the_exchange_bound_to_secret_and_transcript():
    with open(VECTORS) as f:
        v = json.load(f)
    e = v["encrypted"]
    hello, auth, finish = (bytes.fromhex(e[k]) for k in ("hello", "auth", "finish"))
    secret = bytes.fromhex(v["secret"])
    transcript = hello + auth[:-32]
    assert auth[-32:] == hmac.new(secret, b"tfos-v5 client" + transcript, hashlib.sha256).digest()
    assert finish == hmac.new(secret, b"tfos-v5 server" + transcript + auth[-32:], hashlib.sha256).digest()
    shared = crypto.Ephemeral(bytes.fromhex(v["client_private"])).shared(hello[-32:])
    assert shared == crypto.Ephemeral(bytes.fromhex(v["server_private"])).shared(auth[17:49])
    okm = _hkdf_oracle(secret, shared, b"tfos-v5 keys" + hashlib.sha256(transcript + auth[-32:] + finish).digest(), 88)
    keys = crypto.derive_keys(secret, shared, transcript, auth[-32:], finish)
    assert okm == keys.client_key + keys.server_key + keys.client_iv + keys.server_iv
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    for r in e["records"]:  # AES-256-GCM, nonce = IV xor sequence number, the length word as additional data
        key, iv = (keys.client_key, keys.client_iv) if r["from"] == "client" else (keys.server_key, keys.server_iv)
        record = bytes.fromhex(r["record"])
        nonce = (int.from_bytes(iv, "big") ^ r["seq"]).to_bytes(12, "big")
        assert AESGCM(key).decrypt(nonce, record[4:], record[:4]) == bytes.fromhex(r["plaintext"])
        assert struct.unpack(">I", record[:4])[0] == len(record) - 4


def test_a_clear_hello_carries_no_key_and_an_encrypted_one_does():
    with open(VECTORS) as f:
        v = json.load(f)
    clear, enc = bytes.fromhex(v["clear"]["hello"]), bytes.fromhex(v["encrypted"]["hello"])
    assert clear[:7] == enc[:6] + b"\x00" and enc[6] == 1 and clear[-32:] == bytes(32) and enc[-32:] != bytes(32)


# --------------------------------------------------------------------------- a man in the middle

class Server:
    """A tfos endpoint that records every message it parsed and how its connection ended."""

    def __init__(self, key: M.ChannelKey, reply: bool = False):
        self.key, self.reply = key, reply
        self.got: list = []
        self.ended: BaseException | None = None
        self.done = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.sock.accept()
        ch = C.Channel(conn, "client")
        try:
            ch.server_handshake(self.key)
            ch.settimeout(10)
            while True:
                msg = ch.recv()
                self.got.append(msg)
                if self.reply:
                    ch.send(M.FeedAck(len(self.got)))
        except BaseException as e:
            self.ended = e
        finally:
            ch.close()
            self.done.set()


class Relay:
    """Between a client and a server: passes the handshake, then hands every complete record of the
    client's stream (once the handshake is through) to ``act(index, record) -> bytes to forward``,
    and passes the server's bytes back unchanged (or through ``back``)."""

    def __init__(self, target_port: int, act, back=None, cut_after: bytes | None = None):
        self.target, self.act, self.back = target_port, act, back
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.records: list[bytes] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            self._relay()
        except OSError:  # either side went away
            pass

    def _relay(self):
        c, _ = self.sock.accept()
        s = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self._back, args=(s, c), daemon=True).start()
        buf = bytearray()
        handshake = crypto.AUTH.size
        i = 0
        try:
            while True:
                data = c.recv(1 << 16)
                if not data:
                    break
                buf += data
                if handshake:
                    take = bytes(buf[:handshake])
                    if self.back is not None and len(take) == crypto.AUTH.size:
                        take = self.back("auth", take)
                    if len(buf) < handshake:
                        continue
                    s.sendall(take)
                    del buf[:handshake]
                    handshake = 0
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                    n = 4 + struct.unpack(">I", buf[:4])[0]
                    record = bytes(buf[:n])
                    del buf[:n]
                    self.records.append(record)
                    out = self.act(i, record)
                    i += 1
                    if out is None:  # cut: close both sides now
                        s.shutdown(socket.SHUT_WR)
                        return
                    s.sendall(out)
        finally:
            s.shutdown(socket.SHUT_WR)

    def _back(self, s, c):
        try:
            self._pass_back(s, c)
        except OSError:
            pass

    def _pass_back(self, s, c):
        first = True
        while True:
            data = s.recv(1 << 16)
            if not data:  # shut down first: a plain close does not end a recv blocked in the other thread
                c.shutdown(socket.SHUT_RDWR)
                c.close()
                return
            if first and self.back is not None and len(data) >= crypto.HELLO.size:
                data = self.back("hello", data[:crypto.HELLO.size]) + data[crypto.HELLO.size:]
            first = False
            c.sendall(data)


def _send_three(port, key):
    ch = C.Channel.connect("127.0.0.1", port, key, timeout=10)
    for i in range(3):
        ch.send(M.FeedPartitionEnd(i))
    return ch


def _flip(i, record):
    if i != 1:
        return record
    b = bytearray(record)
    b[10] ^= 1
    return bytes(b)


@pytest.mark.parametrize("name,act,parsed", [
    ("flipped", _flip, 1),
    ("length word changed", lambda i, r: (struct.pack(">I", struct.unpack(">I", r[:4])[0] - 1) + r[4:-1]) if i == 1
     else r, 1),
    ("dropped", lambda i, r: b"" if i == 1 else r, 1),
    ("replayed", lambda i, r: r + r if i == 1 else r, 2),  # the genuine record, then its copy fails
])
def test_a_changed_record_ends_the_connection_before_it_is_parsed(name, act, parsed):
    server = Server(C.new_key(True))
    relay = Relay(server.port, act)
    key = server.key
    ch = _send_three(relay.port, key)
    assert server.done.wait(10)
    ch.close()
    assert server.got == [M.FeedPartitionEnd(i) for i in range(parsed)]  # the records before the change only
    assert isinstance(server.ended, ProtocolError) and "integrity" in str(server.ended)


def test_reordered_records_end_the_connection():
    held = []

    def swap(i, r):
        if i == 0:
            held.append(r)
            return b""
        if i == 1:
            return r + held[0]
        return r

    server = Server(C.new_key(True))
    ch = _send_three(Relay(server.port, swap).port, server.key)
    assert server.done.wait(10)
    ch.close()
    assert server.got == [] and isinstance(server.ended, ProtocolError) and "integrity" in str(server.ended)


def test_a_record_spliced_from_another_connection_of_the_same_cluster_is_refused():
    key = C.new_key(True)
    first = Server(key)
    recorder = Relay(first.port, lambda i, r: r)
    _send_three(recorder.port, key).close()
    assert first.done.wait(10) and len(first.got) == 3
    second = Server(key)
    ch = _send_three(Relay(second.port, lambda i, r: recorder.records[1] if i == 1 else r).port, key)
    assert second.done.wait(10)
    ch.close()
    assert second.got == [M.FeedPartitionEnd(0)] and "integrity" in str(second.ended)


def test_a_record_cut_short_ends_the_connection_with_a_protocol_error():
    server = Server(C.new_key(True))
    relay = Relay(server.port, lambda i, r: r if i < 1 else (r[:len(r) // 2] if i == 1 else None))
    ch = _send_three(relay.port, server.key)
    assert server.done.wait(10)
    ch.close()
    assert server.got == [M.FeedPartitionEnd(0)]
    assert isinstance(server.ended, ProtocolError) and "inside a record" in str(server.ended)


def test_a_stream_cut_at_a_record_boundary_inside_a_frame_is_a_protocol_error():
    """A frame that spans records and loses its last ones is never handed on half."""
    from test_wire import channel_pair

    client, server = channel_pair(True)
    frame = struct.pack(">cI", C.KIND_ARROW, 3 << 20) + bytes(2 << 20)  # announces 3 MiB, 2 MiB follow

    def send():
        client._sendall_parts([memoryview(frame)])
        client.sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=send)
    t.start()
    server.settimeout(10)
    with pytest.raises(ProtocolError):
        server.recv_frame()
    t.join(10)


def test_an_oversized_record_is_refused_before_anything_is_allocated():
    server = Server(C.new_key(True))
    relay = Relay(server.port, lambda i, r: struct.pack(">I", crypto.MAX_RECORD + 17) + b"x" * 100 if i == 0 else r)
    ch = _send_three(relay.port, server.key)
    assert server.done.wait(10)
    ch.close()
    assert server.got == [] and "outside 16.." in str(server.ended)


# --------------------------------------------------------------------------- modes: no downgrade

def test_a_clear_client_is_refused_by_an_encrypted_listener_and_the_reverse():
    for server_mode, client_mode in ((True, False), (False, True)):
        server = Server(C.new_key(server_mode))
        with pytest.raises(ProtocolError, match="tfos channels but this client is"):
            C.Channel.connect("127.0.0.1", server.port, M.ChannelKey(server.key.secret, client_mode), timeout=5)
        assert server.got == []


def _set_mode(hello: bytes, mode: int) -> bytes:
    b = bytearray(hello)
    b[6] = mode
    return bytes(b)


def test_a_man_in_the_middle_cannot_downgrade_an_encrypted_listener():
    """Rewriting the server's mode to clear for a clear client, and the client's answer back to
    encrypted for the server: the MACs cover the original bytes, so both sides refuse."""
    server = Server(C.new_key(True))

    def rewrite(what, data):
        return _set_mode(data, 0) if what == "hello" else bytes([1]) + data[1:]

    relay = Relay(server.port, lambda i, r: r, back=rewrite)
    with pytest.raises(AuthenticationError):
        C.Channel.connect("127.0.0.1", relay.port, M.ChannelKey(server.key.secret, False), timeout=5)
    assert server.done.wait(10)
    assert server.got == [] and isinstance(server.ended, AuthenticationError)


def test_an_encrypted_client_refuses_a_hello_rewritten_to_clear():
    server = Server(C.new_key(True))
    relay = Relay(server.port, lambda i, r: r, back=lambda what, d: _set_mode(d, 0) if what == "hello" else d)
    with pytest.raises(ProtocolError, match="speaks clear tfos channels"):
        C.Channel.connect("127.0.0.1", relay.port, server.key, timeout=5)


def test_a_wrong_secret_is_refused_in_encrypted_mode():
    server = Server(C.new_key(True))
    with pytest.raises(AuthenticationError):
        C.Channel.connect("127.0.0.1", server.port, C.new_key(True), timeout=5)
    assert server.done.wait(10) and server.got == []


def test_a_low_order_key_share_is_refused():
    """A client that answers with the all-zero X25519 point gets no session (the exchange is refused)."""
    key = C.new_key(True)
    server = Server(key)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    hello = s.recv(crypto.HELLO.size)
    nonce, public = b"n" * 16, bytes(32)
    transcript = hello + bytes([1]) + nonce + public
    s.sendall(crypto.AUTH.pack(1, nonce, public, crypto.client_mac(bytes.fromhex(key.secret), transcript)))
    assert server.done.wait(10)
    assert s.recv(64) == b"" and isinstance(server.ended, AuthenticationError) and server.got == []


# --------------------------------------------------------------------------- both directions at once

def test_one_thread_sends_while_another_receives_on_one_encrypted_connection():
    """Inference writes rows and reads results on one connection from two threads."""
    from test_wire import channel_pair

    a, b = channel_pair(True)
    n = 300
    payload = os.urandom(300_000)

    def echo():  # the hub's side: answers each data frame with a message and the frame back
        for _ in range(n):
            kind, data = b.recv_frame()
            b.send(M.FeedResults(data.size))
            b.send_data(data)

    t = threading.Thread(target=echo)
    t.start()
    sender = threading.Thread(target=lambda: [a.send_data(payload) for _ in range(n)])
    sender.start()
    for _ in range(n):
        msg = a.recv()
        kind, data = a.recv_frame()
        assert msg == M.FeedResults(len(payload)) and data.to_pybytes() == payload
    sender.join(30)
    t.join(30)
    a.close()
    b.close()


def test_the_receiver_sees_no_plaintext_of_an_encrypted_frame_on_the_wire():
    marker = b"MARKER-0123456789"
    seen = bytearray()

    def keep(i, r):
        seen.extend(r)
        return r

    server = Server(C.new_key(True))
    relay = Relay(server.port, keep)
    ch = C.Channel.connect("127.0.0.1", relay.port, server.key, timeout=10)
    ch.send(M.LogModel("c", 0, marker.decode() * 100))
    ch.close()
    assert server.done.wait(10) and marker.decode() in server.got[0].path
    assert marker not in bytes(seen) and len(seen) > 1700


if __name__ == "__main__":
    os.makedirs(os.path.dirname(VECTORS), exist_ok=True)
    with open(VECTORS, "w") as f:
        json.dump(compute_vectors(), f, indent=1)
        f.write("\n")
    print("wrote", VECTORS)


def test_a_timeout_before_a_record_leaves_the_stream_whole_and_one_inside_it_does_not():
    import socket as _socket

    from test_wire import channel_pair

    a, b = channel_pair(True)
    b.settimeout(0.2)
    with pytest.raises(_socket.timeout):  # nothing sent yet: the stream is intact
        b.recv()
    a.send(M.FeedPartitionEnd(1))
    b.settimeout(5)
    assert b.recv() == M.FeedPartitionEnd(1)
    record = a._tx.seal(b"x" * 100)
    a.sock.sendall(record[:30])  # a record cut short, then silence
    b.settimeout(0.3)
    with pytest.raises(_socket.timeout):
        b.recv()
    a.sock.sendall(record[30:])
    b.settimeout(5)
    with pytest.raises(ProtocolError, match="broke inside a record"):
        b.recv()
    a.close()
    b.close()
