"""Digits on tfos with Horovod (backend='horovod'), InputMode.TENSORFLOW, Keras fit.

Needs Horovod, which builds only against TF <= 2.15 (see README: the Horovod environment).
tfos runs the Gloo rendezvous on the driver and gives each node its HOROVOD_* environment, so
hvd.init() just works. Each rank reads its own file shards.

    python examples/digits/digits_horovod.py [--compression fp16] [--max-restarts 2]

Rank 0 checkpoints model, optimizer and epoch in ctx.checkpoint_dir after every epoch; every rank
restores the latest one when it starts, so after a node failure (``--max-restarts``) all ranks
resume ``fit`` at the same epoch (ranks resuming at different epochs would wait for each other in
the all-reduce forever).
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
    import glob

    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import digits_tf

    hvd.init()
    files = sorted(glob.glob(os.path.join(args.data_dir, "train-*.csv")))
    x, y = digits_tf.load_csv(files[hvd.rank()::hvd.size()])  # disjoint shards per Horovod rank
    tf.keras.utils.set_random_seed(hvd.rank())  # different init per rank: the broadcast must fix it
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.learning_rate),
                                   compression=ctx.horovod_compression())
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=hvd.rank()).repeat().batch(args.batch_size)
    steps = args.train_rows // (args.batch_size * hvd.size())
    ckpt, manager, first_epoch = restore_checkpoint(ctx, model, opt, rank=hvd.rank())

    def save(epoch, _logs):
        if manager is not None:
            ckpt.epoch.assign(epoch + 1)
            manager.save()
            ctx.checkpoint_saved(epoch + 1)  # a safe point: a smaller cluster grows back here

    from tfos import callbacks

    model.fit(ds, epochs=args.epochs, initial_epoch=first_epoch, steps_per_epoch=steps,
              verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), callbacks.progress(ctx),
                         tf.keras.callbacks.LambdaCallback(on_epoch_end=save)])
    os.makedirs(args.output_dir, exist_ok=True)
    np.savez(os.path.join(args.output_dir, f"weights-rank{hvd.rank()}.npz"), *model.get_weights())
    with open(os.path.join(args.output_dir, f"attempt-rank{hvd.rank()}.json"), "w") as f:
        json.dump({"attempt": ctx.attempt, "first_epoch": first_epoch, "steps": int(opt.iterations.numpy())}, f)
    if hvd.rank() == 0:
        xt, yt = digits_tf.load_csv([os.path.join(args.data_dir, "test.csv")])
        acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
        with open(os.path.join(args.output_dir, "result.json"), "w") as f:
            json.dump({"accuracy": acc, "size": hvd.size(), "attempt": ctx.attempt}, f)


def restore_checkpoint(ctx, model, optimizer, rank: int):
    """The checkpoint of model, optimizer and next epoch in ctx.checkpoint_dir (the same on every
    attempt). Every rank restores the latest one; only rank 0 gets a CheckpointManager to write
    them. Returns (checkpoint, manager or None, the epoch to start at)."""
    import tensorflow as tf

    optimizer.build(model.trainable_variables)  # its slots exist before the restore fills them
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=tf.Variable(0, dtype=tf.int64))
    ckpt_dir = ctx.checkpoint_dir.replace("file://", "", 1)  # local stand-in when it is on hdfs://
    latest = tf.train.latest_checkpoint(ckpt_dir)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=2) if rank == 0 else None
    return ckpt, manager, int(ckpt.epoch.numpy())


def main(argv=None, spark=None) -> float:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--compression", choices=("none", "fp16"), default="none")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--timeline", default=None, help="Horovod timeline file name under the log dir")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--max-restarts", type=int, default=0, help="restart all nodes from the last checkpoint after "
                   "a node failure, up to this many times")
    args = p.parse_args(argv)
    import digits_tf
    from tfos import InputMode, TFCluster

    base = tempfile.mkdtemp(prefix="tfos-digits-hvd-")
    args.data_dir = os.path.join(base, "data")
    args.output_dir = os.path.abspath(args.output_dir or os.path.join(base, "out"))
    args.train_rows = digits_tf.prepare_shards(args.data_dir)["train_rows"]
    own = spark is None
    if own:
        from tfos.testing import local_cluster_session

        spark = local_cluster_session(2, app_name="tfos-digits-horovod")
    # Horovod's own collectives travel between hosts in clear (tfos cannot carry them in its tunnels):
    # with encryption on (the default) tfos refuses them unless told so; its own channels stay encrypted
    cluster = TFCluster.reserve(spark.sparkContext, 2, 0, master_node="chief", backend="horovod",
                                allow_unprotected=True, max_restarts=args.max_restarts,
                                log_dir=os.path.abspath(args.log_dir or base),
                                backend_options={"compression": args.compression, "timeline": args.timeline})
    cluster.start(main_fun, args, input_mode=InputMode.TENSORFLOW)
    cluster.shutdown(timeout=600)
    if own:
        spark.stop()
    with open(os.path.join(args.output_dir, "result.json")) as f:
        acc = json.load(f)["accuracy"]
    print(f"digits (horovod, compression={args.compression}): test accuracy {acc:.4f}; output in {args.output_dir}")
    return acc


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
