"""tfos.data on the shared local-cluster: DataFrame <-> TFRecord through real Spark jobs."""

import os

import pytest

from tfos import data
from tfos.errors import ConfigError
from tfos_test_data import spark_rows as _rows
from tfos_test_data import spark_schema as _spark_schema


def _uri(path) -> str:
    return "file://" + str(path)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.mark.spark
def test_save_and_load_tfrecords_round_trip(spark, tmp_path):
    schema = _spark_schema()
    df = spark.createDataFrame(_rows(), schema).repartition(2)
    out = _uri(tmp_path / "tfr")
    written = data.save_as_tfrecords(df, out)
    assert sum(n for _, n in written) == 3 and 1 <= len(written) <= 2
    names = sorted(os.listdir(tmp_path / "tfr"))
    assert "_SUCCESS" in names and "_temporary" not in names
    assert [u for u, _ in written] == data.list_files(out)
    back = sorted(data.load_tfrecords(spark, out, schema).collect(), key=lambda r: r.id)
    assert [r.id for r in back] == [-3, 1, 2]
    assert back[1].name == "a" and back[1].arr == [1.0, 2.0] and list(back[1].vec) == [1.0, 2.0]
    assert back[2].small is None and back[2].arr == [] and list(back[2].vec) == [0.0, 3.0]
    assert back[0].name == "ü" and back[0].words == [] and back[0].vec is None
    ddl = data.load_tfrecords(spark, out, "id long, x double").orderBy("id").collect()
    assert [(r.id, r.x) for r in ddl] == [(-3, 1000.0), (1, 0.5), (2, None)]


@pytest.mark.spark
def test_save_as_tfrecords_modes_compression_and_tf_read(spark, tmp_path, tf):
    df = spark.range(0, 40, numPartitions=4).selectExpr("id", "cast(id as float) * 0.5 as x",
                                                        "array(id, id + 1) as pair")
    out = str(tmp_path / "gz")
    written = data.save_as_tfrecords(df, out, compression="GZIP")
    assert len(written) == 4 and all(u.endswith(".tfrecord.gz") for u, _ in written)
    with pytest.raises(ConfigError, match="already exists"):
        data.save_as_tfrecords(df, out)
    written = data.save_as_tfrecords(df.coalesce(2), out, mode="overwrite", compression="GZIP")
    assert len(written) == 2
    files = data.list_files(out)
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([], tf.float32),
            "pair": tf.io.FixedLenFeature([2], tf.int64)}
    shards = [data.shard(files, r, 2) for r in range(2)]
    ids = sorted(int(e["id"]) for s in shards for e in data.tfrecord_dataset(s, features=spec))
    assert ids == list(range(40))
    assert data.load_tfrecords(spark, out, "id long, x float, pair array<long>").count() == 40


@pytest.mark.spark
def test_save_as_tfrecords_errors(spark, tmp_path):
    df = spark.sql("select current_timestamp() as t")
    with pytest.raises(ConfigError, match="timestamps/dates to long"):
        data.save_as_tfrecords(df, str(tmp_path / "t"))
    nulls = spark.sql("select array('a', null) as w")
    with pytest.raises(ConfigError, match="null element"):
        data.save_as_tfrecords(nulls, str(tmp_path / "n"))
    assert not (tmp_path / "n" / "_temporary").exists()
    many = spark.createDataFrame([([1, 2],)], "a array<long>")
    data.save_as_tfrecords(many, str(tmp_path / "m"))
    with pytest.raises(Exception, match="declare it as an array"):
        data.load_tfrecords(spark, str(tmp_path / "m"), "a long").collect()
