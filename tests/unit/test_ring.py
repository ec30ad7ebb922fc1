"""The shared-memory feed ring (tfos.wire.ring): both ends in one process, as a feed hub and a
feeding task on one host use it; the other user's view of it in a subprocess."""

import gc
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tfos.errors import ProtocolError
from tfos.wire import arrow
from tfos.wire import messages as M
from tfos.wire import ring as R

SLOT = 1 << 20


def _batch(rows=1000, value=1.0):
    return arrow.rows_to_batch([(np.full(64, value, np.float32), i) for i in range(rows)])


def _words(r, slot):
    return R._SLOT_WORDS.unpack_from(r.mm, R._words(slot))


@pytest.fixture
def ring():
    r = R.Ring(slots=3, slot_bytes=SLOT)
    yield r
    r.close()


@pytest.fixture
def writer(ring):
    w = R.RingWriter(ring.offer())
    yield w
    w.forget()


def _send(writer, batch):
    placed = writer.put(arrow.ipc_parts(batch), wait=0.01)
    assert placed is not None
    return M.FeedShm(*placed)


def test_a_chunk_arrives_whole_aligned_and_in_the_rings_memory(ring, writer):
    sent = _batch(1000, 2.5)
    got = ring.read(_send(writer, sent))
    assert got.equals(sent)
    features = arrow.column_to_numpy(got.column(0), got.schema.field(0))
    lo, hi = ring.address, ring.address + ring.size
    address = features.__array_interface__["data"][0]
    assert lo <= address < hi, "the columns are read where the feeding task wrote them (no copy)"
    assert address % 64 == 0, "the body starts 64-byte aligned, so TensorFlow takes it without a copy"


def _rows(rows=1000, value=1.0, label_first=False):
    return [(i, np.full(64, value, np.float32)) if label_first else (np.full(64, value, np.float32), i)
            for i in range(rows)]


@pytest.mark.parametrize("label_first", [False, True])
def test_rows_converted_into_a_staged_slot_are_sent_from_where_they_were_written(ring, writer, label_first):
    rows = _rows(1000, 3.5, label_first)
    batch = arrow.rows_to_batch(rows, alloc=writer.stage)
    column = batch.column(1 if label_first else 0).values.buffers()[1]
    staged = writer.staged
    assert staged is not None and column.address == staged[1], "the ndarray column was stacked into the slot"
    msg = _send(writer, batch)
    assert msg.slot == staged[0], "sent from the slot it was converted in"
    got = ring.read(msg)
    assert got.equals(arrow.rows_to_batch(rows)), "the same chunk as one converted the usual way"
    features = arrow.column_to_numpy(got.column(1 if label_first else 0), got.schema.field(1 if label_first else 0))
    where = ring.address + R.HEADER + msg.slot * SLOT + R.STAGE_AT  # the same place in the hub's mapping
    assert features.__array_interface__["data"][0] == where, "read where it was written: no copy on either side"
    assert writer.staged is None


def test_a_staged_column_that_cannot_stay_in_place_is_copied_and_odd_rows_convert_as_usual(ring, writer):
    # columns ahead of the staged one larger than the room before it: the stream goes to another slot
    wide = [(bytes(80_000), np.full(64, 1.0, np.float32)) for _ in range(4)]
    batch = arrow.rows_to_batch(wide, alloc=writer.stage)
    staged = writer.staged
    msg = _send(writer, batch)
    assert msg.slot != staged[0] and ring.read(msg).equals(arrow.rows_to_batch(wide))
    # a row of another dtype: converted as usual (upcast), the staged memory unused
    mixed = [(np.ones(64, np.float32), 0), (np.ones(64, np.float64), 1)]
    batch = arrow.rows_to_batch(mixed, alloc=writer.stage)
    assert batch.equals(arrow.rows_to_batch(mixed)) and batch.schema.field(0).type.value_type == pa.float64()
    # no free slot: nothing to stage into, converted as usual
    held = [ring.read(_send(writer, _batch())) for _ in range(ring.slots)]
    assert writer.stage(1024, wait=0.01) is None
    del held


def test_a_slot_is_free_once_the_last_buffer_made_from_it_is_gone(ring, writer):
    msg = _send(writer, _batch())
    got = ring.read(msg)
    features = arrow.column_to_numpy(got.column(0), got.schema.field(0))
    del got
    gc.collect()
    assert _words(ring, msg.slot) == (1, 0) and msg.slot in ring.held, "a numpy view still holds it"
    del features
    gc.collect()
    assert _words(ring, msg.slot) == (1, 1) and not ring.held
    again = _send(writer, _batch())
    assert (again.slot, again.seq) == (msg.slot, 2), "the lowest free slot is used again"


