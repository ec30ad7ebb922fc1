"""Gloo's rendezvous through the driver: the driver's store (bounded, waits bounded) and a real Gloo
group of two ranks meeting through it over encrypted control channels, with no TCPStore."""

import datetime
import threading

import pytest

from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.rendezvous import MAX_VALUE, RendezvousStore
from tfos.cluster.driver.service import ControlService
from tfos.errors import ProtocolError, TFOSTimeoutError
from tfos.feed.driver.scheduler import FeedScheduler
from tfos.wire import channel as C
from tfos.wire import messages as M


def test_the_store_waits_bounded_and_answers_what_is_missing():
    s = RendezvousStore()
    s.set("g", "a", b"1")
    assert s.get("g", ["a"], 0) == ([b"1"], [])
    assert s.get("g", ["a", "b"], 0.05) == (None, ["b"])
    assert s.get("other", ["a"], 0) == (None, ["a"])  # scopes are apart
    threading.Timer(0.1, lambda: s.set("g", "b", b"2")).start()
    assert s.get("g", ["a", "b"], 5) == ([b"1", b"2"], [])
    assert s.add("g", "n", 3) == 3 and s.add("g", "n", -1) == 2
    assert s.compare_set("g", "c", b"", b"x") == b"x" and s.compare_set("g", "c", b"y", b"z") == b"x"
    assert s.delete("g", "c") and not s.delete("g", "c") and s.num_keys("g") == 3
    s.clear()
    assert s.num_keys("g") == 0


def test_the_store_bounds_memory():
    s = RendezvousStore()
    with pytest.raises(ProtocolError, match="exceeds"):
        s.set("g", "big", b"x" * (MAX_VALUE + 1))
    with pytest.raises(ProtocolError, match="integer"):
        s.set("g", "k", b"abc") or s.add("g", "k", 1)


@pytest.fixture
def driver():
    registry = NodeRegistry("cid", [("chief", 0), ("worker", 0)])
    key = C.new_key(True)
    service = ControlService(registry, FeedScheduler(registry, [0, 1]).handlers(), key, "127.0.0.1").start()
    yield registry, key, service
    service.stop()


def _node(key, port, i):
    cluster = M.ClusterConfig("cid", key, "127.0.0.1", port, (("chief", 0), ("worker", 0)), 0, 60.0, "/l", "file:///")
    return M.NodeConfig(cluster, i, "chief" if i == 0 else "worker", 0, "127.0.0.1", "/n", "/f", "/w", "/py")


def test_two_gloo_ranks_meet_through_the_driver_and_all_reduce(driver):
    pytest.importorskip("torch")
    import torch
    import torch.distributed as dist

    from tfos.tf.gloo_store import DriverStore

    registry, key, service = driver
    out = {}

    def rank(r):
        store = DriverStore(_node(key, service.port, r), "test", 30)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=30)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(store, r, 2, opts)
        t = torch.full((1000,), float(r + 1))
        pg.allreduce([t]).wait()
        out[r] = t
        store.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert torch.equal(out[0], torch.full((1000,), 3.0)) and torch.equal(out[1], out[0])
    assert registry.store.num_keys("test") >= 2  # the ranks' addresses went through the driver


def test_a_rank_that_never_comes_fails_the_wait_naming_the_keys(driver):
    pytest.importorskip("torch")
    from tfos.tf.gloo_store import DriverStore

    _registry, key, service = driver
    store = DriverStore(_node(key, service.port, 0), "lonely", 0.5)
    store.set("mine", b"x")
    assert store.get("mine") == b"x" and store.check(["mine"]) and not store.check(["theirs"])
    with pytest.raises(TFOSTimeoutError, match=r"keys \['theirs'\].*within 0.5 s"):
        store.get("theirs")
    assert store.add("n", 2) == 2 and store.num_keys() == 2 and store.delete_key("n") and store.num_keys() == 1
    store.close()


def test_a_store_request_for_an_unknown_node_is_refused(driver):
    _registry, key, service = driver
    from tfos.errors import RequestRefused
    from tfos.wire.clients import DriverClient

    with pytest.raises(RequestRefused, match="unknown node index 7"):
        DriverClient("127.0.0.1", service.port, key, "cid", 7).store_set("g", "k", "eA==")
