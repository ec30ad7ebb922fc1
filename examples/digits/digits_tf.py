"""Digits on tfos, InputMode.TENSORFLOW: each rank reads its own, disjoint file shards.

2 worker nodes train one Keras 3 model with MultiWorkerMirroredStrategy (ring all-reduce)
and a custom training loop; the chief evaluates on the held-out test set.

    python examples/digits/digits_tf.py                 # embedded local-cluster[2,1,1024]
    python examples/digits/digits_tf.py --max-restarts 2  # survive node failures: resume from checkpoints
    python examples/digits/digits_tf.py --num-executors 3 --min-executors 2 --max-restarts 2  # and lost hosts
    spark-submit --master spark://HOST:7077 examples/digits/digits_tf.py --data-dir /shared/digits
    spark-submit --master yarn examples/digits/digits_tf.py --data-dir hdfs:///user/me/digits \
        --checkpoint-dir hdfs:///user/me/digits-ckpt --export-dir hdfs:///user/me/digits-model

Paths go on Spark's default filesystem (``fs.defaultFS``). On a local filesystem the data are CSV
shards; anywhere else (hdfs://, which TensorFlow 2.21 cannot open) they are TFRecords written by
Spark with ``tfos.data.save_as_tfrecords`` and read per rank with ``tfos.data.rank_files`` and
``tfos.data.tfrecord_dataset``. Checkpoints, TensorBoard logs and the export may be on hdfs:// too.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import logging
import os
import sys
import tempfile

import numpy as np


def digits_rows(seed: int = 0):
    """scikit-learn's bundled digits, shuffled: rows of (label, 64 pixels in [0, 1]), and the
    number of test rows (the first quarter)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    rows = np.concatenate([y[order][:, None].astype(np.float32), x[order]], axis=1)
    return rows, len(y) // 4


def prepare_shards(data_dir: str, num_shards: int = 8, seed: int = 0) -> dict:
    """Write the digits as CSV shards (label, 64 pixels) plus a test file in a local directory."""
    rows, n_test = digits_rows(seed)
    os.makedirs(data_dir, exist_ok=True)
    np.savetxt(os.path.join(data_dir, "test.csv"), rows[:n_test], delimiter=",", fmt="%.6g")
    for i, shard in enumerate(np.array_split(rows[n_test:], num_shards)):
        np.savetxt(os.path.join(data_dir, f"train-{i:05d}.csv"), shard, delimiter=",", fmt="%.6g")
    return {"train_rows": len(rows) - n_test, "test_rows": n_test, "shards": num_shards}


def prepare_tfrecords(spark, data_uri: str, num_shards: int = 8, seed: int = 0) -> dict:
    """Write the same split as TFRecords of tf.train.Example (``label``, ``x``) under
    ``data_uri``/train and ``data_uri``/test, from Spark (any filesystem tfos.data reaches)."""
    from tfos import data

    rows, n_test = digits_rows(seed)

    def frame(part, partitions):
        return spark.createDataFrame([(int(r[0]), r[1:].tolist()) for r in part],
                                     "label long, x array<float>").repartition(partitions)

    data.save_as_tfrecords(frame(rows[:n_test], 1), f"{data_uri}/test", mode="overwrite")
    data.save_as_tfrecords(frame(rows[n_test:], num_shards), f"{data_uri}/train", mode="overwrite")
    return {"train_rows": len(rows) - n_test, "test_rows": n_test, "shards": num_shards}


def load_csv(paths):
    data = np.concatenate([np.loadtxt(p, delimiter=",", dtype=np.float32, ndmin=2) for p in paths])
    return data[:, 1:], data[:, 0].astype(np.int64)


def load_tfrecords(files):
    import tensorflow as tf

    from tfos import data

    features = {"label": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([64], tf.float32)}
    parts = list(data.tfrecord_dataset(files, features=features).batch(4096).as_numpy_iterator())
    return np.concatenate([p["x"] for p in parts]), np.concatenate([p["label"] for p in parts])


def local_path(uri: str) -> str | None:
    """The local path of a plain path or file:// URI; None on any other filesystem."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return None if "://" in uri else uri


def load_rank_data(ctx, data_dir: str):
    """This rank's disjoint share of the training shards: CSV on a local filesystem, else TFRecords."""
    local = local_path(data_dir)
    if local is not None:
        files = sorted(glob.glob(os.path.join(local, "train-*.csv")))
        mine = files[ctx.rank::ctx.num_workers]
        return mine, load_csv(mine)
    from tfos import data

    mine = data.rank_files(ctx, f"{data_dir}/train")
    return mine, load_tfrecords(mine)


