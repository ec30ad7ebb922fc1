"""TFRecord files TensorFlow cannot open, handed to TensorFlow's own reader block by block (TF process).

TensorFlow 2.21 has no ``hdfs://`` filesystem, and its ``TFRecordDataset`` reads files by offset
(a pipe will not do). :func:`spool_paths` has a reader process (``python -m tfos.data.spool``, a
child of the TF process that dies with it) read each file through pyarrow's filesystem layer
(hdfs-native for hdfs://) in blocks of whole records and write each block to a private local file,
and yields the files' paths for ``TFRecordDataset``: records are cut, checked (CRC-32C) and decoded
in TensorFlow's C++, with no Python object per record. The reader is a process, not a thread,
because hdfs-native keeps the GIL while it waits for the network: in a thread it stalls the
training loop and TensorFlow's callbacks for as long as each read takes. The reader stays at most
AHEAD blocks ahead of TensorFlow; memory and local disk hold those blocks, whatever the file's
size: a 2 GB shard is never copied whole first.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

from tfos.errors import FeedError, FeedTimeoutError
from tfos.host import private, processes

#: bytes read (and spooled) at a time; a record longer than this makes its block longer
#: (TFOS_SPOOL_BLOCK sets it for the reader process, in bytes)
BLOCK = int(os.environ.get("TFOS_SPOOL_BLOCK", 8 << 20))
#: blocks the reader writes ahead of the one TensorFlow reads
AHEAD = 4
#: how long TensorFlow waits for the reader's next block before it gives up
BLOCK_TIMEOUT_SECS = 600.0
_LENGTH = struct.Struct("<Q")


def whole_records(buf: bytes) -> int:
    """Pure: the length of the longest prefix of ``buf`` made of whole TFRecord records (12-byte
    header, data, 4-byte CRC), read from the length fields alone."""
    pos, end = 0, len(buf)
    unpack = _LENGTH.unpack_from
    while pos + 8 <= end:
        stop = pos + 16 + unpack(buf, pos)[0]
        if stop > end:
            break
        pos = stop
    return pos


class _Reader:
    """One reader process (``python -m tfos.data.spool``), reused by the datasets of this process
    one after another: its start (an interpreter, pyarrow, the HDFS client) is paid once."""

    def __init__(self):
        # unbuffered: select() on the pipe must see every line the reader wrote (none waits in a buffer)
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     bufsize=0, close_fds=True,
                                     preexec_fn=lambda: processes.die_with_parent(signal.SIGKILL))

    def send(self, line: bytes) -> None:
        try:
            self.proc.stdin.write(line)
        except BrokenPipeError:  # it ended: the next line read says why
            pass

    def next_line(self) -> str:
        deadline = time.monotonic() + BLOCK_TIMEOUT_SECS
        while not select.select([self.proc.stdout], [], [], 1.0)[0]:
            if time.monotonic() > deadline:
                raise FeedTimeoutError(f"the TFRecord reader process gave no block for {BLOCK_TIMEOUT_SECS:.0f}s "
                                       "(a stalled filesystem: check the NameNode and DataNodes)")
        return self.proc.stdout.readline().decode("utf-8", "replace").strip()

    def close(self) -> None:
        processes.terminate(self.proc, 2.0, "TFRecord reader")


_idle: list[_Reader] = []
_idle_lock = threading.Lock()


def _close_idle() -> None:
    with _idle_lock:
        while _idle:
            _idle.pop().close()


atexit.register(_close_idle)


def spool_paths(uris, compression: str = "auto"):
    """Yield, for each of ``uris`` in turn (compressed ones are decompressed), paths of local
    TFRecord files holding its records in order; ask for the next only when TensorFlow has read
    the previous one (it is then deleted; so no prefetch of the paths). Raises FeedError for a
    file that ends inside a record, or whatever stopped the reader."""
    directory = tempfile.mkdtemp(prefix="spool-", dir=private.private_dir("spool"))
    with _idle_lock:
        reader = _idle.pop() if _idle else None
    reader = reader if reader is not None and reader.proc.poll() is None else _Reader()
    done = False
    try:
        reader.send(json.dumps({"dir": directory, "compression": compression, "uris": list(uris)}).encode() + b"\n")
        while True:
            kind, _, value = reader.next_line().partition(" ")
            if kind == "END":
                done = True
                return
            if kind != "BLOCK":
                done = kind == "ERROR"  # the reader is fine; the file was not
                raise FeedError(value or f"the TFRecord reader process ended ({reader.proc.poll()}) without a reason")
            yield value
            os.unlink(value)
            reader.send(b"next\n")  # room for one more block
    finally:
        if done and reader.proc.poll() is None:
            with _idle_lock:
                _idle.append(reader)
        else:  # stopped mid-file (the consumer let go) or broken: a fresh reader next time
            reader.close()
        private.remove_tree(directory)


# --------------------------------------------------------------------------- the reader process

def _spool(request: dict, say, wait_for_room) -> None:
    from tfos.data.fs import _resolve
    from tfos.data.tfrecord import _compression_of, _decompressing

    n, credits = 0, AHEAD
    for uri in request["uris"]:
        fs, path, _ = _resolve(uri)
        comp = _compression_of(path) if request["compression"] == "auto" else request["compression"]
        client = getattr(getattr(fs, "handler", None), "client", None)  # hdfs-native: read it without pyarrow's
        with (client.read(path) if client is not None
              else fs.open_input_stream(path, compression=None, buffer_size=0)) as raw:
            stream, carry = _decompressing(raw, comp), b""
            while True:
                block = stream.read(BLOCK)
                if not block:
                    break
                buf = carry + bytes(block) if carry else bytes(block)
                cut = whole_records(buf)
                carry = buf[cut:]
                if not cut:
                    continue
                if credits == 0:
                    wait_for_room()
                    credits += 1
                spooled = os.path.join(request["dir"], f"{n}.tfrecord")
                n += 1
                fd = os.open(spooled, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(memoryview(buf)[:cut])
                credits -= 1
                say(f"BLOCK {spooled}")
            if carry:
                raise FeedError(f"truncated TFRecord in {uri}: {len(carry)} bytes after the last whole record; the "
                                "file is incomplete or not a TFRecord file (wrong compression_type?)")
    say("END")


def main() -> int:
    """The reader's loop: one JSON request per line on stdin, answered with BLOCK lines and END (or
    ERROR); "next" lines on stdin make room for more blocks."""
    out = sys.stdout.buffer

    def say(line: str) -> None:
        out.write(line.encode("utf-8") + b"\n")
        out.flush()

    def wait_for_room() -> None:
        if not sys.stdin.buffer.readline():  # the TF process closed the pipe: stop
            raise SystemExit(0)

    for line in sys.stdin.buffer:
        if line.strip() in (b"", b"next"):  # a late ack of the previous request's last block
            continue
        try:
            _spool(json.loads(line), say, wait_for_room)
        except SystemExit:
            raise
        except BaseException as e:  # the TF process raises it as the dataset's error
            say("ERROR " + f"{type(e).__name__}: {e}".replace("\n", " "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
