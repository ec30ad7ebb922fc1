"""Equal steps on every rank (tfos.data.uneven): the policy's decisions from a table, the driver's
gate, and the whole InputMode.SPARK data path in one process - the real control service, feed
scheduler, feeding-task code, feed hubs and DataFeeds over authenticated TCP - with a barrier per
step standing in for a collective: a rank that runs one step more than another breaks it."""

import threading
import time

import numpy as np
import pytest

from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.errors import ConfigError, FeedError, NonRetryable, UnevenDataError
from tfos.data import uneven as U
from tfos.feed.driver.scheduler import FeedScheduler, safe_rows
from tfos.feed.executor.producer import make_train_feeder
from tfos.host import private
from tfos.feed.node.datafeed import DataFeed
from tfos.feed.node.hub import FeedHub
from tfos.wire import channel as C
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient, end_feed


@pytest.mark.parametrize("policy,batch,fed,real,own,totals,expected", [
    # drop: ceil(fewest / batch) steps; the last one partial on the fewest rank, full elsewhere
    ("drop", 100, 900, 900, 1000, {0: 1000, 1: 950}, (100, 0)),
    ("drop", 100, 1000, 1000, 1000, {0: 1000, 1: 950}, (0, 0)),
    ("drop", 100, 900, 900, 950, {0: 1000, 1: 950}, (50, 0)),
    ("drop", 100, 1000, 1000, 1200, {0: 1200, 1: 950}, (0, 0)),  # 200 dropped
    ("drop", 100, 0, 0, 30, {0: 30, 1: 0}, (0, 0)),  # a rank with no rows: no step for anyone
    ("drop", 64, 0, 0, 10, {0: 10}, (10, 0)),  # one rank: its partial batch, nothing dropped
    # pad: ceil(most / batch) full batches, padding with weight 0
    ("pad", 100, 900, 900, 950, {0: 1000, 1: 950}, (50, 50)),
    ("pad", 100, 900, 900, 1000, {0: 1000, 1: 950}, (100, 0)),
    ("pad", 100, 1000, 950, 950, {0: 1000, 1: 950}, (0, 0)),
    ("pad", 100, 1000, 1000, 1050, {0: 1050, 1: 950}, (50, 50)),
    ("pad", 100, 1000, 950, 950, {0: 1050, 1: 950}, (0, 100)),  # a whole batch of padding
    ("pad", 100, 1100, 950, 950, {0: 1050, 1: 950}, (0, 0)),
    # error: equal step counts go through untouched; unequal ones raise (below) only where the ranks part
    ("error", 100, 900, 900, 950, {0: 1000, 1: 950}, (50, 0)),
    ("error", 100, 1000, 1000, 1000, {0: 1000, 1: 950}, (0, 0)),
    ("error", 100, 300, 300, 1150, {0: 1150, 1: 1000}, (100, 0)),  # the feed completed while this rank was early
    ("error", 100, 900, 900, 1150, {0: 1150, 1: 1000}, (100, 0)),
])
def test_next_batch_decisions(policy, batch, fed, real, own, totals, expected):
    assert U.next_batch(policy, batch, fed, real, own, totals) == expected


@pytest.mark.parametrize("policy,batch,totals,match", [
    ("error", 100, {0: 1050, 1: 950}, r"node 0: 1050 rows = 11 steps, node 1: 950 rows = 10 steps.*uneven='drop'"),
    ("pad", 100, {0: 30, 1: 0}, r"node\(s\) 1 got no rows.*uneven='pad'"),
    ("error", None, {0: 30, 1: 0}, r"node 0: 30 rows, node 1: 0 rows"),
])
def test_policies_that_cannot_give_equal_steps_raise_naming_every_rank(policy, batch, totals, match):
    with pytest.raises(UnevenDataError, match=match):
        U.check_totals(policy, totals, batch)
    assert issubclass(UnevenDataError, FeedError) and issubclass(UnevenDataError, NonRetryable)  # never retried


@pytest.mark.parametrize("policy,real,totals", [("error", 1000, {0: 1150, 1: 1000}), ("error", 901, {0: 1150, 1: 1000}),
                                                 ("pad", 0, {0: 30, 1: 0})])
