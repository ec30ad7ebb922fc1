"""The reduction server on the embedded Spark (``pytest --reduction``: a local-cluster of 4 task
slots): 2 workers and 2 reducers of one tfos cluster. Known tensors sum exactly, and Keras 3
``fit`` (tfos.keras_dist) and an MWMS custom loop (tfos.distribute.allreduce_gradients) leave
identical weights on both workers."""

import json

import pytest

from tfos.tf import gloo

pytestmark = pytest.mark.skipif(not gloo.installed(), reason="PyTorch (tfos[gloo]) is not installed")


def through_the_reducers(args, ctx):
    """Every path of the reduction server in one TF process: the MWMS backend's strategy first (TF's
    collectives start only at program start), then keras_dist, then exact sums, an MWMS custom loop
    with bf16 gradients and Keras 3 fit with fp16; weights and findings to ``args['out']``."""
    import glob
    import os

    import numpy as np
    import tensorflow as tf
    import tf_keras

    import digits_tf
    import reduction_programs
    from tfos import distribute, keras_dist
    from tfos.tf import reduction

    strategy = ctx.strategy()  # MWMS; 'auto' picks the reducers for allreduce_gradients
    rank, size = keras_dist.init_collectives(timeout_seconds=60)  # 'auto' too: the same group
    found = {"implementation": keras_dist._state.implementation, "shared": distribute._gloo is keras_dist._state.gloo,
             "group": type(distribute._gloo).__name__, "reducers": os.environ.get("TFOS_REDUCER_NAMES"),
             "errors": reduction_programs.check_sums(size)}
    assert isinstance(distribute._gloo, reduction.WorkerGroup)

    x, y = digits_tf.load_csv(sorted(glob.glob(os.path.join(args["data"], "train-*.csv")))[rank::size])
    n = (args["rows_per_rank"] // 32) * 32
    x, y = x[:n], y[:n]
    # MWMS custom loop: tf_keras, gradients summed through the reducers in bfloat16
    ds = strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32))
    with strategy.scope():
        tf_keras.utils.set_random_seed(0)
        mwms_model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(64, activation="relu"),
                                          tf_keras.layers.Dense(10)])
        opt = tf_keras.optimizers.Adam(0.01)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            logits = mwms_model(xb, training=True)
            per_ex = tf_keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_ex, global_batch_size=32 * size)
        grads = distribute.allreduce_gradients(tape.gradient(loss, mwms_model.trainable_variables), compression="bf16",
                                               implementation="reduction_server")
        opt.apply_gradients(zip(grads, mwms_model.trainable_variables), skip_gradients_aggregation=True)

    @tf.function
    def train_step(it):
        strategy.run(step, args=next(it))

    it = iter(ds)
    for _ in range(n // 32):
        train_step(it)
    np.savez(os.path.join(args["out"], f"mwms-{rank}.npz"), *[w.numpy() for w in mwms_model.weights])

    # Keras 3 fit, fp16 gradients, initial weights broadcast from rank 0 through the reducers
    import keras

    keras.utils.set_random_seed(rank)  # different per rank: the broadcast must fix it
    model = digits_tf.build_model()
    model.compile(optimizer=keras_dist.DistributedOptimizer(keras.optimizers.Adam(0.01), compression="fp16"),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=2, verbose=0,
              callbacks=[keras_dist.BroadcastInitialWeights(0), keras_dist.MetricAverageCallback()])
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    found["accuracy"] = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"keras-{rank}.npz"), *model.get_weights())
    with open(os.path.join(args["out"], f"found-{rank}.json"), "w") as f:
        json.dump(found, f)


def test_two_workers_and_two_reducers_sum_exactly_and_train_identical_replicas(wide_cluster, tmp_path):
    import numpy as np

    import digits_tf

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    args = {"data": str(tmp_path / "data"), "out": str(tmp_path), "rows_per_rank": info["train_rows"] // 2 - 40}
    cluster = wide_cluster(2, 0, num_reducers=2, backend_options={"timeout_seconds": 60})
    assert sorted(j for j, _ in cluster.roles) == ["chief", "reducer", "reducer", "worker"]
    cluster.start(through_the_reducers, args)
    reducers = [n for n in cluster.nodes if n["job_name"] == "reducer"]
    cluster.shutdown(timeout=400)
    assert len(reducers) == 2 and cluster.restarts == []
    found = [json.loads((tmp_path / f"found-{r}.json").read_text()) for r in range(2)]
    for f in found:
        assert f["implementation"] == "reduction_server" and f["shared"] and f["group"] == "WorkerGroup", f
        assert not {k: v for k, v in f["errors"].items() if v != 0.0}, f["errors"]
        names = json.loads(f["reducers"])
        assert [n.split(" (")[0] for n in names] == ["reducer 0", "reducer 1"], names
        assert all(f"node {r['node_index']} on {r['host']}" in " ".join(names) for r in reducers), names
    for kind in ("mwms", "keras"):
        w0, w1 = np.load(tmp_path / f"{kind}-0.npz"), np.load(tmp_path / f"{kind}-1.npz")
        for k in w0.files:  # the reducers send every worker the same bytes: replicas stay identical
            np.testing.assert_array_equal(w0[k], w1[k])
    assert found[0]["accuracy"] > 0.5, found  # it learns (2 epochs); accuracy itself: the multi-host suite


def test_reducers_need_a_backend_that_all_reduces_through_them(wide_cluster):
    from tfos.errors import ConfigError

    with pytest.raises(ConfigError, match="num_reducers needs backend='mwms'"):
        wide_cluster(3, 1, num_reducers=1, backend="ps")
