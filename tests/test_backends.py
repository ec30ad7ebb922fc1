"""Backends: pure environment/rank decisions from tables, validation, and the PS example."""

import os
import re
import subprocess
import sys
from collections import namedtuple

import pytest

from tfos import backends as B
from tfos.errors import ConfigError


def _nodes(spec):
    return [dict(node_index=i, job_name=j, task_index=t, host=h) for i, (j, t, h) in enumerate(spec)]


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
    slots = B.horovod_slots(_nodes(spec))
    got = sorted((s["node_index"], s["rank"], s["local_size"], s["cross_rank"], s["cross_size"]) for s in slots)
    assert got == sorted(expected)
    assert {s["size"] for s in slots} == {len(expected)}
    ranks_by_host = {}
    for s in slots:
        ranks_by_host.setdefault(s["hostname"], []).append(s["local_rank"])
    assert all(sorted(v) == list(range(len(v))) for v in ranks_by_host.values())


def test_horovod_env_for_a_node():
    slots = B.horovod_slots(_nodes([("chief", 0, "h1"), ("worker", 0, "h2")]))
    cfg = {"rendezvous_port": 4321, "slots": slots}
    env = B.HorovodBackend.env_for({"node_index": 1}, cfg, {"fusion_threshold_mb": 32, "timeline": "tl.json",
                                                            "cycle_time_ms": 2},
                                   "driver", "eth0", "/logs")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2" and env["HOROVOD_LOCAL_RANK"] == "0"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "driver" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4321"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["HOROVOD_GLOO_IFACE"] == "eth0" and env["HOROVOD_FUSION_THRESHOLD"] == str(32 << 20)
    assert env["HOROVOD_TIMELINE"] == "/logs/tl.json" and env["HOROVOD_CYCLE_TIME"] == "2"
    assert B.HorovodBackend.env_for({"node_index": 9}, cfg, {}, "d", None, None) == {}


def test_interface_for():
    A = namedtuple("A", "address")
    assert B.interface_for("10.0.0.2", {"lo": [A("127.0.0.1")], "eth0": [A("10.0.0.2")]}) == "eth0"
    assert B.interface_for("1.2.3.4", {"lo": [A("127.0.0.1")]}) is None


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
        B.make_backend("mwms", 0, transport="rdma").validate(2, 0, "chief")
    assert B.make_backend("mwms", 0, transport="rdma").communication == "nccl"


@pytest.mark.parametrize("spec,num_ps,kwargs,cls", [(None, 0, {}, B.MWMSBackend), (None, 1, {}, B.MWMSBackend), ("ps", 1, {}, B.PSBackend),
                                                    ("mwms", 1, {}, B.MWMSBackend),
                                                    ("horovod", 0, {"compression": "fp16"}, B.HorovodBackend)])
def test_make_backend(spec, num_ps, kwargs, cls):
    b = B.make_backend(spec, num_ps, **kwargs)
    assert type(b) is cls
    assert type(B.from_options(b.options())) is cls and B.from_options(b.options()).options() == b.options()


@pytest.mark.parametrize("spec,args,match", [
    ("ps", (3, 0, "chief"), "num_ps >= 1"), ("ps", (3, 1, None), "needs a chief"), ("ps", (2, 1, "chief"), "one worker"),
    ("horovod", (2, 1, "chief"), "num_ps=0"),
])
def test_backend_validation(spec, args, match):
    with pytest.raises(ConfigError, match=match):
        B.make_backend(spec, args[1]).validate(*args)


@pytest.mark.parametrize("spec,kw,match", [("nope", {}, "backend must be one of"),
                                           ("mwms", {"communication": "x"}, "communication"),
                                           ("mwms", {"bogus": 1}, "bad option"),
                                           ("horovod", {"compression": "int8"}, "compression")])
def test_make_backend_rejects(spec, kw, match):
    with pytest.raises(ConfigError, match=match):
        B.make_backend(spec, 0, **kw)


