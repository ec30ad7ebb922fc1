"""Digits on tfos with parameter servers (backend='ps'), InputMode.TENSORFLOW.

1 ps + 1 chief + 1 worker (3 executors): tfos runs tf.distribute.Server on the ps and worker
nodes; main_fun runs on the chief with ParameterServerStrategy + ClusterCoordinator, and each
worker reads its own CSV shards through a per-worker dataset function.

With ``--input spark`` (InputMode.SPARK) only the chief receives the fed rows; it hands each
batch to a worker as the arguments of ``coordinator.schedule``.

    python examples/digits/digits_ps.py [--input spark | --keras-fit]   # embedded local-cluster[3,1,1024]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

import numpy as np


def make_dataset_fn(files, batch_size):
    """Per-worker dataset function: each worker reads its own disjoint CSV shards."""
    import tensorflow as tf

    def dataset_fn(input_context):
        ds = tf.data.Dataset.from_tensor_slices(files).shard(input_context.num_input_pipelines,
                                                             input_context.input_pipeline_id)
        ds = ds.interleave(tf.data.TextLineDataset, cycle_length=1)
        ds = ds.map(lambda line: tf.io.decode_csv(line, [0.0] * 65))
        ds = ds.map(lambda *cols: (tf.stack(cols[1:]), tf.cast(cols[0], tf.int64)))
        return ds.shuffle(512, seed=1).repeat().batch(batch_size)

    return dataset_fn


def fit_main_fun(args, ctx):
    """Keras ``model.fit`` under parameter servers: tf_keras with a DatasetCreator (Keras 3 has no
    ClusterCoordinator support). Runs on the chief only."""
    import glob

    import tf_keras

    import digits_tf

    strategy = ctx.strategy()
    data_dir = ctx.absolute_path(args.data_dir).replace("file://", "")
    files = sorted(glob.glob(os.path.join(data_dir, "train-*.csv")))
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(64, activation="relu"),
                                     tf_keras.layers.Dense(10)])
        model.compile(optimizer=tf_keras.optimizers.Adam(args.learning_rate),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=10)
    steps_per_epoch = args.train_rows // args.batch_size
    model.fit(tf_keras.utils.experimental.DatasetCreator(make_dataset_fn(files, args.batch_size)),
              epochs=args.epochs, steps_per_epoch=steps_per_epoch, verbose=0)
    xt, yt = digits_tf.load_csv([os.path.join(data_dir, "test.csv")])
    acc = float(np.mean(np.argmax(model(xt, training=False).numpy(), axis=1) == yt))
    iterations = int(model.optimizer.iterations.numpy())  # a tf.Variable on a ps (atomic assign_add)
    result = {"accuracy": acc, "scheduled_steps": args.epochs * steps_per_epoch, "counted_steps": iterations,
              "optimizer_iterations": iterations, "num_workers": len(ctx.cluster_spec.get("worker", []))}
    out_dir = ctx.absolute_path(args.output_dir).replace("file://", "")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)


def main_fun(args, ctx):
    """Runs on the chief only (the backend serves the ps and worker nodes)."""
    import glob

    import keras
    import tensorflow as tf

    import digits_tf

    strategy = ctx.strategy()  # ParameterServerStrategy from TF_CONFIG
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data_dir = ctx.absolute_path(args.data_dir).replace("file://", "")
    files = sorted(glob.glob(os.path.join(data_dir, "train-*.csv")))
    num_workers = len(ctx.cluster_spec.get("worker", []))

    dataset_fn = make_dataset_fn(files, args.batch_size)

    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(args.learning_rate)
        steps_done = tf.Variable(0, dtype=tf.int64, trainable=False)  # lives on a ps

    per_worker_iter = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step_fn(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                           from_logits=True)
                loss = tf.reduce_mean(per_example)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            steps_done.assign_add(1)  # a tf.Variable's assign_add is atomic on the ps
            return loss
        return strategy.run(replica_fn, args=next(iterator))

    scheduled = 0
    if args.input == "spark":
        @tf.function
        def batch_step_fn(x, y):
            def replica_fn(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                                       from_logits=True))
                optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                              model.trainable_variables))
                steps_done.assign_add(1)
                return loss
            return strategy.run(replica_fn, args=(x, y))

        feed = ctx.get_data_feed(train_mode=True)
        for x, y in feed.batches(args.batch_size):  # only the chief is fed; workers get batches as args
            coordinator.schedule(batch_step_fn, args=(tf.constant(x, tf.float32), tf.constant(y, tf.int64)))
            scheduled += 1
        coordinator.join()
    steps_per_epoch = args.train_rows // args.batch_size
    for epoch in range(args.epochs if args.input == "files" else 0):
        losses = [coordinator.schedule(step_fn, args=(per_worker_iter,)) for _ in range(steps_per_epoch)]
        scheduled += len(losses)
        coordinator.join()
        print(f"chief: epoch {epoch} loss {float(np.mean([l.fetch() for l in losses])):.4f}", flush=True)

    xt, yt = digits_tf.load_csv([os.path.join(data_dir, "test.csv")])
    acc = float(np.mean(np.argmax(model(xt, training=False).numpy(), axis=1) == yt))
    result = {"accuracy": acc, "scheduled_steps": scheduled, "counted_steps": int(steps_done.numpy()),
              "optimizer_iterations": int(optimizer.iterations.numpy()), "num_workers": num_workers}
    out_dir = ctx.absolute_path(args.output_dir).replace("file://", "")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)
    print("chief:", result, flush=True)


def main(argv=None, spark=None) -> dict:
    """Run the example; on ``spark`` (a SparkSession with 3 executor slots) when given, else on an
    embedded local-cluster[3,1,1024] of its own."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--input", choices=("files", "spark"), default="files")
    p.add_argument("--keras-fit", action="store_true", help="tf_keras model.fit with a DatasetCreator (files)")
    args = p.parse_args(argv)
    import digits_tf
    from tfos import InputMode, TFCluster
    from tfos.testing import local_cluster_session

    base = tempfile.mkdtemp(prefix="tfos-digits-ps-")
    args.data_dir = os.path.join(base, "data")
    args.output_dir = os.path.abspath(args.output_dir or os.path.join(base, "out"))
    args.train_rows = digits_tf.prepare_shards(args.data_dir)["train_rows"]
    own_session = spark is None
    if own_session:
        spark = local_cluster_session(3, app_name="tfos-digits-ps")
    mode = InputMode.SPARK if args.input == "spark" else InputMode.TENSORFLOW
    cluster = TFCluster.reserve(spark.sparkContext, 3, num_ps=1, backend="ps", input_mode=mode)
    cluster.start(fit_main_fun if args.keras_fit else main_fun, args)
    if args.input == "spark":
        import glob

        rows = [(r[1:].astype(np.float32), int(r[0])) for f in sorted(glob.glob(os.path.join(args.data_dir, "train-*.csv")))
                for r in np.loadtxt(f, delimiter=",", ndmin=2)]
        cluster.train(spark.sparkContext.parallelize(rows, 4), num_epochs=args.epochs)
    cluster.shutdown(timeout=600)
    if own_session:
        spark.stop()
    with open(os.path.join(args.output_dir, "result.json")) as f:
        result = json.load(f)
    print(f"digits (parameter servers): test accuracy {result['accuracy']:.4f}; steps scheduled "
          f"{result['scheduled_steps']}, counted on the ps {result['counted_steps']}, "
          f"Keras optimizer.iterations {result['optimizer_iterations']}")
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
