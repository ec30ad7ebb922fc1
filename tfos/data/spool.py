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
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading

from tfos.errors import FeedError, FeedTimeoutError
from tfos.host import private, processes
from tfos.host.deadline import Deadline

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


def cut_block(carry: bytes, block) -> tuple[list, bytes]:
    """Pure: given the bytes left over from the previous block (``carry``, a record's head) and the
    next ``block`` read (a memoryview), the buffers that make whole records, to be written in order
    (the carry, then a view of the block: nothing is joined), and the new carry. A record longer
    than the block grows the carry instead."""
    start = 0
    if carry:
        head = carry if len(carry) >= 8 else carry + bytes(block[:8 - len(carry)])
        end = 16 + _LENGTH.unpack_from(head)[0] - len(carry) if len(head) >= 8 else len(block) + 1
        if end > len(block):  # the carried record does not end in this block either
            return [], carry + bytes(block)
        start = end
    cut = start + whole_records(block[start:])
    return [p for p in (carry, block[:cut]) if len(p)], bytes(block[cut:])


class _Reader:
    """One reader process (``python -m tfos.data.spool``), reused by the datasets of this process
    one after another: its start (an interpreter, pyarrow, the HDFS client) is paid once."""

    def __init__(self):
        # unbuffered: select() on the pipe must see every line the reader wrote (none waits in a buffer).
        # Started from a thread that outlives tf.data's generator threads: Linux's parent-death signal
        # follows the starting thread, and a reader started on one died with its iterator (none reused)
        self.proc = processes.popen_dying_with_process([sys.executable, "-m", __name__], signal.SIGKILL,
                                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                                       close_fds=True)

    def send(self, line: bytes) -> None:
        try:
            self.proc.stdin.write(line)
        except BrokenPipeError:  # it ended: the next line read says why
            pass

    def next_line(self) -> str:
        deadline = Deadline(BLOCK_TIMEOUT_SECS)
        while not select.select([self.proc.stdout], [], [], 1.0)[0]:
            if deadline.expired():
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

class _Writer:
    """The reader process's writing thread: it writes each block's file and announces it, while the
    main thread reads the next block from the filesystem (a write's system call runs without the
    GIL, so it overlaps the read even where the client keeps the GIL while it waits)."""

    def __init__(self, say):
        self.say = say
        self.jobs: queue.Queue = queue.Queue(maxsize=1)  # one block waiting: memory stays ~3 blocks
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="tfos-spool-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue
            path, parts = job
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    _write_all(fd, parts)
                finally:
                    os.close(fd)
                self.say(f"BLOCK {path}")
            except BaseException as e:  # the main thread raises it at its next block or at the end
                self.error = e

    def put(self, path: str, parts: list) -> None:
        self._check()
        self.jobs.put((path, parts))

    def finish(self, check: bool = True) -> None:
        self.jobs.put(None)
        self.thread.join()
        if check:
            self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error


def _write_all(fd: int, parts: list) -> None:
    """Write the buffers in ``parts`` to ``fd`` in order (writev; again for what a short write left)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _read_blocks(uri: str, compression: str):
    """The bytes of ``uri`` (decompressed), in blocks of about BLOCK bytes. hdfs:// files come
    through hdfs-native's range stream (:class:`tfos.data.hdfs.SequentialReader`), read directly
    rather than through pyarrow's file wrapper (one copy less per block)."""
    from tfos.data.fs import _resolve
    from tfos.data.hdfs import SequentialReader
    from tfos.data.tfrecord import _compression_of, _decompressing

    fs, path, _ = _resolve(uri)
    comp = _compression_of(path) if compression == "auto" else compression
    client = getattr(getattr(fs, "handler", None), "client", None)  # hdfs-native
    with (SequentialReader(client.read(path)) if client is not None
          else fs.open_input_stream(path, compression=None, buffer_size=0)) as raw:
        stream = _decompressing(raw, comp)
        while True:
            block = stream.read(BLOCK)
            if not block:
                return
            yield block


def _spool(request: dict, say, wait_for_room) -> None:
    n, credits = 0, AHEAD
    writer = _Writer(say)
    try:
        for uri in request["uris"]:
            carry = b""
            for block in _read_blocks(uri, request["compression"]):
                parts, carry = cut_block(carry, memoryview(block))
                if not parts:
                    continue
                if credits == 0:
                    wait_for_room()
                    credits += 1
                writer.put(os.path.join(request["dir"], f"{n}.tfrecord"), parts)
                n += 1
                credits -= 1
            if carry:
                raise FeedError(f"truncated TFRecord in {uri}: {len(carry)} bytes after the last whole record; "
                                "the file is incomplete or not a TFRecord file (wrong compression_type?)")
    except BaseException:
        writer.finish(check=False)  # the first cause is the read's, not a write it stopped
        raise
    writer.finish()
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