def load_test(data_dir: str):
    local = local_path(data_dir)
    if local is not None:
        return load_csv([os.path.join(local, "test.csv")])
    from tfos import data

    return load_tfrecords(data.list_files(f"{data_dir}/test"))


def write_file(dir_uri: str, name: str, payload: bytes) -> None:
    """Write ``dir_uri``/``name`` on whatever filesystem holds ``dir_uri`` (through tfos.data)."""
    from tfos import data

    fs, path = data.filesystem(dir_uri)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{name}") as f:
        f.write(payload)


def read_file(dir_uri: str, name: str) -> bytes:
    from tfos import data

    fs, path = data.filesystem(dir_uri)
    with fs.open_input_stream(f"{path}/{name}") as f:
        return f.read()


def build_model():
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)])


def restore_checkpoint(ctx, model, optimizer):
    """Checkpoints in ctx.checkpoint_dir (the same on every attempt): after a restart
    (max_restarts) training resumes from the last one, at its step. Every worker saves (MWMS needs
    all of them); only the chief's copy is kept in checkpoint_dir, the others go to a private temp
    dir. Returns the CheckpointManager and the step training resumes from (0 on a fresh start)."""
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    ckpt_dir = ctx.checkpoint_dir.replace("file://", "")  # local stand-in when it is on hdfs://
    save_dir = ckpt_dir if ctx.is_chief else tempfile.mkdtemp(prefix=f"ckpt-rank{ctx.rank}-")
    manager = tf.train.CheckpointManager(ckpt, save_dir, max_to_keep=2)
    latest = tf.train.latest_checkpoint(ckpt_dir)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
    step = int(optimizer.iterations.numpy())
    print(f"rank {ctx.rank} attempt {ctx.attempt}: starting at step {step}", flush=True)
    return manager, step