def test_next_batch_raises_where_the_ranks_would_part(policy, real, totals):
    with pytest.raises(UnevenDataError):
        U.next_batch(policy, 100, real, real, totals[0], totals)


def test_policy_names_are_checked():
    assert U.check_policy(None) == "" and U.check_policy("pad") == "pad"
    with pytest.raises(ConfigError, match="uneven must be one of 'drop', 'pad', 'error' or None"):
        U.check_policy("truncate")


def test_rows_sent_to_level_that_come_after_the_end_and_the_shutdown_are_still_read(monkeypatch):
    """The levelled rows may reach a node after the driver's end marker and even after the
    shutdown's (shutdown() right after train()): the node reads them before it ends."""
    send = FeedHub.send_rows

    def late(self, *args):
        threading.Timer(0.5, send, (self, *args)).start()

    monkeypatch.setattr(FeedHub, "send_rows", late)
    fp = FeedPath(2)
    try:
        barrier = threading.Barrier(2, timeout=15)
        results, errors, levelled = fp.run(_partitions([60] * 5), _steps_with_a_collective(
            barrier, lambda f: f.batches(50)), shutdown=True)
        sent = fp.sent
    finally:
        fp.close()
    assert not errors, errors
    assert sorted(sent.values()) == [120, 180] and levelled == {0: 150, 1: 150}
    assert [sizes for sizes, _ in results.values()] == [[50, 50, 50]] * 2
    assert sorted(v for _s, vs in results.values() for v in vs) == list(range(300))


def test_an_inference_that_starts_while_levelled_rows_are_on_their_way_is_answered(monkeypatch):
    """train() returns once every node has its rows queued, so inference rows may reach a node
    before the rows another node sends it to level the shares: the train reader takes the
    levelled rows and ends, and leaves every inference row (and each partition's end) to the
    inference reader."""
    from tfos.feed.executor.producer import make_inference_feeder

    send = FeedHub.send_rows
    monkeypatch.setattr(FeedHub, "send_rows", lambda self, *a: threading.Timer(1.0, send, (self, *a)).start())
    fp = FeedPath(2)
    answers, failures = {}, []

    def infer(train_cfg):  # 4 partitions of 10 rows, two per node, all at once
        cfg = M.FeedConfig("c", train_cfg.key, "127.0.0.1", train_cfg.driver_port, "inf", "input", 10.0,
                           train_cfg.feed_nodes, train_cfg.feed_addresses)
        feeder = make_inference_feeder(cfg, False)

        def task(p):
            try:
                answers[p] = list(feeder(p, iter([(1000 + 10 * p + k, 0.0) for k in range(10)])))
            except BaseException as e:  # the test reads them
                failures.append((p, e))
        tasks = [threading.Thread(target=task, args=(p,), daemon=True) for p in range(4)]
        for t in tasks:
            t.start()
        for t in tasks:
            t.join(20)

    def consume(rank, feed):
        trained = _steps_with_a_collective(barrier, lambda f: f.batches(50))(rank, feed)
        answering = DataFeed(fp.hubs[rank], train_mode=False)
        for ids, _value in answering.batches(64):
            answering.batch_results(ids * 2)
        return trained

    try:
        barrier = threading.Barrier(2, timeout=15)
        results, errors, levelled = fp.run(_partitions([60] * 5), consume, shutdown=True, then=infer)
    finally:
        fp.close()
    assert not errors and not failures and not fp.task_errors, (errors, failures, fp.task_errors)
    assert levelled == {0: 150, 1: 150} and [sizes for sizes, _ in results.values()] == [[50, 50, 50]] * 2
    assert {p: [int(a) for a in got] for p, got in answers.items()} == {
        p: [2 * (1000 + 10 * p + k) for k in range(10)] for p in range(4)}


