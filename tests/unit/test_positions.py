"""Feed positions (tfos.data.positions, tfos.feed.driver.resume): the row-range algebra from
tables, and where a restarted feed resumes given what each rank reported at its checkpoints."""

import pytest

from tfos.cluster.driver.registry import NodeRegistry
from tfos.data import positions as P
from tfos.errors import ProtocolError
from tfos.feed.driver.resume import FeedPositions, FeedResume
from tfos.feed.executor.producer import Positioned
from tfos.wire import arrow
from tfos.wire import messages as M


@pytest.mark.parametrize("start,end,skip,expected", [
    (0, 10, [], [(0, 10)]),
    (0, 10, [(0, 10)], []),
    (0, 10, [(2, 4), (6, 7)], [(0, 2), (4, 6), (7, 10)]),
    (5, 15, [(0, 6), (14, 20)], [(6, 14)]),
    (100, 200, [(0, 50), (250, 300)], [(100, 200)]),
    (0, 10, [(10, 20)], [(0, 10)]),  # half-open: row 10 is not in [0, 10)
    (3, 3, [], []),
])
def test_subtract(start, end, skip, expected):
    assert P.subtract(start, end, skip) == expected


@pytest.mark.parametrize("lists,expected", [
    ([[(0, 5)], [(5, 9)]], [(0, 9)]),
    ([[(0, 5), (10, 12)], [(3, 11)]], [(0, 12)]),
    ([[(4, 6)], [(0, 1)], []], [(0, 1), (4, 6)]),
    ([[(2, 2)]], []),
])
def test_union(lists, expected):
    assert P.union(*lists) == expected


def test_add_merges_in_order_and_out_of_order():
    ranges = []
    for s, e in ((0, 10), (10, 20), (30, 40), (20, 25), (25, 30)):
        P.add(ranges, s, e)
    assert ranges == [(0, 40)]


def test_wire_round_trip_and_merge():
    a = {}
    P.record(a, 0, 1, 0, 100)
    P.record(a, 0, 1, 100, 50)
    P.record(a, 1, 0, 7, 3)
    assert P.to_wire(a) == ((0, 1, 0, 150), (1, 0, 7, 10))
    assert P.from_wire(P.to_wire(a)) == a
    b = P.from_wire([(0, 1, 150, 200), (0, 2, 0, 5)])
    assert P.merge(a, b) == {(0, 1): [(0, 200)], (0, 2): [(0, 5)], (1, 0): [(7, 10)]}
    assert P.of_epoch(P.merge(a, b), 0) == {1: [(0, 200)], 2: [(0, 5)]}


@pytest.mark.parametrize("trained,sizes,epochs,expected", [
    ({}, {}, 3, 0),
    ({(0, 0): [(0, 100)]}, {0: 100}, 3, 1),  # epoch 0 trained in full
    ({(0, 0): [(0, 99)]}, {0: 100}, 3, 0),
    ({(0, 0): [(0, 100)]}, {}, 3, 0),  # its size unknown (its feed never completed): fed again, skipping
    ({(0, 0): [(0, 60)], (0, 1): [(0, 40)], (1, 0): [(0, 10)]}, {0: 100}, 3, 1),
    ({(0, 0): [(0, 100)], (1, 0): [(0, 100)]}, {0: 100, 1: 100}, 2, 2),  # all trained
])
def test_resume_starts_at_the_first_epoch_not_trained_in_full(trained, sizes, epochs, expected):
    assert P.resume(trained, sizes, epochs) == expected


def test_positioned_chunks_leave_out_the_skipped_rows_and_say_where_each_piece_starts():
    chunks = [arrow.rows_to_batch([(i,) for i in range(k, k + 10)], 0, k) for k in (0, 10, 20)]
    got = Positioned(chunks, [(3, 5), (9, 21)])
    pieces = [(at, [r[0] for r in arrow.batch_to_rows(b)]) for at, b in got]
    assert pieces == [(0, [0, 1, 2]), (5, [5, 6, 7, 8]), (21, list(range(21, 30)))]
    assert got.rows == 30  # the partition's rows, skipped ones included


# --------------------------------------------------------------------------- where a restart resumes

@pytest.fixture
def store():
    return FeedPositions(NodeRegistry("c", [("chief", 0), ("worker", 0), ("worker", 1)]))