def main_fun(args, ctx):
    """Runs on every node, in its TF process. TF_CONFIG is already set by tfos."""
    import tensorflow as tf

    strategy = ctx.strategy()  # MultiWorkerMirroredStrategy with the cluster's CommunicationOptions
    data_dir = ctx.absolute_path(args.data_dir)
    mine, (x, y) = load_rank_data(ctx, data_dir)  # disjoint shards per global rank
    print(f"rank {ctx.rank}/{ctx.num_workers}: {len(mine)} shards, {len(y)} rows", flush=True)

    global_batch = args.batch_size * ctx.num_workers
    steps_per_epoch = args.train_rows // global_batch
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF

    def dataset_fn(_input_context):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=ctx.rank).repeat()
        return ds.batch(args.batch_size).with_options(options)

    dist_ds = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = build_model()
        optimizer = __import__("keras").optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)  # its slots exist before a checkpoint restores them

    manager, resumed_from = restore_checkpoint(ctx, model, optimizer)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(it):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=next(it)), axis=None)

    it = iter(dist_ds)
    steps = resumed_from
    planned = args.epochs * steps_per_epoch
    every = getattr(args, "checkpoint_every", 0) or steps_per_epoch
    total, loss = 0.0, float("nan")
    # TensorBoard: the chief's epoch losses in ctx.log_dir (a node-local mirror when log_dir is on hdfs://)
    writer = tf.summary.create_file_writer(os.path.join(ctx.log_dir, "train")) if ctx.is_chief else None
    while steps < planned:
        loss = float(train_step(it))
        total += loss
        steps += 1
        if steps % 10 == 0:
            ctx.report(step=steps, loss=loss, epoch=steps // steps_per_epoch + 1)  # the driver's progress line
        if steps % every == 0 or steps == planned:
            manager.save(checkpoint_number=steps)
            ctx.checkpoint_saved(steps)  # a safe point: a cluster running smaller grows back here
        if steps % steps_per_epoch == 0:
            print(f"rank {ctx.rank} epoch {steps // steps_per_epoch - 1}: loss {total / steps_per_epoch:.4f}",
                  flush=True)
            if writer is not None:
                with writer.as_default():
                    tf.summary.scalar("loss", total / steps_per_epoch, step=steps)
                writer.flush()
            total = 0.0
    ctx.report(step=steps, loss=loss)

    if getattr(args, "export_dir", None):  # every worker takes part; the chief's copy is kept
        from tfos import compat

        compat.export_saved_model(model, ctx.absolute_path(args.export_dir), ctx.is_chief)
    out_dir = ctx.absolute_path(args.output_dir)
    weights = io.BytesIO()
    np.savez(weights, *[w.numpy() for w in model.weights])
    write_file(out_dir, f"weights-rank{ctx.rank}.npz", weights.getvalue())
    write_file(out_dir, f"attempt-rank{ctx.rank}.json",
               json.dumps({"attempt": ctx.attempt, "resumed_from": resumed_from, "steps": steps}).encode())
    if ctx.is_chief:
        xt, yt = load_test(data_dir)
        pred = np.argmax(model(xt, training=False).numpy(), axis=1)
        acc = float(np.mean(pred == yt))
        write_file(out_dir, "result.json", json.dumps(
            {"accuracy": acc, "test_rows": int(len(yt)), "epochs": args.epochs, "steps": steps,
             "planned_steps": planned, "attempt": ctx.attempt, "resumed_from": resumed_from}).encode())
        print(f"chief: test accuracy {acc:.4f}", flush=True)


def train_single_process(data_dir: str, epochs: int, global_batch: int, learning_rate: float,
                         train_rows: int) -> float:
    """Baseline: the same model, optimizer, global batch and steps in one process, no strategy."""
    import keras
    import tensorflow as tf

    x, y = load_csv(sorted(glob.glob(os.path.join(data_dir, "train-*.csv"))))
    ds = iter(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=0).repeat().batch(global_batch))
    model = build_model()
    optimizer = keras.optimizers.Adam(learning_rate)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, model(xb, training=True),
                                                                               from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for _ in range(epochs * (train_rows // global_batch)):
        step(*next(ds))
    xt, yt = load_csv([os.path.join(data_dir, "test.csv")])
    return float(np.mean(np.argmax(model(xt, training=False).numpy(), axis=1) == yt))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-executors", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--data-dir", default=None, help="directory every node can read (default: a temp dir)")
    p.add_argument("--output-dir", default=None, help="weights, result.json and TensorBoard logs (logs/)")
    p.add_argument("--checkpoint-dir", default=None, help="default: <output-dir>/logs/checkpoint")
    p.add_argument("--export-dir", default=None, help="export the trained model (SavedModel) here")
    p.add_argument("--master", default=None, help="Spark master (default: embedded local-cluster)")
    p.add_argument("--max-restarts", type=int, default=0, help="restart all nodes from the last checkpoint "
                   "after a node failure, up to this many times")
    p.add_argument("--min-executors", type=int, default=None, help="run with as few as this many nodes when Spark "
                   "offers fewer than --num-executors (at the start and after a lost host; docs/elastic.md)")
    return p.parse_args(argv)


def main(argv=None, spark=None) -> float:
    """Train and print the test accuracy; on ``spark`` when given (left running), else on the session
    spark-submit set up, ``--master``'s, or an embedded local-cluster (stopped at the end)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from tfos import InputMode, TFCluster

    own_session = spark is None
    if own_session and args.master:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master(args.master).appName("tfos-digits").getOrCreate()
    elif own_session:
        from tfos.testing import example_session

        spark = example_session(args.num_executors, app_name="tfos-digits")
    from tfos.data.fs import spark_default_fs
    from tfos.data.paths import absolute_path

    default_fs = spark_default_fs(spark.sparkContext)

    def resolve(path):  # on the default filesystem, as the nodes' ctx.absolute_path resolves it
        if path and "://" not in path and not path.startswith("/"):
            path = os.path.abspath(path)
        if not path:
            return path
        uri = absolute_path(path, default_fs, os.getcwd())
        return local_path(uri) or uri  # local files stay plain paths

    base = tempfile.mkdtemp(prefix="tfos-digits-")  # on YARN (fs.defaultFS=hdfs://) this name is used on HDFS
    args.data_dir = resolve(args.data_dir or os.path.join(base, "data"))
    args.output_dir = resolve(args.output_dir or os.path.join(base, "out"))
    args.checkpoint_dir, args.export_dir = resolve(args.checkpoint_dir), resolve(args.export_dir)
    local = local_path(args.data_dir)
    info = prepare_shards(local) if local is not None else prepare_tfrecords(spark, args.data_dir)
    args.train_rows = info["train_rows"]
    cluster = TFCluster.run(spark, main_fun, args, args.num_executors, 0, input_mode=InputMode.TENSORFLOW,
                            master_node="chief", max_restarts=args.max_restarts, min_executors=args.min_executors,
                            log_dir=f"{args.output_dir}/logs", checkpoint_dir=args.checkpoint_dir)
    cluster.shutdown()
    result = json.loads(read_file(args.output_dir, "result.json"))
    print(f"digits: {args.num_executors} nodes, {args.epochs} epochs, test accuracy {result['accuracy']:.4f}")
    if own_session:
        spark.stop()
    return result["accuracy"]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
