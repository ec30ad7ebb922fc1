"""Rows and a Spark schema covering every column kind of tfos.data's DataFrame <-> TFRecord
helpers; shared by tests/unit/test_data.py and tests/integration/test_data_spark.py."""

import pytest


def spark_schema():
    T = pytest.importorskip("pyspark.sql.types")
    from pyspark.ml.linalg import VectorUDT

    return T.StructType([
        T.StructField("id", T.LongType()), T.StructField("small", T.IntegerType()),
        T.StructField("flag", T.BooleanType()), T.StructField("x", T.DoubleType()),
        T.StructField("name", T.StringType()), T.StructField("raw", T.BinaryType()),
        T.StructField("arr", T.ArrayType(T.FloatType())), T.StructField("words", T.ArrayType(T.StringType())),
        T.StructField("vec", VectorUDT()),
    ])


def spark_rows():
    from pyspark.ml.linalg import DenseVector, SparseVector
    from pyspark.sql import Row

    R = Row("id", "small", "flag", "x", "name", "raw", "arr", "words", "vec")
    return [R(1, 2, True, 0.5, "a", b"\x01", [1.0, 2.0], ["p", "q"], DenseVector([1.0, 2.0])),
            R(2, None, False, None, None, None, [], None, SparseVector(2, {1: 3.0})),
            R(-3, -4, None, 1e3, "ü", b"", None, [], None)]
