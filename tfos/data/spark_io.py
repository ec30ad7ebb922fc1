"""Spark DataFrame <-> TFRecord files of ``tf.train.Example``.

:func:`save_as_tfrecords` and :func:`load_tfrecords` run on the driver (they check the schema,
prepare the output directory and start the Spark job); ``_write_partition`` and ``_decode_file``
run in the Spark tasks on the executors, which need neither TensorFlow nor generated protobuf
classes. pyspark is imported only inside these functions.
"""

from __future__ import annotations

import functools
import io
import logging
import posixpath
import uuid
from collections.abc import Iterator

import numpy as np

from tfos.data.example import _serialize_example, decode_example
from tfos.data.equal import write_counts
from tfos.data.fs import _file_list, _is_hidden, _join, _local_path, _resolve, _scheme, _to_uri
from tfos.data.tfrecord import (_choose_engine, _compression_of, _decompressing, _norm_compression,
                                _write_tfrecord_file, iter_tfrecords)
from tfos.errors import ConfigError, remote_error

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- writing

def _plan(schema, kind_of, unsupported: str) -> list[tuple[str, str, str]]:
    """``[(name, kind, mode)]`` for a Spark StructType. ``kind_of(dataType)`` gives a column's kind
    (None: not supported, ConfigError with ``unsupported`` formatted with the name and type); mode
    is 'scalar', 'list' (arrays of a supported type) or 'vector' (ML vectors, kind 'float')."""
    from pyspark.sql import types as T

    plan = []
    for field in schema.fields:
        dt = field.dataType
        if kind_of(dt):
            plan.append((field.name, kind_of(dt), "scalar"))
        elif isinstance(dt, T.ArrayType) and kind_of(dt.elementType):
            plan.append((field.name, kind_of(dt.elementType), "list"))
        elif type(dt).__name__ == "VectorUDT":
            plan.append((field.name, "float", "vector"))
        else:
            raise ConfigError(unsupported.format(name=field.name, type=dt.simpleString()))
    return plan


