"""Backends on the shared local-cluster: Keras 3 fit through tfos.keras_dist, MWMS with fp16
gradients, and a user-defined Backend whose node hooks run on the nodes."""

import os

import pytest

from tfos.backends import MWMSBackend
from tfos.backends.mwms import MWMSNode
from tfos.tf import gloo

needs_gloo = pytest.mark.skipif(not gloo.installed(), reason="PyTorch (tfos[gloo]) is not installed")


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
    model.fit(x[:n], y[:n], batch_size=32, epochs=2, verbose=0, shuffle=True,
              callbacks=[keras_dist.BroadcastInitialWeights(0), keras_dist.MetricAverageCallback()])
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"w{rank}.npz"), *model.get_weights(), acc=acc)


@pytest.mark.slow
@pytest.mark.parametrize("comp", [None, "fp16"])
def test_keras3_fit_on_two_nodes_identical_weights(tfos_cluster, tmp_path, comp):
    import numpy as np

    import digits_tf

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    args = {"data": str(tmp_path / "data"), "out": str(tmp_path), "comp": comp,
            "rows_per_rank": info["train_rows"] // 2 - 40}
    cluster = tfos_cluster(2, 0)
    cluster.start(keras3_fit_main, args)
    cluster.shutdown(timeout=300)
    w0, w1 = np.load(tmp_path / "w0.npz"), np.load(tmp_path / "w1.npz")
    for k in w0.files:
        if k != "acc":
            np.testing.assert_array_equal(w0[k], w1[k])
    assert float(w0["acc"]) > 0.5  # it learns (2 epochs); accuracy itself: tests/e2e and test_keras_dist


def mwms_fp16_main(args, ctx):
    import glob
    import os

    import numpy as np
    import tensorflow as tf
    import tf_keras

    import digits_tf
    from tfos.distribute import allreduce_gradients

    strategy = ctx.strategy()
    from tfos import distribute

    assert (distribute._gloo is not None) == (args["implementation"] == "gloo")
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
    for _ in range(2 * (args["rows"] // gb)):
        train_step(it)
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    acc = float(np.mean(np.argmax(model(xt).numpy(), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"fp16-{ctx.rank}.npz"), *[w.numpy() for w in model.weights], acc=acc)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["tf", pytest.param("gloo", marks=needs_gloo)])
def test_mwms_custom_loop_with_fp16_gradient_compression(tfos_cluster, tmp_path, implementation):
    """allreduce_gradients under MWMS: TF's collectives, or Gloo beside the strategy."""
    import numpy as np

    import digits_tf

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    cluster = tfos_cluster(2, 0, backend="mwms", backend_options={"implementation": implementation})
    cluster.start(mwms_fp16_main, {"data": str(tmp_path / "data"), "out": str(tmp_path), "rows": info["train_rows"],
                                   "implementation": implementation})
    cluster.shutdown(timeout=300)
    w0, w1 = np.load(tmp_path / "fp16-0.npz"), np.load(tmp_path / "fp16-1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    assert float(w0["acc"]) > 0.5  # it learns (2 epochs); accuracy itself: tests/e2e and test_keras_dist


class MarkingNode(MWMSNode):
    """A user's node hooks: extra environment, and a file written around main_fun."""

    def env(self, me, nodes, config):
        return dict(super().env(me, nodes, config), TFOS_TEST_MARK=f"{self.mark}-{me.node_index}")

    def run(self, main_fun, args, ctx):
        main_fun(args, ctx)
        with open(os.path.join(args["out"], f"hooked-{ctx.node_index}"), "w") as f:
            f.write(self.mark)


class MarkingBackend(MWMSBackend):
    node_class = MarkingNode

    def __init__(self, mark="user", **kw):
        super().__init__(**kw)
        self.mark = mark

    def node_options(self):
        return dict(super().node_options(), mark=self.mark)


def env_main(args, ctx):
    import sys

    with open(os.path.join(args["out"], f"env-{ctx.node_index}"), "w") as f:
        driver_modules = sorted(m for m in sys.modules if m.startswith("tfos.cluster.driver"))
        f.write(os.environ.get("TFOS_TEST_MARK", "") + "|" + ",".join(driver_modules))


def test_user_backend_subclass_runs_its_node_hooks_on_the_nodes(tfos_cluster, tmp_path):
    cluster = tfos_cluster(2, 0, backend=MarkingBackend(mark="custom"), progress=False)
    cluster.start(env_main, {"out": str(tmp_path)})
    cluster.shutdown(timeout=120)
    for i in range(2):
        mark, driver_modules = (tmp_path / f"env-{i}").read_text().split("|")
        assert mark == f"custom-{i}"
        assert driver_modules == ""  # the TF process never loads driver modules
        assert (tmp_path / f"hooked-{i}").read_text() == "custom"


def gloo_peer_killed_main(args, ctx):
    """Gloo all-reduces of 32 MiB in a loop; rank 1 SIGKILLs itself from a timer thread, that is
    in the middle of an all-reduce, after writing the time of the kill."""
    import signal
    import threading
    import time

    import numpy as np

    from tfos import keras_dist

    keras_dist.init_collectives(implementation="gloo")
    if ctx.rank == 1:
        def kill():
            with open(args["killed_at"], "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(3.0, kill).start()
    big = np.ones(8 << 20, "float32")
    if args.get("in_function"):  # tfos's Gloo op when built (test.sh builds it), else tf.py_function
        import tensorflow as tf

        step = tf.function(lambda: keras_dist.allreduce(tf.ones([8 << 20])))
        for _ in range(100_000):
            step()
    for _ in range(100_000):
        keras_dist.allreduce(big)


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf.function"])
def test_gloo_peer_killed_mid_allreduce_fails_the_cluster_within_30_s(tfos_cluster, tmp_path, in_function):
    import time

    from tfos.errors import NodeFailedError

    killed_at = tmp_path / "killed_at"
    cluster = tfos_cluster(2, 0)
    cluster.start(gloo_peer_killed_main, {"killed_at": str(killed_at), "in_function": in_function})
    with pytest.raises(NodeFailedError) as exc:
        cluster.shutdown(timeout=120)
    delay = time.time() - float(killed_at.read_text())
    print(f"kill -> NodeFailedError: {delay:.1f} s; {exc.value}")
    assert delay < 30
    # whichever report reaches the driver first: node 1's death, or node 0's broken all-reduce
    assert any(f.node_index == 1 or "CollectiveError" in f.traceback for f in exc.value.failures), exc.value


def sigterm_main(args, ctx):
    """Whether this TF process catches SIGTERM right after MWMS started (TF's coordination service
    installs a handler for its preemption notifier)."""
    import os as _os

    def caught() -> bool:
        with open(f"/proc/{_os.getpid()}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
        return bool(mask & (1 << 14))  # bit 14: signal 15

    ctx.strategy()
    ctx.send_result({"caught_after_strategy": caught()})


def test_an_mwms_tf_process_still_dies_of_the_agents_sigterm(tfos_cluster):
    """MWMS's coordination service takes SIGTERM over, so a stop waited stop_grace_secs for SIGKILL
    on every restart, resize and shutdown: in a tfos node tfos gives SIGTERM its default back."""
    cluster = tfos_cluster(2, 0, master_node="chief")
    cluster.start(sigterm_main, None)
    cluster.shutdown(timeout=300)
    assert cluster.results == {0: {"caught_after_strategy": False}, 1: {"caught_after_strategy": False}}