def test_a_writer_without_a_free_slot_gives_up_for_the_channel(ring, writer):
    held = [ring.read(_send(writer, _batch())) for _ in range(ring.slots)]
    assert writer.put(arrow.ipc_parts(_batch()), wait=0.02) is None
    assert writer.put(arrow.ipc_parts(_batch(10_000)), wait=0.02) is None, "larger than a slot"
    held.pop()
    gc.collect()
    assert writer.put(arrow.ipc_parts(_batch()), wait=0.02) is not None


@pytest.mark.parametrize("change, why", [
    (dict(slot=3), "slot 3 of a ring of 3"),
    (dict(slot=-1), "slot -1"),
    (dict(seq=2), "out of sequence"),
    (dict(length=SLOT), "outside a slot"),
    (dict(offset=-64), "outside a slot"),
    (dict(slot=1, seq=1), "marked 0, not 1"),
])
def test_malformed_framing_is_refused_and_changes_nothing(ring, writer, change, why):
    msg = _send(writer, _batch())
    bad = M.FeedShm(**{**msg.__dict__, **change})
    with pytest.raises(ProtocolError, match=why):
        ring.read(bad)
    assert ring.seq == [0, 0, 0] and not ring.held
    assert ring.read(msg).num_rows == 1000, "the good frame still reads"


def test_a_held_slot_cannot_be_announced_again(ring, writer):
    msg = _send(writer, _batch())
    kept = ring.read(msg)
    R._SLOT_WORDS.pack_into(ring.mm, R._words(msg.slot), 2, 0)  # a writer that ignored the held slot
    with pytest.raises(ProtocolError, match="held"):
        ring.read(M.FeedShm(msg.slot, 2, msg.offset, msg.length))
    assert kept.num_rows == 1000


def test_a_clean_end_frees_what_a_dead_writer_marked_and_not_what_is_held(ring, writer):
    kept = ring.read(_send(writer, _batch()))
    lost = writer.put(arrow.ipc_parts(_batch()), wait=0.01)  # written, never announced
    ring.reclaim()
    assert _words(ring, lost[0]) == (0, 0)
    assert _words(ring, 0) == (1, 0) and kept.num_rows


def test_the_pool_lends_one_ring_per_connection_and_keeps_clean_ones():
    pool = R.RingPool(max_rings=2, slots=2, slot_bytes=SLOT)
    a, _ = pool.take()
    b, _ = pool.take()
    none, why = pool.take()
    assert none is None and "all 2 rings are lent" in why
    pool.give(a, clean=True)
    pool.give(b, clean=False)
    assert b.fd == -1, "a ring whose connection broke is not lent again"
    again, _ = pool.take()
    assert again is a
    pool.give(again, clean=True)
    pool.close()
    assert a.fd == -1 and pool.take() == (None, "the feed hub is closing")


def test_the_pool_lends_a_ring_the_sender_has_mapped_else_the_last_given_back():
    pool = R.RingPool(max_rings=3, slots=1, slot_bytes=SLOT)
    a, b = pool.take()[0], pool.take()[0]
    pool.give(a, clean=True)
    pool.give(b, clean=True)
    assert pool.take(mapped=("00" * 16, a.token.hex()))[0] is a
    pool.give(a, clean=True)
    assert pool.take()[0] is a, "the last given back: one ring mapped by each worker, not a new one each time"
    pool.close()


def test_an_offer_that_is_not_the_ring_is_refused(ring):
    offer = ring.offer()
    with pytest.raises(ProtocolError, match="token"):
        R.RingWriter(M.FeedRing(offer.pid, offer.fd, "00" * 16, offer.slots, offer.slot_bytes))
    with pytest.raises(ProtocolError, match="size"):
        R.RingWriter(M.FeedRing(offer.pid, offer.fd, offer.token, offer.slots + 1, offer.slot_bytes))
    with pytest.raises(OSError):
        R.RingWriter(M.FeedRing(offer.pid, 9999, offer.token, offer.slots, offer.slot_bytes))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_open_the_ring(ring):
    offer = ring.offer()
    code = (f"import os\ntry:\n    os.open('/proc/{offer.pid}/fd/{offer.fd}', os.O_RDONLY)\n    print('opened')\n"
            "except PermissionError:\n    print('refused')\n")
    # the other user may read every file (CAP_DAC_READ_SEARCH, to run this venv's python); the
    # ring is still not theirs: /proc/<pid>/fd opens only for the process's own user
    other_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
                  "--ambient-caps=+dac_read_search"]
    out = subprocess.run(other_user + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "refused", out


def test_only_this_network_namespaces_addresses_are_local():
    assert R.is_local("127.0.0.1")
    assert not R.is_local("198.51.100.213"), "an address of another host (the harness's range)"


def test_the_ipc_head_is_found_in_the_first_part():
    parts = arrow.ipc_parts(_batch())
    n = R.ipc_head_length(parts[0])
    assert n == len(parts[0]) and n > 0
    assert R.ipc_head_length(b"\xff\xff\xff\xff\x10\x00\x00\x00") == 0
    assert R.ipc_head_length(pa.py_buffer(b"")) == 0