def _encode_plan(schema) -> list[tuple[str, str, str]]:
    """``[(name, kind, mode)]`` for a Spark StructType; mode is 'scalar', 'list' or 'vector'."""
    from pyspark.sql import types as T

    def kind_of(dt):
        if isinstance(dt, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return "int64"
        if isinstance(dt, (T.FloatType, T.DoubleType)):
            return "float"
        if isinstance(dt, (T.StringType, T.BinaryType)):
            return "bytes"
        return None

    return _plan(schema, kind_of, "column {name!r} has type {type}, which has no tf.train.Example feature. Cast it "
                 "first (timestamps/dates to long, decimals to double, nested arrays and structs to flat columns) "
                 "or drop it.")


def _encode_row(row, plan) -> bytes:
    items = []
    for value, (name, kind, mode) in zip(row, plan):
        if value is None:
            continue
        if mode == "scalar":
            values = [value]
        elif mode == "vector":
            values = np.asarray(value.toArray()).reshape(-1)
        else:
            values = value
            if any(v is None for v in values):
                raise ConfigError(f"column {name!r} holds an array with a null element; fill or drop those first")
        items.append((name, kind, values))
    return _serialize_example(items)


def _task_attempt() -> str:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None:
            return str(tc.taskAttemptId())
    except ImportError:
        pass
    return uuid.uuid4().hex[:12]


def _write_partition(spec: dict, index: int, rows) -> list[tuple[str, int]]:
    """Spark task body of :func:`save_as_tfrecords`: one TFRecord file per non-empty partition.
    Writes ``_temporary/<attempt>-part-NNNNN`` then renames it, so retries do not leave torn files."""
    from pyarrow import fs as pafs

    fs, base, prefix = _resolve(spec["uri"])
    compression = spec["compression"]
    name = f"part-{index:05d}.tfrecord" + {"GZIP": ".gz", "ZLIB": ".zlib"}.get(compression, "")
    tmp_dir = _join(base, "_temporary")
    fs.create_dir(tmp_dir, recursive=True)
    tmp = _join(tmp_dir, f"{_task_attempt()}-{name}")
    records = (_encode_row(row, spec["plan"]) for row in rows)
    count = _write_tfrecord_file(fs, tmp, records, compression, spec["engine"])
    if not count:
        fs.delete_file(tmp)
        return []
    final = _join(base, name)
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        fs.delete_file(final)
    fs.move(tmp, final)
    return [(_to_uri(prefix, final), count)]


def _prepare_output(fs, path: str, uri: str, mode: str) -> None:
    from pyarrow import fs as pafs

    if mode not in ("error", "errorifexists", "overwrite"):
        raise ConfigError(f"mode must be 'error' or 'overwrite', got {mode!r}")
    if path.rstrip("/") in ("", "/"):
        raise ConfigError(f"refusing to write TFRecords into the root directory {uri!r}; choose a subdirectory")
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.NotFound:
        if mode == "overwrite":
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(path)
            else:
                fs.delete_file(path)
        elif info.type != pafs.FileType.Directory or fs.get_file_info(pafs.FileSelector(path)):
            raise ConfigError(f"{uri} already exists; pass mode='overwrite' to replace it, or choose another path")
    fs.create_dir(path, recursive=True)


def _remove_temporary(fs, path: str) -> None:
    from pyarrow import fs as pafs

    tmp = _join(path, "_temporary")
    if fs.get_file_info(tmp).type == pafs.FileType.Directory:
        fs.delete_dir(tmp)


def _commit_output(fs, path: str) -> None:
    _remove_temporary(fs, path)
    with fs.open_output_stream(_join(path, "_SUCCESS"), compression=None):
        pass


def _task_error(e: BaseException) -> BaseException:
    """The tfos error a Spark task raised (see :func:`tfos.errors.remote_error`), else ``e`` itself."""
    err = remote_error(e)
    return e if err is None else type(err)(f"{err} (raised in a Spark task)")


def _warn_if_node_local(spark_context, uri: str) -> None:
    master = getattr(spark_context, "master", "") or ""
    if _local_path(uri) is not None and not master.startswith("local"):
        logger.warning("%s is a local path and the Spark master is %s: every executor uses its own disk unless "
                       "the path is a shared mount (NFS); use an hdfs:// URI otherwise", uri, master)


def save_as_tfrecords(df, uri, mode: str = "error", compression=None, engine: str = "auto") -> list[tuple[str, int]]:
    """Write Spark DataFrame ``df`` as TFRecord files of ``tf.train.Example`` under directory ``uri``.

    One file ``part-NNNNN.tfrecord[.gz|.zlib]`` per non-empty partition (repartition first to
    choose the file count: at least, ideally a multiple of, the number of TF workers), plus a
    ``_SUCCESS`` marker. Column types: boolean/integral -> int64 feature, float/double -> float
    feature (float32), string/binary -> bytes feature, arrays of these -> lists, Spark ML vectors
    -> dense float lists; nulls leave the feature out. Examples are encoded with the protobuf
    library (no TensorFlow on executors); files go through pyarrow, so hdfs:// needs a Hadoop
    client on the driver and executors (see :class:`~tfos.errors.HadoopConfigError`).
    ``engine``: ``'python'`` frames records with the C CRC-32C of google-crc32c; ``'tensorflow'``
    writes with TensorFlow's TFRecordWriter (TF needed on the executors); ``'auto'`` is ``'python'``.

    ``mode``: ``'error'`` (default; raise ConfigError if ``uri`` exists and is not empty) or
    ``'overwrite'``. ``compression``: None, ``'GZIP'`` or ``'ZLIB'``. Returns
    ``[(file_uri, num_records)]`` sorted by file. Plain paths are local paths (as in pyarrow),
    not paths on Spark's default filesystem: use explicit URIs for HDFS.
    """
    plan = _encode_plan(df.schema)
    compression = _norm_compression(compression)
    _choose_engine(engine)
    fs, path, prefix = _resolve(uri)
    target = _to_uri(prefix, path)
    _prepare_output(fs, path, target, mode)
    _warn_if_node_local(df.sparkSession.sparkContext, target)
    spec = {"uri": target, "plan": plan, "compression": compression, "engine": engine}
    try:
        written = df.rdd.mapPartitionsWithIndex(functools.partial(_write_partition, spec)).collect()
    except Exception as e:
        try:
            _remove_temporary(fs, path)
        except Exception:  # best effort: the original error matters more
            logger.debug("could not remove %s/_temporary", target, exc_info=True)
        err = _task_error(e)
        if err is e:
            raise
        raise err from e
    written.sort()
    write_counts(fs, path, written)  # lets the readers count records without reading them (equal steps)
    _commit_output(fs, path)
    logger.info("wrote %d records in %d TFRecord files under %s", sum(n for _, n in written), len(written), target)
    return written


# --------------------------------------------------------------------------- reading

def _decode_plan(schema) -> list[tuple[str, str, str]]:
    """``[(name, target, mode)]``; target is int, bool, float, str or bytes; mode scalar/list/vector."""
    from pyspark.sql import types as T

    def target_of(dt):
        if isinstance(dt, T.BooleanType):
            return "bool"
        if isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return "int"
        if isinstance(dt, (T.FloatType, T.DoubleType)):
            return "float"
        if isinstance(dt, T.StringType):
            return "str"
        if isinstance(dt, T.BinaryType):
            return "bytes"
        return None

    return _plan(schema, target_of, "column {name!r}: type {type} cannot be read from a tf.train.Example; use "
                 "boolean, integral, float/double, string, binary, arrays of these, or ml VectorUDT")


def _cast(name: str, target: str, v):
    if target == "int" or target == "bool":
        if not isinstance(v, int):
            raise ConfigError(f"feature {name!r} holds {type(v).__name__} values but the schema declares an "
                              "integral type; declare float/double instead")
        return bool(v) if target == "bool" else v
    if target == "float":
        if isinstance(v, bytes):
            raise ConfigError(f"feature {name!r} holds bytes but the schema declares a float type")
        return float(v)
    if not isinstance(v, bytes):
        raise ConfigError(f"feature {name!r} holds {type(v).__name__} values but the schema declares "
                          f"{'string' if target == 'str' else 'binary'}")
    return v.decode("utf-8") if target == "str" else v


def _example_to_row(features: dict, plan) -> tuple:
    out = []
    for name, target, mode in plan:
        values = features.get(name)
        if values is None:
            out.append(None)
        elif mode == "scalar":
            if len(values) > 1:
                raise ConfigError(f"feature {name!r} has {len(values)} values but the schema declares a single "
                                  "value; declare it as an array (ArrayType) instead")
            out.append(_cast(name, target, values[0]) if values else None)
        elif mode == "vector":
            from pyspark.ml.linalg import DenseVector

            out.append(DenseVector([_cast(name, "float", v) for v in values]))
        else:
            out.append([_cast(name, target, v) for v in values])
    return tuple(out)


def _decode_file(plan, compression: str, item) -> Iterator[tuple]:
    """Spark task body of :func:`load_tfrecords`: ``(path, file bytes)`` -> rows."""
    path, content = item
    if _is_hidden(posixpath.basename(path.rstrip("/"))):
        return
    comp = _compression_of(path) if compression == "auto" else compression
    for record in iter_tfrecords(_decompressing(io.BytesIO(content), comp), source=path):
        yield _example_to_row(decode_example(record), plan)


def load_tfrecords(spark, uri, schema, compression="auto", min_partitions: int | None = None):
    """Read TFRecord files of ``tf.train.Example`` (a directory, file, glob, or list of them) into a
    DataFrame with ``schema`` (a StructType or DDL string such as ``"x array<float>, y long"``).

    Files are read by Spark's own Hadoop filesystem layer (``SparkContext.binaryFiles``), so
    hdfs:// works wherever Spark can read it, without libhdfs; each file is loaded into memory
    whole, so keep files well below the executor memory. Names starting with ``_`` or ``.`` are
    skipped. Plain paths are local paths (made ``file://`` URIs), as in :func:`save_as_tfrecords`.
    Features missing from an Example become null; a feature with several values needs an
    ArrayType column (ConfigError otherwise). ``compression``: ``'auto'`` (by extension), None,
    ``'GZIP'`` or ``'ZLIB'``. The read is lazy: errors surface when the DataFrame is evaluated.
    """
    from pyspark.sql import types as T

    struct = schema if isinstance(schema, T.StructType) else spark.createDataFrame([], schema).schema
    plan = _decode_plan(struct)
    compression = compression if compression == "auto" else _norm_compression(compression)
    uris = _file_list(uri)
    if not uris:
        raise ConfigError("load_tfrecords needs at least one path")
    paths = ["file://" + _local_path(u) if _scheme(u) is None else u  # Hadoop paths are not percent-decoded
             for u in uris]
    rdd = spark.sparkContext.binaryFiles(",".join(paths), minPartitions=min_partitions)
    rows = rdd.flatMap(functools.partial(_decode_file, plan, compression))
    return spark.createDataFrame(rows, struct)