@pytest.mark.parametrize("totals,moves", [
    ({0: 10, 1: 10}, ()),
    ({0: 11, 1: 10}, ()),  # within one row: level
    ({0: 12, 1: 10}, ((0, 1, 1),)),
    ({0: 11048, 1: 8952}, ((0, 1, 1048),)),  # the two hosts
    ({0: 0, 1: 0, 2: 9}, ((2, 0, 3), (2, 1, 3))),
    ({0: 5, 1: 9, 2: 0, 3: 6}, ((1, 2, 4), (3, 2, 1))),  # 20 rows: 5 each
    ({0: 7, 1: 0, 2: 0}, ((0, 1, 2), (0, 2, 2))),  # the node with the most keeps the odd row
])
def test_level_table(totals, moves):
    assert U.level(totals) == moves
    after = U.after_moves(totals, moves)
    assert max(after.values()) - min(after.values()) <= 1 and sum(after.values()) == sum(totals.values())


@pytest.mark.parametrize("live,counts,expected", [
    ([0, 1], {0: 300, 1: 200}, 200), ([0], {0: 300, 1: 200}, 300), ([], {0: 5}, 0), ([0, 1], {0: 7}, 0)])
def test_safe_rows_is_the_fewest_rows_of_a_live_node(live, counts, expected):
    assert safe_rows(live, counts) == expected


def test_the_gate_answers_when_the_other_node_has_rows_or_the_feed_is_complete():
    reg = NodeRegistry("c", [("chief", 0), ("worker", 0)])
    sched = FeedScheduler(reg, [0, 1])
    assert sched.on_assign(M.AssignChunk("c", "f", 100)).node_index == 0
    t0 = time.monotonic()
    assert sched.on_gate(M.FeedGate("c", 0, "f", 100, wait=0.3)) == M.FeedGateReply(0)  # node 1 has none yet
    assert time.monotonic() - t0 >= 0.25
    threading.Timer(0.2, lambda: sched.on_assign(M.AssignChunk("c", "f", 150))).start()
    reply = sched.on_gate(M.FeedGate("c", 0, "f", 100, wait=5))  # woken by the assignment, not the deadline
    assert reply == M.FeedGateReply(100) and time.monotonic() - t0 < 2
    assert sched.take_rows("f") == {0: 100, 1: 150}
    assert sched.on_gate(M.FeedGate("c", 1, "f", 400)) == M.FeedGateReply(100, True, ((0, 100), (1, 150)), 150)


def test_an_assignment_wakes_only_the_gates_whose_need_its_safe_count_meets():
    """With hundreds of nodes at the gate, each assignment used to wake every one of them."""
    reg = NodeRegistry("c", [("worker", i) for i in range(3)])
    sched = FeedScheduler(reg, [0, 1, 2])
    answers = {}

    def gate(node, need):
        answers[node] = sched.on_gate(M.FeedGate("c", node, "f", need, wait=8))

    waiters = [threading.Thread(target=gate, args=(node, need)) for node, need in ((0, 100), (1, 200))]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 5
    while len(sched._gates.get("f", [])) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    needs = sorted(need for need, _, _ in sched._gates["f"])
    assert needs == [100, 200]
    for rows in (100, 100, 100):  # safe 100: the need of 100 is met, the need of 200 waits on
        sched.on_assign(M.AssignChunk("c", "f", rows))
    waiters[0].join(2)
    assert answers == {0: M.FeedGateReply(100)} and [n for n, _, _ in sched._gates["f"]] == [200]
    sched.take_rows("f")  # the feed is complete: every gate of it learns the totals at once
    waiters[1].join(2)
    assert answers[1].complete and "f" not in sched._gates


