"""Helpers for programs migrating from TensorFlowOnSpark. Runs in the TF process."""

from __future__ import annotations

import tempfile



def _is_keras2(model) -> bool:
    """tf_keras / Keras 2 models (``model.save(..., save_format='tf')`` exists) vs Keras 3 (whose
    models may have Keras 2's private methods too: decided by the package and its version)."""
    import sys

    root = type(model).__module__.split(".")[0]
    if root in ("tf_keras", "keras_2"):
        return True
    return root == "keras" and str(getattr(sys.modules.get("keras"), "__version__", "3")).startswith("2.")


def export_saved_model(model, export_dir: str, is_chief: bool = False) -> str | None:
    """Export ``model`` as a SavedModel; only the chief's copy lands in ``export_dir``.

    Keras 2 (tf_keras) models are written as TensorFlowOnSpark wrote them,
    ``model.save(export_dir, save_format='tf')``, so ``tf.keras.models.load_model(export_dir)``
    loads them back as Keras models. Keras 3 models are written with ``model.export`` (a serving
    SavedModel: ``tf.saved_model.load`` or ``keras.layers.TFSMLayer``; Keras 3 no longer writes
    the Keras-loadable SavedModel format). Other trackables go through ``tf.saved_model.save``.

    Every worker of a multi-worker strategy must take part in saving (TF writes variables
    collectively), so non-chief nodes save to a private temporary directory that is removed
    afterwards (TensorFlowOnSpark left a ``worker_model`` directory in the working directory).
    Returns the path written on the chief, None elsewhere. An ``export_dir`` on hdfs://,
    viewfs:// or s3:// (which TensorFlow cannot open) is written to a local temporary directory
    and uploaded (:mod:`tfos.cluster.node.staging`).
    """
    import tensorflow as tf

    from tfos.cluster.node.staging import Mirror, needs_staging

    remote = is_chief and needs_staging(export_dir)  # hdfs://, viewfs://, s3://: TF cannot write there
    target = export_dir if is_chief and not remote else tempfile.mkdtemp(prefix="tfos-export-")
    try:
        if _is_keras2(model):
            model.save(target, save_format="tf")
        elif hasattr(model, "export"):
            model.export(target)  # Keras 3
        else:
            tf.saved_model.save(model, target)
        if remote:  # written locally, then uploaded file by file (each renamed into place)
            Mirror(export_dir, target, delete=False).close()
    finally:
        if (remote or not is_chief) and tf.io.gfile.exists(target):
            tf.io.gfile.rmtree(target)
    return export_dir if is_chief else None


def disable_auto_shard(options) -> None:
    """Turn off tf.data auto-sharding on ``options`` (a ``tf.data.Options``), as TensorFlowOnSpark
    did: each node's feed already holds only its own rows."""
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """True if TensorFlow sees at least one GPU in this process."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) > 0
