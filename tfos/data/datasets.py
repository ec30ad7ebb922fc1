"""tf.data helpers for the TF process."""

from __future__ import annotations


def no_autoshard(ds):
    """``ds`` with ``AutoShardPolicy.OFF``: its data is already this node's shard (a feed, or files
    split per rank), so tf.distribute must not shard it again across the workers."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)