def test_the_live_nodes_are_kept_until_a_node_registers_ends_or_terminates():
    reg = NodeRegistry("c", [("worker", i) for i in range(3)])
    sched = FeedScheduler(reg, [0, 1, 2])
    for i in range(3):
        reg.on_register(M.RegisterNode("c", M.NodeInfo(i, "worker", i, "ab"[i // 2], 0, 1000 + i, 0)))
    with sched._lock:
        assert sched._live() == ([0, 1, 2], {"a": (0, 1), "b": (2,)})
        kept = sched._kept
        assert sched._live() and sched._kept is kept  # nothing changed: not recomputed
    reg.on_node_exited(M.NodeExited("c", 1, 0, "", "", "", False))
    sched.on_terminated(M.FeedTerminated("c", 2, "q"))
    with sched._lock:
        assert sched._live()[0] == [0]
    assert sched.on_assign(M.AssignChunk("c", "f", 10, host="b")).pieces == ((0, 10),)


def test_each_assignment_carries_the_safe_count_after_it():
    reg = NodeRegistry("c", [("chief", 0), ("worker", 0)])
    sched = FeedScheduler(reg, [0, 1])
    replies = [sched.on_assign(M.AssignChunk("c", "f", rows)) for rows in (100, 150, 100, 30)]
    assert [(r.pieces, r.safe) for r in replies] == [(((0, 100),), 0), (((1, 150),), 100), (((0, 100),), 150),
                                                     (((1, 30),), 180)]


@pytest.mark.parametrize("announced", [True, False])
def test_partitions_that_send_nothing_still_bring_the_last_wave(announced):
    """Nodes 0 and 1 on hosts a and b; 8 partitions, the first six with nothing to send (every row
    trained on already: a resumed feed skips them). Each says so with a 0-row assignment, so the
    last partition, on host a, levels the shares; counted as never started, its chunks would all
    go to node 0 (run ahead on its own host), whose gate then waits for node 1's rows forever."""
    reg = NodeRegistry("c", [("chief", 0), ("worker", 0)])
    for i, host in enumerate(("a", "b")):
        reg.on_register(M.RegisterNode("c", M.NodeInfo(i, *reg.roles[i], host, 0, 1000 + i, 0)))
    sched = FeedScheduler(reg, [0, 1])
    sched.partitions["f"] = 8
    if announced:
        for p in range(6):
            sched.on_assign(M.AssignChunk("c", "f", 0, partition=p, host="b"))
    sched.on_assign(M.AssignChunk("c", "f", 256, partition=6, host="b"))
    for k in range(8):  # the last partition's chunks, on host a
        sched.on_assign(M.AssignChunk("c", "f", 256, partition=7 if k == 0 else -1, host="a"))
    counts = sched.take_rows("f")
    if announced:
        assert abs(counts[0] - counts[1]) <= 128, counts  # levelled by the last wave
    else:
        assert counts[0] - counts[1] > 1000, counts  # why the feeding task announces an empty partition


def test_the_hub_keeps_the_highest_safe_count_and_refuses_it_outside_a_gated_feed():
    secret = C.new_key()
    hub = FeedHub(secret).start()
    try:
        def feed(uneven, *safes):
            ch = C.Channel.connect("127.0.0.1", hub.port, secret, timeout=10)
            ch.settimeout(10)
            ch.send(M.FeedBegin("f", "input", 0, True, uneven, 2))
            for s in safes:
                ch.send(M.FeedSafe(s))
            ch.send(M.FeedPartitionEnd(0))
            reply = ch.recv()
            ch.close()
            return reply

        assert feed("drop", 500, 300) == M.FeedAck(0)
        assert hub.queue("input").safe == {"f": 500}
        for uneven, safe in (("", 900), ("drop", -1)):
            reply = feed(uneven, safe)
            assert isinstance(reply, M.ErrorReply) and "FeedSafe" in reply.message
            assert hub.queue("input").safe == {"f": 500}
    finally:
        hub.close()


# --------------------------------------------------------------------------- the data path in one process

class FeedPath:
    """A control service, a feed scheduler and ``n`` feed hubs on loopback, fed by the feeding
    tasks' own code; ``run(partitions, consume)`` feeds once and runs ``consume(rank, feed)`` per rank."""

    def __init__(self, n: int, queue_chunks: int = 4):
        self.key = C.new_key()
        private.store_cluster_secret("c", self.key.secret)  # as a node on this host leaves it for feeding tasks
        self.n = n
        self.registry = NodeRegistry("c", [("chief", 0)] + [("worker", i) for i in range(n - 1)])
        self.scheduler = FeedScheduler(self.registry, list(range(n)))
        self.service = ControlService(self.registry, self.scheduler.handlers(), self.key, "127.0.0.1").start()
        self.hubs = [FeedHub(self.key, queue_chunks, gate_client=lambda i=i: DriverClient(
            "127.0.0.1", self.service.port, self.key, "c", i)).start() for i in range(n)]
        for i, (job, idx) in enumerate(self.registry.roles):  # where levelling sends rows: the hubs
            self.registry.on_register(M.RegisterNode("c", M.NodeInfo(i, job, idx, "127.0.0.1", 0, self.hubs[i].port,
                                                                     0)))

    def close(self):
        for h in self.hubs:
            h.close()
        self.service.stop()
        private.release_cluster_secret(private.private_dir("c"))

    def run(self, partitions, consume, uneven="drop", chunk_rows=None, feed_id="f1", shutdown=False, epoch=-1,
            skip=None, then=None):
        cfg = M.FeedConfig("c", self.key, "127.0.0.1", self.service.port, feed_id, "input", 30.0,
                           tuple(range(self.n)), tuple((i, "127.0.0.1", h.port) for i, h in enumerate(self.hubs)),
                           chunk_rows, uneven)
        results, errors = {}, []

        def rank(i):
            try:
                results[i] = consume(i, DataFeed(self.hubs[i]))
            except BaseException as e:  # the test reads them
                errors.append((i, e))

        ranks = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(self.n)]
        for t in ranks:
            t.start()
        feeder = make_train_feeder(cfg, False, epoch, skip)
        self.task_errors = []

        def task(p, rows):
            try:
                list(feeder(p, iter(rows)))
            except BaseException as e:  # some tests read them
                self.task_errors.append((p, e))
        tasks = [threading.Thread(target=task, args=(p, rows), daemon=True) for p, rows in enumerate(partitions)]
        for t in tasks:  # two at a time, as two executors would run them
            t.start()
        for t in tasks:
            t.join(30)
        per_node = self.scheduler.take_rows(feed_id, level=bool(uneven), timeout=30.0)
        totals = self.scheduler.totals(feed_id)
        for i, h in enumerate(self.hubs):
            end_feed("127.0.0.1", h.port, self.key, i, feed_id, "input", per_node.get(i, 0), 30.0, totals=totals,
                     uneven=uneven, level=self.scheduler.level_of(feed_id, i))
        if then is not None:  # the driver's next action, right after train() returned
            then(cfg)
        if shutdown:  # the cluster's shutdown right after train() returned, as shutdown() sends it
            for i, h in enumerate(self.hubs):
                end_feed("127.0.0.1", h.port, self.key, i, M.SHUTDOWN_FEED, "input", 0, 30.0)
        for t in ranks:
            t.join(30)
        assert not any(t.is_alive() for t in ranks), "a rank hung"
        self.sent = per_node  # before levelling
        return results, errors, dict(totals) if uneven else per_node  # what each rank reads


@pytest.fixture
def path():
    fp = FeedPath(2)
    yield fp
    fp.close()


def _steps_with_a_collective(barrier, read, step_secs=0.0):
    """consume(): one barrier per batch (a collective); the batches' row counts and values."""
    def consume(rank, feed):
        sizes, values = [], []
        for batch in read(feed):
            time.sleep(step_secs)
            barrier.wait()
            sizes.append(len(batch[0]))
            values.extend(int(v) for v in batch[0])
        barrier.wait()  # the end: every rank got here after the same number of steps
        return sizes, values
    return consume


def _partitions(sizes):
    start, parts = 0, []
    for s in sizes:
        parts.append([(start + k, float(start + k)) for k in range(s)])
        start += s
    return parts


@pytest.mark.parametrize("sizes,batch,read", [
    ([1000, 700, 450], 100, "batches"),  # the 2,150 rows in 3 unequal partitions
    ([1000, 700, 450], 100, "next_batch"),
    ([5, 3000, 17, 64, 999], 64, "batches"),
    ([4096, 1], 256, "batches"),
    ([60] * 5, 50, "batches"),  # chunks too small to split: 180 and 120 rows sent, levelled to 150 each
    ([3000, 1, 1, 1], 32, "batches"),  # skewed: levelled at the end
])
def test_unequal_partitions_give_equal_steps_and_drop_the_surplus(path, sizes, batch, read):
    barrier = threading.Barrier(2, timeout=15)
    reader = (lambda f: f.batches(batch)) if read == "batches" else (
        lambda f: iter(lambda: [np.array([r[0] for r in f.next_batch(batch)])] if not f.should_stop() else None, None))
    results, errors, per_node = path.run(_partitions(sizes), _steps_with_a_collective(barrier, reader))
    assert not errors, errors
    (s0, v0), (s1, v1) = results[0], results[1]
    s0, s1 = [s for s in s0 if s], [s for s in s1 if s]  # next_batch's read after the end may be empty
    fewest = min(per_node.values())
    steps = -(-fewest // batch)
    assert len(s0) == len(s1) == steps and all(s == batch for s in s0[:-1] + s1[:-1])
    assert len(set(v0 + v1)) == len(v0) + len(v1)  # no row twice
    dropped = sum(per_node.values()) - len(v0) - len(v1)
    assert dropped == sum(max(0, r - steps * batch) for r in per_node.values())
    assert sum(h.rows_dropped for h in path.hubs) == dropped
    assert max(per_node.values()) - min(per_node.values()) <= 1, per_node  # levelled to the row
    assert all(r - steps * batch <= batch - 1 for r in per_node.values())  # at most batch - 1 dropped per rank
    assert sum(per_node.values()) == sum(sizes)  # levelling moved rows, lost none


@pytest.mark.parametrize("n,sizes", [
    (2, [60] * 5),  # chunks too small to split (below MIN_PIECE): 180 and 120 rows sent
    (3, [63] * 8 + [5]),
    (4, [63] * 9 + [7]),
])
def test_levelling_sends_the_surplus_to_the_short_ranks_every_row_once(n, sizes):
    """The scheduler's shares part by what its chunks allow; at the end the nodes with surplus send
    their last rows to the short ones, so every rank reads its share to the row."""
    fp = FeedPath(n)
    try:
        barrier = threading.Barrier(n, timeout=15)
        results, errors, levelled = fp.run(_partitions(sizes), _steps_with_a_collective(barrier, lambda f: f.batches(32)),
                                           chunk_rows=1000)
        sent = fp.sent
    finally:
        fp.close()
    assert not errors, errors
    assert max(levelled.values()) - min(levelled.values()) <= 1 and sum(levelled.values()) == sum(sizes), levelled
    values = [v for _sizes, vs in results.values() for v in vs]
    assert len(set(values)) == len(values)  # no row twice
    steps = -(-min(levelled.values()) // 32)
    assert all(len([s for s in sz if s]) == steps for sz, _ in results.values())
    assert sum(sizes) - len(values) <= n * 31  # at most batch - 1 dropped per rank
    assert max(sent.values()) - min(sent.values()) > 1, sent  # the case needed levelling


def test_a_batch_larger_than_the_queue_holds_still_reaches_the_gate_and_the_end():
    """A reader at the gate waits for rows the other node has not been sent yet, or for the feed's
    end; the feed ends only once every row sent here is queued. With small chunks and a batch
    larger than the queue holds, the reader takes what is queued while it waits, so the feeding
    tasks finish and the feed completes (it used to stop with rows stuck in the queue)."""
    fp = FeedPath(2, queue_chunks=1)
    try:
        barrier = threading.Barrier(2, timeout=20)
        results, errors, levelled = fp.run(_partitions([100] * 6), _steps_with_a_collective(
            barrier, lambda f: f.batches(64)), chunk_rows=10)
    finally:
        fp.close()
    assert not errors and not fp.task_errors, (errors, fp.task_errors)
    assert levelled == {0: 300, 1: 300}
    assert [sizes for sizes, _ in results.values()] == [[64] * 4 + [44]] * 2
    assert sorted(v for _s, vs in results.values() for v in vs) == list(range(600))


def test_pad_gives_full_batches_whose_weights_mark_the_padding(path):
    barrier = threading.Barrier(2, timeout=15)

    def consume(rank, feed):
        out = []
        for x, y, w in feed.batches(100):
            barrier.wait()
            out.append((len(x), float(w.sum()), x[w == 1].tolist()))
        barrier.wait()
        return out

    results, errors, per_node = path.run(_partitions([1000, 700, 450]), consume, uneven="pad")
    assert not errors, errors
    most = max(per_node.values())
    for rank, batches in results.items():
        assert len(batches) == -(-most // 100) and all(n == 100 for n, _, _ in batches)
        assert sum(w for _, w, _ in batches) == per_node[rank]  # every real row once, with weight 1
    real = [v for b in results.values() for _, _, xs in b for v in xs]
    assert sorted(real) == list(range(2150))
    assert sum(h.rows_padded for h in path.hubs) == 2 * len(results[0]) * 100 - 2150


def test_error_raises_on_every_rank_at_the_same_step(path):
    """Slow steps: the feed is complete long before the ranks reach the step where they would part."""
    barrier = threading.Barrier(2, timeout=15)
    results, errors, per_node = path.run(_partitions([60, 60, 9]), _steps_with_a_collective(
        barrier, lambda f: f.batches(64), step_secs=0.05), uneven="error")
    assert sorted(per_node.values()) == [64, 65]  # levelled to the row, still 1 and 2 steps
    assert sorted(i for i, _ in errors) == [0, 1] and not barrier.broken
    for _, e in errors:
        assert isinstance(e, UnevenDataError) and "uneven='drop'" in str(e)


def test_the_safe_count_comes_with_the_data_so_readers_rarely_ask_the_driver(path):
    """100 chunks per node: the readers learn the safe count from the feeding tasks' frames; a
    reader asks the driver only when no news came for a while, and for the feed's end."""
    barrier = threading.Barrier(2, timeout=30)
    results, errors, per_node = path.run(_partitions([5000] * 4), _steps_with_a_collective(
        barrier, lambda f: f.batches(100)), chunk_rows=100)
    assert not errors, errors
    assert len(results[0][0]) == len(results[1][0]) == 100
    requests = [h.gate_requests for h in path.hubs]
    assert all(1 <= r <= 40 for r in requests), requests  # the old watcher: ~100 (one per chunk)


def test_a_node_hears_the_safe_count_when_another_node_is_sent_the_chunk_that_raises_it(path):
    from tfos.wire import arrow
    from tfos.feed.executor.sender import Sender

    cfg = M.FeedConfig("c", path.key, "127.0.0.1", path.service.port, "f9", "input", 30.0, (0, 1),
                       tuple((i, "127.0.0.1", h.port) for i, h in enumerate(path.hubs)), None, "drop")
    sender = Sender(cfg, 0, train=True)
    chunk = arrow.rows_to_batch([(k, float(k)) for k in range(100)])
    try:
        sender.send(0, chunk, safe=0)  # node 0 is ahead: nothing of it is safe yet
        sender.send(1, chunk, safe=100)  # node 1's chunk makes node 0's 100 rows safe
        sender.announce(100)
        deadline = time.monotonic() + 10
        while path.hubs[0].queue("input").safe.get("f9") != 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [h.queue("input").safe.get("f9") for h in path.hubs] == [100, 100]
    finally:
        sender.close()


def test_dataset_blocks_respect_the_gate(path):
    tf = pytest.importorskip("tensorflow")
    barrier = threading.Barrier(2, timeout=30)

    def consume(rank, feed):
        n = 0
        for x, _y in feed.dataset(64):
            barrier.wait()
            n += 1
        barrier.wait()
        return n

    results, errors, per_node = path.run(_partitions([5000, 300, 1200, 77]), consume)
    assert not errors, errors
    assert results[0] == results[1] == -(-min(per_node.values()) // 64)
    assert tf is not None


def test_terminate_releases_a_reader_waiting_at_the_gate(path):
    """Node 1 never gets a row, so node 0's reader waits at the gate; terminate() from another
    thread (what batch_results' caller or a callback may do) ends its read instead of a hang."""
    from tfos.wire import arrow
    from tfos.feed.node.hub import Data, Origin

    hub = path.hubs[0]
    hub.queue("input").q.put(Data(arrow.rows_to_batch([(k, float(k)) for k in range(50)]),
                                  Origin(None, train=True, uneven="drop", ranks=2), "stuck"))
    feed = DataFeed(hub)
    got = []
    reader = threading.Thread(target=lambda: got.extend(feed.batches(10)), daemon=True)
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive() and not got  # at the gate: node 1 has no rows yet
    feed.terminate()
    reader.join(5)
    assert not reader.is_alive() and not got


# --------------------------------------------------------------------------- feed positions (resuming a feed)

def _ids(position, starts):
    """The row ids of a position (epoch 0): partition p's row j is id starts[p] + j."""
    return sorted(starts[p] + j for (e, p), ranges in position.items() for a, b in ranges for j in range(a, b))


@pytest.mark.parametrize("n_before,n_after,read,steps", [
    (3, 2, "batches", 5), (2, 3, "next_batch", 5), (3, 3, "batches", 5),
    (3, 2, "batches", 23),  # after the levelling's rows (moved between ranks) were read too
])
def test_a_feed_resumed_from_the_ranks_positions_gives_every_row_once(n_before, n_after, read, steps):
    """Ranks record where their rows came from (epoch, partition, offset; rows moved to level the
    shares too); their positions at a checkpoint are exactly the rows they had read; a feed at
    another size that skips those rows gives every other row once: the epoch done exactly once."""
    from tfos.data import positions as P

    sizes, batch = [700, 333, 64, 1200, 5], 32
    starts = [sum(sizes[:p]) for p in range(len(sizes))]
    reader = (lambda f: f.batches(batch)) if read == "batches" else (
        lambda f: iter(lambda: [np.array([r[0] for r in f.next_batch(batch)])] if not f.should_stop() else None, None))

    def consume_with_a_checkpoint_at(steps, barrier):
        def consume(rank, feed):  # the rows after the checkpoint are read, then lost with the attempt
            values, saved = [], None
            for k, b in enumerate(reader(feed)):
                barrier.wait()
                values.extend(int(v) for v in b[0])
                if k + 1 == steps:
                    at = feed.hub.position()
                    saved = values[:], P.from_wire(at[1]), at[0]
                    # dataset()'s case: tf.data read ahead, the program says how many rows its steps took
                    prefix = P.from_wire(feed.hub.position(rows=3 * batch + 7)[1])
                    assert _ids(prefix, starts) == sorted(values[:3 * batch + 7])
            barrier.wait()
            return saved
        return consume

    fp = FeedPath(n_before)
    try:
        results, errors, levelled = fp.run(_partitions(sizes), consume_with_a_checkpoint_at(
            steps, threading.Barrier(n_before, timeout=15)), chunk_rows=100, epoch=0)
    finally:
        fp.close()
    moved = sum(abs(fp.sent.get(i, 0) - levelled[i]) for i in levelled) // 2
    assert steps < 20 or moved >= batch, (fp.sent, levelled)  # rows moved, and read before the checkpoint
    assert not errors, errors
    trained = {}
    for rank, (values, position, feed_id) in results.items():
        assert feed_id == "f1" and _ids(position, starts) == sorted(values), rank  # the position is what it read
        trained = P.merge(trained, position)
    assert P.count(sum(trained.values(), [])) == steps * batch * n_before
    fp = FeedPath(n_after)
    try:
        barrier = threading.Barrier(n_after, timeout=15)
        results, errors, _ = fp.run(_partitions(sizes), _steps_with_a_collective(barrier, reader), epoch=0,
                                    skip=P.of_epoch(trained, 0), uneven="drop", feed_id="f2")
        dropped = sum(h.rows_dropped for h in fp.hubs)
    finally:
        fp.close()
    assert not errors, errors
    rest = [v for _sizes, vs in results.values() for v in vs]
    everything = _ids(trained, starts) + rest
    assert len(set(everything)) == len(everything)  # no row twice
    assert len(everything) + dropped == sum(sizes) and dropped <= n_after * (batch - 1)