def report(store, node, feed_id, step, *ranges):
    return store.on_position(M.FeedPosition("c", node, feed_id, step, tuple(ranges)))


def test_a_rank_that_ended_before_reporting_its_save_resumes_from_every_ranks_last_position(store):
    resume = FeedResume(2, store)
    resume.begin("f1", (0, 1))
    report(store, 0, "f1", 10, (0, 0, 0, 320))
    report(store, 1, "f1", 10, (0, 1, 0, 320))
    report(store, 0, "f1", 20, (0, 0, 0, 640))  # rank 1 saved at 20 too but ended before it reported
    assert store.latest("f1") == 20 and store.newest_complete("f1", (0, 1)) == 10
    text = resume.restarted(during_feed=True)
    # the program resumes from 20 (or 10): skipping what step 10 had trained drops no row
    assert "step 10" in text and resume.first == 0 and resume.tracked
    assert resume.skip(0) == {0: [(0, 320)], 1: [(0, 320)]}


def test_a_checkpoint_no_step_of_which_every_rank_reported_falls_back_to_the_whole_epoch(store):
    resume = FeedResume(2, store)
    resume.begin("f1", (0, 1))
    report(store, 0, "f1", 10, (0, 0, 0, 320))
    report(store, 1, "f1", 20, (0, 1, 0, 640))
    assert store.newest_complete("f1", (0, 1)) is None
    assert "in full" in resume.restarted(during_feed=True)
    assert resume.first == 0 and not resume.tracked and resume.trained == {}


def test_positions_at_the_checkpoint_skip_what_it_trained_on_across_two_restarts(store):
    resume = FeedResume(2, store)
    resume.begin("f1", (0, 1))
    resume.epoch_fed(0, 1000, 1000)  # epoch 0 fed in full; epoch 1 was feeding when the cluster restarted
    report(store, 0, "f1", 40, (0, 0, 0, 500), (1, 0, 0, 140))
    report(store, 1, "f1", 40, (0, 1, 0, 500), (1, 1, 0, 140))
    assert "epoch 2 of 2 without the 280 rows" in resume.restarted(during_feed=True)
    assert resume.first == 1 and resume.skip(1) == {0: [(0, 140)], 1: [(0, 140)]}
    # the next attempt, at 3 nodes, saves nothing before it restarts: the same checkpoint again
    resume.begin("f2", (0, 1, 2))
    assert resume.restarted(during_feed=True).startswith("the new attempt resumes")
    assert resume.first == 1 and resume.skip(1) == {0: [(0, 140)], 1: [(0, 140)]}
    # the one after saves once every rank reported: its rows join the checkpoint's
    resume.begin("f3", (0, 1, 2))
    for node, ranges in ((0, (1, 0, 140, 200)), (1, (1, 1, 140, 160)), (2, (1, 0, 200, 220))):
        report(store, node, "f3", 50, ranges)
    resume.restarted(during_feed=True)
    assert resume.skip(1) == {0: [(0, 220)], 1: [(0, 160)]}
    assert resume.ready(50) and not resume.ready(60)


def test_without_positions_the_interrupted_epoch_is_fed_again_in_full(store):
    resume = FeedResume(3, store)
    resume.begin("f1", (0, 1))
    resume.epoch_fed(0, 100, 100)
    assert resume.ready(7)  # the program reports none: planned restarts need not wait
    assert "in full" in resume.restarted(during_feed=True) and resume.first == 1
    resume.begin("f2", (0, 1))
    resume.epoch_fed(1, 100, 100)
    resume.epoch_fed(2, 100, 100)
    resume.restarted(during_feed=False)  # after the last rows were handed over: that epoch again
    assert resume.first == 2 and resume.fed == 300


def test_malformed_positions_are_refused_and_change_nothing(store):
    reply = report(store, 0, "f1", -1, (0, 0, 0, 5))
    assert isinstance(reply, M.ErrorReply) and "step" in reply.message
    reply = report(store, 0, "f1", 3, (0, 0, -5, 5))
    assert isinstance(reply, M.ErrorReply)
    with pytest.raises(ProtocolError):
        report(store, 9, "f1", 3, (0, 0, 0, 5))  # no such node: the control service answers with an error
    assert not store.reported("f1")
