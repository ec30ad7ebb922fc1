"""Same-host feeding through shared memory: a ring of slots that a TF process's feed hub lends to
one feeding connection at a time (issue 51; docs/design.md, "The feed through shared memory").

The TF process makes each ring (``memfd_create``: anonymous memory, no file another user could
open, not bounded by a pod's small ``/dev/shm``) and offers it on the feeding task's authenticated
channel as ``FeedRing(pid, fd, token)``. The feeding task maps it through ``/proc/<pid>/fd/<fd>``,
which the kernel opens only for a process of the same user (the ptrace read check), and accepts it
only if the file is its own user's and the ring's header holds the offered random token (so a
reused pid or another host's file is never taken). From then on each chunk is written into a free
slot, its Arrow columns where the TF process reads them, and only ``FeedShm(slot, seq, offset,
length)`` travels on the channel. The TF process builds the record batch on the slot's memory
without a copy; the slot is free again when the last Arrow buffer, numpy array or tensor made
from it is gone. Whoever still holds the rows (a queue, tf.data's prefetch, a shuffle buffer)
holds the slot: a writer that finds no free slot soon sends the chunk over the channel instead,
which never waits on memory it cannot see.

Layout: a 4 KiB header (magic, token, slot count and size, then per slot two little-endian u64:
``filled``, bumped by the writer after it wrote the slot, and ``freed``, set by the reader when
the slot's last buffer died), then the slots. The reader is the authority: it accepts a slot only
as the next sequence number of a slot it does not hold, whose ``filled`` says the same, and bounds
offset and length inside the slot; on a clean end of the connection it sets every slot it does
not hold back to free (a writer that died after bumping ``filled`` leaks nothing). A ring whose
connection ended otherwise is not lent again. No encryption inside the host: both processes are
the job's user, who can read either's memory anyway (docs/security.md).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import mmap
import os
import secrets
import socket
import stat
import struct
import threading
import time

import numpy as np
import pyarrow as pa

from tfos.errors import ProtocolError
from tfos.host.deadline import Deadline
from tfos.wire import arrow
from tfos.wire import messages as M
from tfos.wire.channel import ALIGN, IPC_CONTINUATION

logger = logging.getLogger(__name__)

MAGIC = b"TFOSRNG1"
HEADER = 4096
_SLOT_WORDS = struct.Struct("<QQ")  # filled, freed
_FIRST_SLOT_WORD = 64
MAX_SLOTS = (HEADER - _FIRST_SLOT_WORD) // _SLOT_WORDS.size
#: slots per ring: more than a consumer holds in the usual pipeline (the hub's queue of 4 chunks,
#: the one the hub's thread waits to queue, the reader's, and tf.data's prefetch), so a writer
#: is held back by the channel's backpressure before it runs out of slots
SLOTS = 10
#: a slot holds one feed chunk (``feed.executor.producer.TARGET_CHUNK_BYTES``, 16 MiB) and its IPC
#: framing; a larger chunk goes over the channel. Memory is only taken where a slot is written.
SLOT_BYTES = 17 << 20
#: rings one feed hub lends at once (one per feeding connection; more connections use the channel)
MAX_RINGS = 8
#: how long a writer looks for a free slot before it sends the chunk over the channel
SLOT_WAIT = 0.25
#: where in a slot a staged column is converted (:meth:`RingWriter.stage`): room before it for the
#: stream's messages and the buffers of the columns ahead of it
STAGE_AT = 256 << 10


def _words(slot: int) -> int:
    return _FIRST_SLOT_WORD + slot * _SLOT_WORDS.size


def ipc_head_length(first) -> int:
    """Bytes of an Arrow IPC stream before its record batch's body (the schema message and the
    batch's metadata, each a continuation marker, a length and that many bytes), found in ``first``
    (the stream's first part); 0 when they are not both in it."""
    view = memoryview(first).cast("B")
    at = 0
    for _ in range(2):
        if at + 8 > len(view):
            return 0
        marker, length = struct.unpack_from("<Ii", view, at)
        if marker != IPC_CONTINUATION or length < 0 or at + 8 + length > len(view):
            return 0
        at += 8 + length
    return at


# --------------------------------------------------------------------------- the TF process's side

class _Lease:
    """Held by every Arrow buffer made from one filled slot; the slot is free when it is collected."""

    __slots__ = ("ring", "slot", "seq")

    def __init__(self, ring: "Ring", slot: int, seq: int):
        self.ring, self.slot, self.seq = ring, slot, seq

    def __del__(self):
        try:
            self.ring._free(self.slot, self.seq)
        except (ValueError, TypeError, AttributeError):  # the interpreter is ending: nothing to tell
            pass


class Ring:
    """One ring in the TF process: made once, lent to one connection at a time by :class:`RingPool`."""

    def __init__(self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        if not 1 <= slots <= MAX_SLOTS or slot_bytes <= 0 or slot_bytes % mmap.PAGESIZE:
            raise ValueError(f"a ring of {slots} slots of {slot_bytes} bytes")
        self.slots, self.slot_bytes = slots, slot_bytes
        self.size = HEADER + slots * slot_bytes
        self.token = secrets.token_bytes(16)
        self.fd = os.memfd_create("tfos-feed-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._anchor = ctypes.c_char.from_buffer(self.mm)  # holds the mapping while its address is in use
        self.address = ctypes.addressof(self._anchor)
        self.mm[:len(MAGIC)] = MAGIC
        self.mm[8:24] = self.token
        struct.pack_into("<IIQ", self.mm, 24, slots, 0, slot_bytes)
        self.seq = [0] * slots  # the last sequence number the reader accepted per slot
        self.held: set[int] = set()

    def offer(self) -> M.FeedRing:
        return M.FeedRing(os.getpid(), self.fd, self.token.hex(), self.slots, self.slot_bytes)

    def read(self, msg: "M.FeedShm"):
        """The record batch that ``msg`` says was written, built on the slot's memory (no copy).
        ProtocolError, and nothing changed, for a slot out of range, held, out of sequence, not
        marked filled, or bounds outside it; the stream's own checks are :func:`arrow.from_ipc`'s."""
        slot, seq = msg.slot, msg.seq
        if not 0 <= slot < self.slots:
            raise ProtocolError(f"FeedShm: slot {slot} of a ring of {self.slots}")
        if slot in self.held or seq != self.seq[slot] + 1:
            raise ProtocolError(f"FeedShm: slot {slot} is held or {seq} is out of sequence")
        filled, _freed = _SLOT_WORDS.unpack_from(self.mm, _words(slot))
        if filled != seq:
            raise ProtocolError(f"FeedShm: slot {slot} is marked {filled}, not {seq}")
        if msg.offset < 0 or msg.length <= 0 or msg.offset + msg.length > self.slot_bytes:
            raise ProtocolError(f"FeedShm: {msg.length} bytes at {msg.offset} outside a slot of {self.slot_bytes}")
        self.seq[slot] = seq
        self.held.add(slot)
        start = self.address + HEADER + slot * self.slot_bytes + msg.offset
        return arrow.from_ipc(pa.foreign_buffer(start, msg.length, base=_Lease(self, slot, seq)))

    def _free(self, slot: int, seq: int) -> None:
        if self.seq[slot] == seq:
            self.held.discard(slot)
            struct.pack_into("<Q", self.mm, _words(slot) + 8, seq)

    def reclaim(self) -> None:
        """After a clean end of its connection: every slot not held is free, whatever its writer marked."""
        for slot in range(self.slots):
            if slot not in self.held:
                _SLOT_WORDS.pack_into(self.mm, _words(slot), self.seq[slot], self.seq[slot])

    def close(self) -> None:
        """Close the file; the memory goes when the last buffer made from it (and every writer's
        mapping) is gone."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RingPool:
    """A feed hub's rings: lent one per feeding connection, at most ``max_rings`` at once, kept for
    the next connection when one ends cleanly (its pages stay mapped: no fresh memory per chunk)."""

    def __init__(self, max_rings: int = MAX_RINGS, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        self.max_rings, self.slots, self.slot_bytes = max_rings, slots, slot_bytes
        self._idle: collections.deque = collections.deque()
        self._lent = 0
        self._lock = threading.Lock()
        self._closed = False

    def take(self, mapped=()) -> tuple[Ring | None, str]:
        """A ring for one connection, or None and why not: one whose token is in ``mapped`` (the
        rings the sender's worker has mapped already) if one is idle, else the last one given back
        (the fewest distinct rings, each mapped once per worker)."""
        with self._lock:
            if self._closed:
                return None, "the feed hub is closing"
            if self._lent >= self.max_rings:
                return None, f"all {self.max_rings} rings are lent"
            mapped = mapped[:KEEP_MAPPINGS]  # a sender maps no more than that many
            ring = next((r for r in self._idle if r.token.hex() in mapped), None)
            if ring is not None:
                self._idle.remove(ring)
            elif self._idle:
                ring = self._idle.pop()
            self._lent += 1
        if ring is None:
            try:
                ring = Ring(self.slots, self.slot_bytes)
            except (OSError, ValueError, AttributeError) as e:  # AttributeError: no memfd_create here
                with self._lock:
                    self._lent -= 1
                return None, f"no shared memory ring: {e}"
        return ring, ""

    def give(self, ring: Ring, clean: bool) -> None:
        """``ring``'s connection ended: kept for the next if it ended cleanly, else closed."""
        if clean:
            ring.reclaim()
        with self._lock:
            self._lent -= 1
            if clean and not self._closed:
                self._idle.append(ring)
                return
        ring.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
        for ring in idle:
            ring.close()


# --------------------------------------------------------------------------- the feeding task's side

#: mappings a feeding task's Python worker keeps (Spark reuses workers; a worker names the rings it
#: has mapped in its ``FeedBegin`` and the hub lends one of them when it is idle): a new mapping
#: costs a page fault per 4 KiB page it touches, 5 times the copy of a chunk
KEEP_MAPPINGS = 8
#: ``madvise``'s MADV_POPULATE_WRITE (Linux 5.14): a slot's pages mapped in one call where a new
#: mapping first writes it, a quarter of what faulting them in one by one costs
_MADV_POPULATE_WRITE = 23
_mappings: collections.OrderedDict = collections.OrderedDict()
_mappings_lock = threading.Lock()


def is_local(host: str) -> bool:
    """Whether ``host`` is an address of this network namespace (a socket can be bound to it): the
    TF process behind it is on this host. Another host of the multi-host harness, which shares
    this machine's files and pids but not its network namespace, is not."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


class RingWriter:
    """A feeding connection's view of the ring a hub lent it."""

    def __init__(self, offer: M.FeedRing):
        self.slots, self.slot_bytes = offer.slots, offer.slot_bytes
        self.key = (offer.pid, offer.fd, offer.token)
        self.mm, self.populated = _mapping(offer)
        self.view = memoryview(self.mm)
        self.staged: tuple[int, int] | None = None  # (slot, address) of the column :meth:`stage` lent

    def stage(self, nbytes: int, wait: float = SLOT_WAIT):
        """Writable memory for a column of ``nbytes`` at STAGE_AT in a free slot, to convert the
        next chunk's rows straight into (a numpy uint8 array; None when no slot is free within
        ``wait`` or the column does not fit). The next :meth:`put` sends the chunk from that slot
        without copying the column if its stream can be laid out around it; a later ``stage``
        gives the slot up."""
        self.staged = None
        if nbytes <= 0 or STAGE_AT + nbytes > self.slot_bytes:
            return None
        slot = self._free_slot(wait)
        if slot is None:
            return None
        self._populate(slot)
        out = np.frombuffer(self.mm, np.uint8, nbytes, HEADER + slot * self.slot_bytes + STAGE_AT)
        self.staged = (slot, out.ctypes.data)
        return out

    def put(self, parts, wait: float = SLOT_WAIT) -> tuple[int, int, int, int] | None:
        """Write one Arrow IPC stream (``parts``, as :func:`arrow.ipc_parts` gives them) into a free
        slot, its body 64-byte aligned: ``(slot, seq, offset, length)`` to send as ``FeedShm``;
        None when it does not fit a slot or no slot came free within ``wait`` seconds. A column
        converted into the staged slot stays where it is and the rest is written around it."""
        n = sum(memoryview(p).nbytes for p in parts)
        staged, self.staged = self.staged, None
        if staged is not None:
            placed = self._put_around(parts, n, *staged)
            if placed is not None:
                return placed
        offset = -ipc_head_length(parts[0]) % ALIGN
        if offset + n > self.slot_bytes:
            return None
        # never the staged slot: the chunk's column may be read from there
        slot = self._free_slot(wait, skip=staged[0] if staged is not None else -1)
        if slot is None:
            return None
        self._populate(slot)
        self._write(parts, HEADER + slot * self.slot_bytes + offset)
        return self._filled(slot, offset, n)

    def _put_around(self, parts, n: int, slot: int, address: int) -> tuple[int, int, int, int] | None:
        """The stream laid out in ``slot`` so that its part at ``address`` (the staged column)
        stays in place, with the body 64-byte aligned; None when it cannot be."""
        pos = 0
        for k, p in enumerate(parts):
            if isinstance(p, pa.Buffer) and p.address == address:
                break
            pos += memoryview(p).nbytes
        else:
            return None
        offset = STAGE_AT - pos
        if offset < 0 or (offset + ipc_head_length(parts[0])) % ALIGN or offset + n > self.slot_bytes:
            return None
        self._write(parts, HEADER + slot * self.slot_bytes + offset, keep=k)
        return self._filled(slot, offset, n)

    def _write(self, parts, at: int, keep: int = -1) -> None:
        for j, p in enumerate(parts):
            src = memoryview(p).cast("B")
            if j != keep:
                self.view[at:at + len(src)] = src
            at += len(src)

    def _filled(self, slot: int, offset: int, n: int) -> tuple[int, int, int, int]:
        seq = _SLOT_WORDS.unpack_from(self.mm, _words(slot))[0] + 1
        struct.pack_into("<Q", self.mm, _words(slot), seq)
        return slot, seq, offset, n

    def _populate(self, slot: int) -> None:
        if slot not in self.populated:
            self.populated.add(slot)
            try:
                self.mm.madvise(_MADV_POPULATE_WRITE, HEADER + slot * self.slot_bytes, self.slot_bytes)
            except OSError:  # an older kernel: the pages fault in as they are written
                pass

    def _free_slot(self, wait: float, skip: int = -1) -> int | None:
        deadline = Deadline(wait)
        pause = 0.0005
        while True:
            for slot in range(self.slots):  # the lowest free slot: the fewest pages ever touched
                filled, freed = _SLOT_WORDS.unpack_from(self.mm, _words(slot))
                if filled == freed and slot != skip:
                    return slot
            if deadline.expired():
                return None
            time.sleep(deadline.slice(pause))
            pause = min(pause * 2, 0.01)

    def close(self) -> None:
        """The connection ended: the mapping stays cached for the next partition."""
        self.view.release()

    def forget(self) -> None:
        """The connection failed: drop the cached mapping (the hub will not lend this ring again)."""
        self.view.release()
        with _mappings_lock:
            entry = _mappings.pop(self.key, None)
        if entry is not None:
            _close_quietly(entry[0])


def _close_quietly(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # a view of it is still in use: it goes with that view
        pass


def mapped_tokens() -> tuple[str, ...]:
    """The tokens of the rings this worker has mapped (sent in ``FeedBegin``)."""
    with _mappings_lock:
        return tuple(token for _pid, _fd, token in _mappings)


def _mapping(offer: M.FeedRing) -> tuple[mmap.mmap, set]:
    """The ring's memory, mapped once per worker, and the slots written through this mapping;
    OSError/ProtocolError when it is not the ring offered."""
    key = (offer.pid, offer.fd, offer.token)
    with _mappings_lock:
        entry = _mappings.get(key)
        if entry is not None:
            _mappings.move_to_end(key)
            return entry
    size = HEADER + offer.slots * offer.slot_bytes
    if not 1 <= offer.slots <= MAX_SLOTS or offer.slot_bytes <= 0:
        raise ProtocolError(f"FeedRing of {offer.slots} slots of {offer.slot_bytes} bytes")
    fd = os.open(f"/proc/{int(offer.pid)}/fd/{int(offer.fd)}", os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != size:
            raise ProtocolError("the offered ring is not this user's memory of the size offered")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    if mm[:8] != MAGIC or mm[8:24].hex() != offer.token:
        _close_quietly(mm)
        raise ProtocolError("the offered ring does not hold its token (another process's or host's file)")
    with _mappings_lock:
        entry = _mappings[key] = (mm, set())
        while len(_mappings) > KEEP_MAPPINGS:
            _close_quietly(_mappings.popitem(last=False)[1][0])
    return entry
