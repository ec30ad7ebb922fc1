"""Input helpers for InputMode.TENSORFLOW: every TF process reads its own share of the files.

Inside ``main_fun(args, ctx)``::

    from tfos import data

    files = data.rank_files(ctx, "hdfs://nn:8020/data/train", pattern="*.parquet")
    ds = data.parquet_dataset(files, columns=["features", "label"], batch_size=64)

What is here:

* **Listing** -- :func:`list_files` / :func:`list_files_with_sizes` list a directory given as
  ``hdfs://``, ``viewfs://``, ``file://``, other pyarrow URIs (``s3://``, ``gs://``) or a plain
  local path, through pyarrow's filesystem layer. Hidden entries (``_SUCCESS``, ``_temporary/``,
  ``.crc`` files: names starting with ``_`` or ``.``) are skipped. TensorFlow 2.21 itself has no
  ``hdfs://`` filesystem any more, which is why listing and reading go through pyarrow.
* **Sharding** -- :func:`shard` (round robin) and :func:`shard_by_size` (greedy by bytes) give
  each global rank a disjoint, balanced subset; :func:`rank_files` lists and shards in one call.
* **Readers** -- :func:`tfrecord_dataset`, :func:`parquet_dataset`, :func:`csv_dataset` return
  ``tf.data.Dataset`` objects. TensorFlow is imported only inside these functions: importing
  ``tfos.data`` does not import TensorFlow (Spark executors and the driver stay light).
* **Files** -- :func:`filesystem` gives the pyarrow filesystem and path of any path or URI
  above, for small files of your own next to the data (a result, a manifest).
* **Spark DataFrame <-> TFRecord** -- :func:`save_as_tfrecords` writes ``tf.train.Example``
  records (encoded with the protobuf library, no TensorFlow on the executors) and :func:`load_tfrecords`
  reads them back; :func:`encode_example` / :func:`decode_example` are the codec they use.

Why every dataset here has ``AutoShardPolicy.OFF``: the files are already split per rank.
Under a ``tf.distribute`` strategy, tf.data's default (AUTO) sharding would shard each worker's
dataset *again*; for generator-based datasets it falls back to sharding by element, so every
worker silently keeps only every N-th element of its own data and (N-1)/N of the data is lost
without a warning. The readers therefore set ``options.experimental_distribute.auto_shard_policy
= AutoShardPolicy.OFF``; keep it if you rebuild or wrap these datasets.

Keep the shards balanced: in synchronous training (MultiWorkerMirroredStrategy) a worker that
runs out of data first blocks the others when a fixed ``steps_per_epoch`` asks for more batches
than its shard has; iterate the distributed dataset to exhaustion, or size ``steps_per_epoch`` by
the smallest shard.

Modules, by the process that runs them: ``fs`` (URIs -> pyarrow filesystems, Hadoop client help;
every process), ``sharding`` (listing and sharding; driver and TF processes), ``readers`` (tf.data
readers; TF process), ``example`` (the tf.train.Example codec), ``tfrecord`` (TFRecord framing and
record files) and ``spark_io`` (DataFrame <-> TFRecord; driver and Spark tasks). Importing this
package imports neither TensorFlow nor pyspark.
"""

from tfos import lazy

# Exported lazily (PEP 562), so ``tfos.data.paths`` or ``tfos.data.fs`` can be imported by the
# driver, the agent or a TF process without loading the readers, numpy or pyarrow.
_EXPORTS = {
    "example": ("KINDS", "decode_example", "encode_example"),
    "fs": ("filesystem",),
    "readers": ("csv_dataset", "parquet_dataset", "tfrecord_dataset"),
    "sharding": ("list_files", "list_files_with_sizes", "rank_files", "shard", "shard_by_size"),
    "spark_io": ("load_tfrecords", "save_as_tfrecords"),
    "tfrecord": ("iter_tfrecords", "tfrecord_frame"),
}
__getattr__, __dir__ = lazy.exports(__name__, globals(), {
    name: f"tfos.data.{module}" for module, names in _EXPORTS.items() for name in names})


__all__ = [name for names in _EXPORTS.values() for name in names]
