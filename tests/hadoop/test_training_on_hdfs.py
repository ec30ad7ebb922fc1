"""A tfos training whose checkpoint_dir, log_dir and export are on hdfs://, on TF 2.21 with Keras 3
(tfos.keras_dist) and with tf_keras under MultiWorkerMirroredStrategy: rank 1 dies after a
backup, the cluster restarts, the new attempt resumes from the backup on HDFS, and FsShell (not
tfos) finds the backups, the TensorBoard events and the SavedModel there."""

import json
import os
import re

import pytest

from tfos import TFCluster

pytestmark = pytest.mark.slow
EPOCHS = 3  # the second attempt resumes at epoch 2, the last
DIE_AFTER_EPOCH = 1  # on the first attempt, rank 1 dies once this epoch's backup is on HDFS


def train(args, ctx):
    import time

    import numpy as np
    from sklearn.datasets import load_digits

    from tfos import compat

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    n = (len(x) // 2 // 32) * 32  # the same number of steps on both ranks
    x, y = x[ctx.rank * n:(ctx.rank + 1) * n], y[ctx.rank * n:(ctx.rank + 1) * n]
    epochs_run = []

    def on_epoch_end(epoch, _logs):
        if ctx.attempt == 0 and ctx.rank == 1 and epoch == DIE_AFTER_EPOCH:
            time.sleep(4)  # rank 0's staging mirror uploads the backup (it polls every second)
            os._exit(3)

    if args["keras"] == "3":
        from tfos import keras_dist

        keras_dist.init_collectives()
        import keras

        keras.utils.set_random_seed(ctx.rank)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=keras_dist.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [keras_dist.BackupAndRestore(ctx.checkpoint_dir), keras_dist.BroadcastInitialWeights(0)]
        ds = (x, y)
    else:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf

        keras = tf.keras
        with ctx.strategy().scope():
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(10)])
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [keras.callbacks.BackupAndRestore(ctx.checkpoint_dir)]
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = (tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options),)
    callbacks += [keras.callbacks.TensorBoard(os.path.join(ctx.log_dir, f"rank{ctx.rank}")),
                  keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, _l: epochs_run.append(e),
                                                 on_epoch_end=on_epoch_end)]
    if len(ds) == 2:
        model.fit(*ds, batch_size=32, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    else:
        model.fit(ds[0], epochs=EPOCHS, verbose=0, callbacks=callbacks)
    assert ctx.checkpoint_uri.startswith("hdfs://") and not ctx.checkpoint_dir.startswith("hdfs://")
    compat.export_saved_model(model, args["export"], ctx.is_chief)
    loss = model.evaluate(x, y, verbose=0)  # every rank: under MWMS evaluate runs collectives
    if ctx.is_chief:
        with open(args["result"], "w") as f:
            json.dump({"attempt": ctx.attempt, "epochs_run": epochs_run, "loss_finite": bool(np.isfinite(loss))}, f)


@pytest.mark.parametrize("keras_version", ["3", "2"])
def test_checkpoints_logs_and_export_on_hdfs_survive_a_restart(hadoop, sc, tmp_path, keras_version):
    base = f"/runs/keras{keras_version}"
    uri = f"{hadoop.default_fs}{base}"
    args = {"keras": keras_version, "export": f"{uri}/export", "result": str(tmp_path / "result.json")}
    cluster = TFCluster.reserve(sc, 2, 0, checkpoint_dir=f"{uri}/ckpt", log_dir=f"{uri}/logs", max_restarts=1,
                                restart_backoff=0, progress=False, reservation_timeout=300)
    cluster.start(train, args)
    cluster.shutdown(timeout=900)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["attempt"] == 1 and result["loss_finite"]
    assert result["epochs_run"][0] > 0, result  # resumed from the backup on HDFS, not from epoch 0
    assert result["epochs_run"][-1] == EPOCHS - 1
    assert 1 in [r.node_index for r in cluster.restarts]  # rank 0 may fail by itself in its collective too
    listing = hadoop.fs("-ls", "-R", base).stdout
    assert f"{base}/ckpt/" in listing, listing  # the backup
    for rank in (0, 1):  # tf_keras under MWMS writes a worker's events under workertemp_<i>/
        assert re.search(rf"{base}/logs/rank{rank}/\S*events\.out\.tfevents", listing), listing
    assert f"{base}/export/saved_model.pb" in listing and f"{base}/export/variables/" in listing, listing
    assert ".tfos-upload-" not in listing
