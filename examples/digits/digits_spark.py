"""Digits on tfos, InputMode.SPARK: Spark streams the training data (a DataFrame or an RDD)
into 2 worker nodes training with MultiWorkerMirroredStrategy, then the same nodes answer
cluster.inference() over the test rows (a DataFrame gains a prediction column; an RDD gives an
RDD of predictions), and the predictions are written out.

    python examples/digits/digits_spark.py --source dataframe     # or --source rdd
    python examples/digits/digits_spark.py --remote local-cluster  # over Spark Connect (or sc://host:15002)
    python examples/digits/digits_spark.py --max-restarts 2        # survive node failures: resume from checkpoints

    spark-submit --master yarn --deploy-mode cluster --py-files examples/digits/digits_tf.py \
        examples/digits/digits_spark.py --input hdfs:///user/me/digits.parquet \
        --checkpoint-dir hdfs:///user/me/ckpt --log-dir hdfs:///user/me/logs --export-dir hdfs:///user/me/model

``--input`` reads the training rows from Parquet (``features array<float>, label long``; written
there first from scikit-learn's digits when the path does not exist yet). The nodes import
digits_tf (its checkpoint helper): under spark-submit on a real cluster, ship it with
``--py-files examples/digits/digits_tf.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

import numpy as np


def main_fun(args, ctx):
    """Runs in each node's TF process: train from the fed data, then serve inference."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch_size * ctx.num_workers
    spec = (tf.TensorSpec((None, 64), tf.float32), tf.TensorSpec((None,), tf.int64))
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)  # its slots exist before a checkpoint restores them

    # Checkpoints in ctx.checkpoint_dir: after a restart (max_restarts) the model resumes from the
    # last one, and train() feeds the rest of the interrupted epoch: every rank tells the driver
    # after each save how many rows of the feed its steps took (ctx.checkpoint_saved).
    import digits_tf

    manager, _step = digits_tf.restore_checkpoint(ctx, model, optimizer)
    every = getattr(args, "checkpoint_every", 50)

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    steps = 0
    for _ in range(getattr(args, "train_calls", 1)):  # one feed per cluster.train() call
        feed = ctx.get_data_feed(train_mode=True)
        # Each node's feed is its own shard: AutoShardPolicy.OFF is set by feed.dataset().
        dist_ds = strategy.distribute_datasets_from_function(lambda _: feed.dataset(args.batch_size, spec))
        feed_steps = 0
        for batch in dist_ds:  # iterate to exhaustion: uneven feeds end together, no hang
            loss = train_step(batch)
            steps += 1
            feed_steps += 1
            if steps % 50 == 0:
                ctx.report(step=steps, loss=float(loss), attempt=ctx.attempt)
            done = int(optimizer.iterations.numpy())
            if every and done % every == 0:
                manager.save(checkpoint_number=done)
                # tf.data reads ahead of the steps: say how many rows they took (the feed's position)
                ctx.checkpoint_saved(done, rows=feed_steps * args.batch_size)
        print(f"node {ctx.node_index}: trained {steps} steps, {feed.rows_read} rows of this feed", flush=True)

    if getattr(args, "export_dir", None):  # every worker takes part; the chief's copy is kept
        from tfos import compat

        compat.export_saved_model(model, ctx.absolute_path(args.export_dir), ctx.is_chief)

    # Inference: answer every fed row with the predicted class, until the cluster shuts down.
    infer = ctx.get_data_feed(train_mode=False)
    for x, _label in infer.batches(256):
        infer.batch_results(np.argmax(model(x, training=False).numpy(), axis=1))


def load(seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test = len(y) // 4
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def read_input(spark, path: str, x, y):
    """The training DataFrame from Parquet at ``path``, written there first if it does not exist."""
    from pyspark.sql.utils import AnalysisException

    try:
        return spark.read.parquet(path)
    except AnalysisException as e:
        if "PATH_NOT_FOUND" not in str(e) and "does not exist" not in str(e):
            raise
    spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(x, y)],
                          "features array<float>, label long").write.parquet(path)
    return spark.read.parquet(path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=("dataframe", "rdd"), default="dataframe")
    p.add_argument("--num-executors", type=int, default=2)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--output-dir", default=None, help="where predictions are written")
    p.add_argument("--max-restarts", type=int, default=0, help="restart all nodes from the last checkpoint "
                   "after a node failure, up to this many times")
    p.add_argument("--input", default=None, help="Parquet training rows on any filesystem Spark reads (hdfs://...)")
    p.add_argument("--checkpoint-dir", default=None, help="default: <log-dir>/checkpoint")
    p.add_argument("--log-dir", default=None, help="the nodes' ctx.log_dir (default: a temp dir)")
    p.add_argument("--export-dir", default=None, help="export the trained model (SavedModel) here")
    p.add_argument("--remote", default=None, help="run over Spark Connect: sc://host:15002, or local-cluster for an "
                   "embedded Connect server (DataFrames only: --source dataframe)")
    return p.parse_args(argv)


def main(argv=None, spark=None) -> float:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from tfos import InputMode, TFCluster

    own_session = spark is None
    if own_session:
        from tfos.testing import example_session

        spark = example_session(args.num_executors, app_name="tfos-digits-spark", remote=args.remote)
    (xtr, ytr), (xte, yte) = load()
    out = args.output_dir or tempfile.mkdtemp(prefix="tfos-digits-preds-")
    path = os.path.join(out, "predictions")
    if args.input:
        train = read_input(spark, args.input, xtr, ytr).repartition(6)
    elif args.source == "dataframe":
        train = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(xtr, ytr)],
                                      "features array<float>, label long").repartition(6)
    else:
        train = spark.sparkContext.parallelize(list(zip(xtr, ytr.tolist())), 6)
    cluster = TFCluster.run(spark, main_fun, args, args.num_executors, 0, input_mode=InputMode.SPARK,
                            master_node="chief", max_restarts=args.max_restarts, log_dir=args.log_dir,
                            checkpoint_dir=args.checkpoint_dir)
    try:
        cluster.train(train, num_epochs=args.epochs)
        if args.source == "dataframe":
            test = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(xte, yte)],
                                         "features array<float>, label long").repartition(4)
            cluster.inference(test, output_type="long").select("label", "prediction").write.json(path)
            pairs = [r.asDict() for r in spark.read.json(path).collect()]
        else:
            test = spark.sparkContext.parallelize(list(zip(xte, yte.tolist())), 4)
            preds = cluster.inference(test)
            test.map(lambda r: r[1]).zip(preds).map(
                lambda lp: json.dumps({"label": lp[0], "prediction": int(lp[1])})).saveAsTextFile(path)
            pairs = [json.loads(s) for s in spark.sparkContext.textFile(path).collect()]
    finally:
        cluster.shutdown(timeout=600)
    acc = float(np.mean([p["label"] == p["prediction"] for p in pairs]))
    print(f"digits ({args.source} feed): {len(pairs)} predictions written to {path}; test accuracy {acc:.4f}")
    if own_session:
        spark.stop()
    return acc


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
