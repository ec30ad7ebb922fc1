"""Helpers for programs migrating from TensorFlowOnSpark. Runs in the TF process."""

from __future__ import annotations

import tempfile


def export_saved_model(model, export_dir: str, is_chief: bool = False) -> str | None:
    """Export ``model`` as a SavedModel on the chief only.

    Every worker of a multi-worker strategy must take part in saving (TF writes the variables
    collectively), so non-chief nodes save to a private temporary directory that is removed
    afterwards; only the chief's export lands in ``export_dir``. Returns the path written on the
    chief, None elsewhere. Works with tf_keras/Keras 2 models (``tf.saved_model.save``) and
    Keras 3 models (``model.export``).
    """
    import tensorflow as tf

    target = export_dir if is_chief else tempfile.mkdtemp(prefix="tfos-export-")
    try:
        if hasattr(model, "export") and not hasattr(model, "_get_save_spec"):
            model.export(target)  # Keras 3
        else:
            tf.saved_model.save(model, target)
    finally:
        if not is_chief and tf.io.gfile.exists(target):
            tf.io.gfile.rmtree(target)
    return export_dir if is_chief else None


class TFNode:
    """TensorFlowOnSpark's ``TFNode`` module as a namespace, so ``from tfos import TFNode`` and
    ``TFNode.DataFeed(ctx.mgr, train_mode, qname_in, qname_out, input_mapping)`` keep working."""

    @staticmethod
    def DataFeed(mgr, train_mode=True, qname_in="input", qname_out="output", input_mapping=None):  # noqa: N802
        from tfos.node.datafeed import DataFeed

        return DataFeed(mgr, train_mode, qname_in, qname_out, input_mapping)

    @staticmethod
    def hdfs_path(ctx, path):
        return ctx.absolute_path(path)
