"""TensorFlowOnSpark's ``dfutil``: DataFrame <-> TFRecords of ``tf.train.Example``, on tfos.data.

The names and behaviour of ``tensorflowonspark.dfutil`` (``saveAsTFRecords``, ``loadTFRecords``,
``isLoadedDF``, ``infer_schema``, ``toTFExample``, ``fromTFExample``), built on
:func:`tfos.data.save_as_tfrecords`, :func:`tfos.data.load_tfrecords` and the protobuf codec of
:mod:`tfos.data.example`, so neither the driver nor the executors need TensorFlow or the
tensorflow-hadoop jar. Runs on the driver; ``toTFExample``/``fromTFExample`` return/are
mapPartitions functions that run in Spark tasks.

Differences from TensorFlowOnSpark (docs/migration.md): files are ``part-NNNNN.tfrecord`` written
by tfos (TFRecord framing is the same, so TF and TensorFlowOnSpark read them); a feature that has
several values in the first record stays an array column when a later record holds one value.
"""

from __future__ import annotations

import getpass
import logging
import os
import weakref

from tfos.data.example import Example, decode_example
from tfos.data.sharding import list_files
from tfos.data.spark_io import _encode_row, load_tfrecords, save_as_tfrecords
from tfos.data.tfrecord import _iter_file_records
from tfos.errors import ConfigError
from tfos.data.paths import absolute_path

logger = logging.getLogger(__name__)

__all__ = ["saveAsTFRecords", "loadTFRecords", "isLoadedDF", "infer_schema", "toTFExample", "fromTFExample",
           "loadedDF"]

loadedDF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # DataFrame -> the directory it was loaded from

_INT64 = ("boolean", "tinyint", "smallint", "int", "bigint", "long")
_FLOAT = ("float", "double")
_BYTES = ("binary", "string")


def _hadoop_uri(sc, path: str) -> str:
    """``path`` as Hadoop resolved it for TensorFlowOnSpark: a URI as it is, a plain path on
    Spark's default filesystem (relative: the working directory, or /user/<name> on HDFS)."""
    from tfos.data.fs import spark_default_fs

    return absolute_path(path, spark_default_fs(sc), os.getcwd(), getpass.getuser())


def isLoadedDF(df) -> bool:  # noqa: N802 (TensorFlowOnSpark's name)
    """True if ``df`` was produced by :func:`loadTFRecords` (Spark ML pipelines use this to skip
    re-exporting it)."""
    return df in loadedDF


def saveAsTFRecords(df, output_dir: str) -> None:  # noqa: N802
    """Save DataFrame ``df`` as TFRecords of ``tf.train.Example`` under ``output_dir`` (which must
    not exist yet, as with Hadoop's output formats). Types as :func:`toTFExample`."""
    save_as_tfrecords(df, _hadoop_uri(df.sparkSession.sparkContext, output_dir), mode="error")


def loadTFRecords(sc, input_dir: str, binary_features=()):  # noqa: N802
    """Load the TFRecords under ``input_dir`` as a DataFrame whose schema is inferred from the
    first record (:func:`infer_schema`); ``binary_features`` names the bytes features that are
    binary rather than UTF-8 strings."""
    from pyspark.sql import SparkSession

    uri = _hadoop_uri(sc, input_dir)
    first = None
    for f in list_files(uri):
        first = next(iter(_iter_file_records(f, "auto", "auto")), None)
        if first is not None:
            break
    if first is None:
        raise ConfigError(f"loadTFRecords: no records under {uri}; the schema is inferred from the first record")
    schema = infer_schema(Example.FromString(first), binary_features)
    spark = SparkSession.builder.getOrCreate()
    df = load_tfrecords(spark, uri, schema)
    loadedDF[df] = input_dir
    return df


def infer_schema(example, binary_features=()):
    """The Spark StructType of a ``tf.train.Example`` (TensorFlow's class or tfos's own): int64
    -> long, float -> double, bytes -> string (binary for ``binary_features``); a feature with
    several values -> an array of that type; fields sorted by name."""
    from pyspark.sql.types import ArrayType, BinaryType, DoubleType, LongType, StringType, StructField, StructType

    def sql_type(name, feature):
        if name in binary_features:
            return BinaryType()
        if feature.int64_list.value:
            values, t = feature.int64_list.value, LongType()
        elif feature.float_list.value:
            values, t = feature.float_list.value, DoubleType()
        else:
            values, t = feature.bytes_list.value, StringType()
        return ArrayType(t) if len(values) > 1 else t

    features = example.features.feature
    return StructType([StructField(k, sql_type(k, features[k]), True) for k in sorted(features)])


def _plan_entry(name: str, dtype: str) -> tuple[str, str, str]:
    """Pure: ``(name, kind, mode)`` of :func:`tfos.data.spark_io._encode_row` for a ``df.dtypes``
    entry (TensorFlowOnSpark's API takes dtype strings, which need no Spark session to read)."""
    element, mode = (dtype[6:-1], "list") if dtype.startswith("array<") else (dtype, "scalar")
    if element in _FLOAT:
        return name, "float", mode
    if element in _INT64:
        return name, "int64", mode
    if element in _BYTES and mode == "scalar":
        return name, "bytes", mode
    raise ConfigError(f"column {name!r}: dtype {dtype} has no tf.train.Example feature; cast it to a number, "
                      "string, binary or an array of numbers")


def toTFExample(dtypes):  # noqa: N802
    """A mapPartitions function: Rows of a DataFrame with ``dtypes`` (``df.dtypes``) ->
    ``(bytearray(serialized tf.train.Example), None)`` pairs, as Hadoop's TFRecord output format
    takes them. Rows are encoded as :func:`saveAsTFRecords` encodes them (nulls leave the feature out)."""
    plan = [_plan_entry(name, dtype) for name, dtype in dtypes]  # fails on the driver, before the job starts

    def to_examples(rows):
        return [(bytearray(_encode_row([row[n] for n, _, _ in plan], plan)), None) for row in rows]
    return to_examples


def fromTFExample(records, binary_features=()):  # noqa: N802
    """A mapPartitions function: ``(serialized tf.train.Example, _)`` pairs -> Rows, one column per
    feature (sorted): one value -> a scalar, several -> a list, none -> None; bytes are decoded as
    UTF-8 unless named in ``binary_features`` (then bytearray)."""
    from pyspark.sql import Row

    def value(name, values):
        if values and isinstance(values[0], bytes):
            return bytearray(values[0]) if name in binary_features else values[0].decode("utf-8")
        if len(values) > 1:
            return list(values)
        return values[0] if values else None

    return [Row(**{k: value(k, v) for k, v in decode_example(bytes(r[0])).items()}) for r in records]
