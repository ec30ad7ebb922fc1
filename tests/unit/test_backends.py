"""Backends: pure environment/rank decisions from tables, validation, the registry and node hooks."""

from collections import namedtuple

import pytest

from tfos import backends as B
from tfos.backends.horovod import HorovodNode, horovod_env, horovod_slots, interface_for
from tfos.backends.mwms import MWMSNode
from tfos.backends.ps import PSNode
from tfos.errors import ConfigError
from tfos.wire.messages import NodeInfo


def _nodes(spec):
    return [NodeInfo(i, j, t, h, 2000 + i, 0, 0) for i, (j, t, h) in enumerate(spec)]


@pytest.mark.parametrize("spec,expected", [
    # two nodes on one host
    ([("chief", 0, "a"), ("worker", 0, "a")],
     [(0, 0, 2, 0, 1), (1, 1, 2, 0, 1)]),
    # one node per host
    ([("chief", 0, "a"), ("worker", 0, "b"), ("worker", 1, "c")],
     [(0, 0, 1, 0, 3), (1, 1, 1, 1, 3), (2, 2, 1, 2, 3)]),
    # 2 + 1 layout; ps/evaluator are not Horovod ranks; workers ordered by task index
    ([("evaluator", 0, "a"), ("worker", 1, "b"), ("worker", 0, "a"), ("chief", 0, "a")],
     [(1, 2, 1, 1, 2), (2, 1, 2, 0, 1), (3, 0, 2, 0, 2)]),
])
def test_horovod_slots(spec, expected):
    slots = horovod_slots(_nodes(spec))
    got = sorted((s["node_index"], s["rank"], s["local_size"], s["cross_rank"], s["cross_size"]) for s in slots)
    assert got == sorted(expected)
    assert {s["size"] for s in slots} == {len(expected)}
    ranks_by_host = {}
    for s in slots:
        ranks_by_host.setdefault(s["hostname"], []).append(s["local_rank"])
    assert all(sorted(v) == list(range(len(v))) for v in ranks_by_host.values())


def test_horovod_env_for_a_node():
    slots = horovod_slots(_nodes([("chief", 0, "h1"), ("worker", 0, "h2")]))
    cfg = {"rendezvous_port": 4321, "slots": slots, "driver_host": "driver", "log_dir": "/logs"}
    env = horovod_env(1, cfg, {"fusion_threshold_mb": 32, "timeline": "tl.json", "cycle_time_ms": 2}, "eth0")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2" and env["HOROVOD_LOCAL_RANK"] == "0"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "driver" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4321"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["HOROVOD_GLOO_IFACE"] == "eth0" and env["HOROVOD_FUSION_THRESHOLD"] == str(32 << 20)
    assert env["HOROVOD_TIMELINE"] == "/logs/tl.json" and env["HOROVOD_CYCLE_TIME"] == "2"
    assert horovod_env(9, cfg, {}, None) == {}


def test_interface_for():
    A = namedtuple("A", "address")
    assert interface_for("10.0.0.2", {"lo": [A("127.0.0.1")], "eth0": [A("10.0.0.2")]}) == "eth0"
    assert interface_for("1.2.3.4", {"lo": [A("127.0.0.1")]}) is None


def test_rdma_environment():
    env = B.rdma_environment(["mlx5_0", "mlx5_1"], "ib0")
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    with pytest.raises(ConfigError, match="/sys/class/infiniband is empty"):
        B.rdma_environment([])


def test_rdma_transport_fails_at_reserve_without_devices(tmp_path, monkeypatch):
    if B.rdma_devices():
        pytest.skip("this host has RDMA devices")
    with pytest.raises(ConfigError, match="RDMA device"):
        B.make_backend("mwms", transport="rdma").validate(2, 0, "chief")
    assert B.make_backend("mwms", transport="rdma").communication == "nccl"


@pytest.mark.parametrize("spec,kwargs,cls,node_cls", [
    (None, {}, B.MWMSBackend, MWMSNode), ("mwms", {"bytes_per_pack": 4}, B.MWMSBackend, MWMSNode),
    ("ps", {}, B.PSBackend, PSNode), ("horovod", {"compression": "fp16"}, B.HorovodBackend, HorovodNode),
    ("tfos.backends.ps:PSBackend", {}, B.PSBackend, PSNode), (B.PSBackend, {}, B.PSBackend, PSNode),
])
def test_make_backend_and_its_node_hooks(spec, kwargs, cls, node_cls):
    b = B.make_backend(spec, **kwargs)
    assert type(b) is cls
    hooks = b.node_hooks()
    assert type(hooks) is node_cls
    for k, v in b.node_options().items():
        assert getattr(hooks, k) == v


def test_user_backend_instance_keeps_its_own_node_hooks():
    class Custom(B.NodeHooks):
        def env(self, me, nodes, config):
            return {"GREETING": self.greeting}

    class MyBackend(B.Backend):
        node_class = Custom

        def node_options(self):
            return dict(super().node_options(), greeting="hi")

    mine = MyBackend()
    assert B.make_backend(mine) is mine
    assert mine.node_hooks().env(None, [], {}) == {"GREETING": "hi"}


@pytest.mark.parametrize("spec,args,match", [
    ("ps", (3, 0, "chief"), "num_ps >= 1"), ("ps", (3, 1, None), "needs a chief"), ("ps", (2, 1, "chief"), "one worker"),
    ("horovod", (2, 1, "chief"), "num_ps=0"),
])
def test_backend_validation(spec, args, match):
    with pytest.raises(ConfigError, match=match):
        B.make_backend(spec).validate(*args)


@pytest.mark.parametrize("spec,kw,match", [("nope", {}, "backend must be one of"),
                                           ("os:system", {}, "not a tfos.backends.Backend"),
                                           ("no.such.module:X", {}, "cannot load backend"),
                                           ("mwms", {"communication": "x"}, "communication"),
                                           ("mwms", {"bogus": 1}, "bad option"),
                                           ("horovod", {"compression": "int8"}, "compression")])
def test_make_backend_rejects(spec, kw, match):
    with pytest.raises(ConfigError, match=match):
        B.make_backend(spec, **kw)


def test_horovod_missing_is_a_clear_error():
    try:
        import horovod  # noqa: F401
        pytest.skip("horovod is installed here")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="pip install tfos\\[horovod\\]"):
        B.make_backend("horovod").validate(2, 0, "chief")


@pytest.mark.parametrize("old", ["driver_setup", "node_env", "run_node", "options", "strategy"])
def test_a_backend_with_old_single_class_hooks_is_told_where_they_go(old):
    cls = type("OldStyle", (B.MWMSBackend,), {old: lambda self, *a: None})
    with pytest.raises(ConfigError, match=f"OldStyle defines {old}"):
        B.make_backend(cls)
    with pytest.raises(ConfigError, match="NodeHooks|Backend.setup|Backend.node_options"):
        B.make_backend(cls())


@pytest.mark.parametrize("communication,encrypted,expected", [
    ("auto", True, "ring"), ("auto", False, "auto"), ("ring", True, "ring"), ("nccl", True, "nccl"),
    ("nccl", False, "nccl")])
def test_encrypted_clusters_ask_tf_for_ring_when_the_choice_is_auto(communication, encrypted, expected):
    """TF's 'auto' picks NCCL on GPU nodes, whose traffic bypasses the tunnel; GPUs Spark schedules are
    not counted at reserve(), so the node decides (explicit 'nccl' is refused at reserve())."""
    from tfos.backends.mwms import effective_communication

    assert effective_communication(communication, encrypted) == expected