def test_horovod_missing_is_a_clear_error():
    try:
        import horovod  # noqa: F401
        pytest.skip("horovod is installed here")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="pip install tfos\\[horovod\\]"):
        B.make_backend("horovod", 0).validate(2, 0, "chief")


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--input", "files"], ["--input", "spark"], ["--keras-fit"]])
def test_parameter_server_example_trains_and_counts_steps(flags):
    """ps + chief + worker need 3 executors: the example runs its own local-cluster[3,1,1024].
    InputMode.TENSORFLOW (per-worker file shards), InputMode.SPARK (fed to the chief), and tf_keras
    model.fit with a DatasetCreator."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "digits", "digits_ps.py"), "--epochs", "5"]
                         + flags,
                         capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    m = re.search(r"test accuracy ([\d.]+); steps scheduled (\d+), counted on the ps (\d+)", out.stdout)
    assert m, out.stdout[-2000:]
    assert float(m.group(1)) >= 0.9
    assert m.group(2) == m.group(3)  # no step lost


def keras3_fit_main(args, ctx):
    """Keras 3 model.fit on 2 nodes with tfos.keras_dist (no strategy scope, no Keras patching)."""
    import os

    import numpy as np

    from tfos import keras_dist

    rank, size = keras_dist.init_collectives()
    import keras

    import digits_tf

    x, y = digits_tf.load_csv(sorted(__import__("glob").glob(os.path.join(args["data"], "train-*.csv")))[rank::size])
    n = (args["rows_per_rank"] // 32) * 32  # same number of steps on every rank
    keras.utils.set_random_seed(rank)  # different init per rank: the broadcast must fix it
    model = digits_tf.build_model()
    model.compile(optimizer=keras_dist.DistributedOptimizer(keras.optimizers.Adam(0.01), compression=args["comp"]),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x[:n], y[:n], batch_size=32, epochs=8, verbose=0, shuffle=True,
              callbacks=[keras_dist.BroadcastInitialWeights(0), keras_dist.MetricAverageCallback()])
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"w{rank}.npz"), *model.get_weights(), acc=acc)


@pytest.mark.slow
@pytest.mark.parametrize("comp", [None, "fp16"])
def test_keras3_fit_on_two_nodes_identical_weights(sc, tmp_path, comp):
    import numpy as np

    import digits_tf
    from tfos import TFCluster

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    args = {"data": str(tmp_path / "data"), "out": str(tmp_path), "comp": comp,
            "rows_per_rank": info["train_rows"] // 2 - 40}
    cluster = TFCluster.reserve(sc, 2, 0)
    cluster.start(keras3_fit_main, args)
    cluster.shutdown(timeout=300)
    w0, w1 = np.load(tmp_path / "w0.npz"), np.load(tmp_path / "w1.npz")
    for k in w0.files:
        if k != "acc":
            np.testing.assert_array_equal(w0[k], w1[k])
    assert float(w0["acc"]) >= 0.9


def mwms_fp16_main(args, ctx):
    import glob
    import os

    import numpy as np
    import tensorflow as tf
    import tf_keras

    import digits_tf
    from tfos.distribute import allreduce_gradients

    strategy = ctx.strategy()
    x, y = digits_tf.load_csv(sorted(glob.glob(os.path.join(args["data"], "train-*.csv")))[ctx.rank::ctx.num_workers])
    gb = 32 * ctx.num_workers
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=0).repeat().batch(32)
        .with_options(options))
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(64, activation="relu"),
                                     tf_keras.layers.Dense(10)])
        opt = tf_keras.optimizers.Adam(0.01)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            per_ex = tf_keras.losses.sparse_categorical_crossentropy(yb, model(xb, training=True), from_logits=True)
            loss = tf.nn.compute_average_loss(per_ex, global_batch_size=gb)
        grads = allreduce_gradients(tape.gradient(loss, model.trainable_variables), compression="fp16")
        opt.apply_gradients(zip(grads, model.trainable_variables), skip_gradients_aggregation=True)
        return loss

    @tf.function
    def train_step(it):
        return strategy.run(step, args=next(it))

    it = iter(ds)
    for _ in range(8 * (args["rows"] // gb)):
        train_step(it)
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    acc = float(np.mean(np.argmax(model(xt).numpy(), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"fp16-{ctx.rank}.npz"), *[w.numpy() for w in model.weights], acc=acc)


@pytest.mark.slow
def test_mwms_custom_loop_with_fp16_gradient_compression(sc, tmp_path):
    import numpy as np

    import digits_tf
    from tfos import TFCluster

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    cluster = TFCluster.reserve(sc, 2, 0)
    cluster.start(mwms_fp16_main, {"data": str(tmp_path / "data"), "out": str(tmp_path), "rows": info["train_rows"]})
    cluster.shutdown(timeout=300)
    w0, w1 = np.load(tmp_path / "fp16-0.npz"), np.load(tmp_path / "fp16-1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    assert float(w0["acc"]) >= 0.9
