"""Digits with Keras ``model.fit`` on 2 tfos nodes, InputMode.TENSORFLOW (per-rank file shards).

* ``--keras 3`` (default): Keras 3 has no working ``fit`` under MultiWorkerMirroredStrategy
  (keras-team/keras#20585), so the model is built without any strategy and
  ``tfos.keras_dist.DistributedOptimizer`` averages gradients with TF collective ops, Horovod-style;
  ``BroadcastInitialWeights`` makes every rank start from rank 0's weights.
* ``--keras 2``: tf_keras (``TF_USE_LEGACY_KERAS=1``) ``fit`` inside MultiWorkerMirroredStrategy.

    python examples/digits/digits_keras_fit.py [--keras 2] [--compression fp16] [--max-restarts 2]

Each epoch is backed up in ctx.checkpoint_dir (``BackupAndRestore``); after a node failure with
``--max-restarts``, every node starts again and ``fit`` resumes at the epoch after the last backup.
A node told to go (an eviction notice) makes every rank back up at the same step first
(``tfos.callbacks.save_before_eviction``): with Keras 3 ``fit`` resumes in that epoch, with tf_keras
(``BackupAndRestore(save_before_preemption=True)``, TF's own handler) at the batch after it.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import tempfile

import numpy as np


def main_fun(args, ctx):
    import digits_tf

    backup_dir = ctx.checkpoint_dir  # a local stand-in when checkpoint_dir is on hdfs://
    epochs_run = []  # the epochs this attempt trained (a restart resumes after the last backup)
    first_step = []  # the optimizer's step count this attempt started from (restored)

    files = sorted(glob.glob(os.path.join(args.data_dir, "train-*.csv")))
    x, y = digits_tf.load_csv(files[ctx.rank::ctx.num_workers])
    n = (args.rows_per_rank // args.batch_size) * args.batch_size  # same step count on every rank
    x, y = x[:n], y[:n]
    if args.keras == "3":
        from tfos import keras_dist

        rank, _size = keras_dist.init_collectives()  # before any other TF call
        import keras

        from tfos import callbacks

        keras.utils.set_random_seed(rank)
        model = digits_tf.build_model()
        opt = keras_dist.DistributedOptimizer(keras.optimizers.Adam(args.learning_rate),
                                              compression=args.compression)
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        backup = keras_dist.BackupAndRestore(backup_dir)
        model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
                  callbacks=[backup, keras_dist.BroadcastInitialWeights(0),
                             keras_dist.MetricAverageCallback(), callbacks.progress(ctx, keras_module=keras),
                             callbacks.save_before_eviction(ctx, backup),  # a node told to go: save first
                             keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, _logs: epochs_run.append(e),
                                                            on_train_begin=lambda _logs: first_step.append(
                                                                int(model.optimizer.iterations.numpy())))])
    else:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf

        from tfos import callbacks

        strategy = ctx.strategy()
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                         tf.keras.layers.Dense(10)])
            model.compile(optimizer=tf.keras.optimizers.Adam(args.learning_rate),
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(args.batch_size).with_options(options)
        # save_before_preemption: a node told to go makes every rank save at one step (TF's
        # PreemptionCheckpointHandler, driven by tfos's notice), and fit resumes at the batch after it
        backup = tf.keras.callbacks.BackupAndRestore(backup_dir.replace("file://", "", 1), save_before_preemption=True)
        model.fit(ds, epochs=args.epochs, verbose=0,
                  callbacks=[backup, callbacks.save_before_eviction(ctx, backup), callbacks.progress(ctx),
                             tf.keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, _logs: epochs_run.append(e),
                                                               on_train_begin=lambda _logs: first_step.append(
                                                                   int(model.optimizer.iterations.numpy())))])
    xt, yt = digits_tf.load_csv([os.path.join(args.data_dir, "test.csv")])
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    np.savez(os.path.join(args.output_dir, f"weights-rank{ctx.rank}.npz"), *model.get_weights())
    if ctx.is_chief:
        with open(os.path.join(args.output_dir, "result.json"), "w") as f:
            json.dump({"accuracy": acc, "attempt": ctx.attempt, "epochs_run": epochs_run, "first_step": first_step[0]},
                      f)


def main(argv=None, spark=None) -> float:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keras", choices=("2", "3"), default="3")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--compression", choices=("fp16",), default=None)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--max-restarts", type=int, default=0, help="restart all nodes from the last backup after a "
                   "node failure, up to this many times")
    args = p.parse_args(argv)
    import digits_tf
    from tfos import TFCluster
    from tfos.testing import example_session

    base = tempfile.mkdtemp(prefix="tfos-digits-fit-")
    args.data_dir = os.path.join(base, "data")
    args.output_dir = os.path.abspath(args.output_dir or os.path.join(base, "out"))
    os.makedirs(args.output_dir, exist_ok=True)
    args.rows_per_rank = digits_tf.prepare_shards(args.data_dir)["train_rows"] // 2 - 40
    own = spark is None
    spark = spark or example_session(2, app_name="tfos-digits-fit")
    cluster = TFCluster.reserve(spark.sparkContext, 2, 0, max_restarts=args.max_restarts)
    cluster.start(main_fun, args)
    cluster.shutdown(timeout=600)
    if own:
        spark.stop()
    with open(os.path.join(args.output_dir, "result.json")) as f:
        acc = json.load(f)["accuracy"]
    print(f"digits (Keras {args.keras} model.fit on 2 nodes): test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
