"""tfos.data: listing, sharding, tf.data readers, the tf.train.Example codec and the Spark
DataFrame <-> TFRecord helpers without Spark (tests/integration/test_data_spark.py runs them on Spark)."""

import gzip
import io
import itertools
import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest

from tfos import data
from tfos.data import example, spark_io, tfrecord
from tfos.data import fs as dfs
from tfos.errors import ConfigError, FeedError, HadoopConfigError, TFOSError
from tfos_test_data import spark_rows as _rows
from tfos_test_data import spark_schema as _spark_schema


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _uri(path) -> str:
    return "file://" + str(path)


def _touch(path, size=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def _take_all(ds):
    return [{k: v.numpy() for k, v in b.items()} if isinstance(b, dict) else b.numpy() for b in ds]


def _policy_off(tf, ds):
    return ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


# --------------------------------------------------------------------------- import

def test_import_does_not_import_tensorflow():
    code = ("import sys, tfos.data\n"
            "bad = [m for m in ('tensorflow', 'pyspark', 'keras') if m in sys.modules]\n"
            "assert not bad, bad\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def test_public_names_stay_importable_from_the_package():
    from tfos.data import load_tfrecords, rank_files  # noqa: F401

    assert sorted(data.__all__) == sorted([
        "list_files", "list_files_with_sizes", "shard", "shard_by_size", "rank_files", "tfrecord_dataset",
        "parquet_dataset", "csv_dataset", "encode_example", "decode_example", "tfrecord_frame", "iter_tfrecords",
        "save_as_tfrecords", "load_tfrecords"])
    assert all(callable(getattr(data, name)) for name in data.__all__)


# --------------------------------------------------------------------------- listing

@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "data"
    for rel, size in [("b.csv", 2), ("a.csv", 1), ("notes.txt", 3), ("_SUCCESS", 0), (".a.csv.crc", 4),
                      ("sub/c.csv", 5), ("sub/deeper/d.csv", 6), ("sub/_tmp/x.csv", 1), (".hdir/y.csv", 1),
                      ("_temporary/0/z.csv", 1)]:
        _touch(root / rel, size)
    (root / "emptydir").mkdir()
    return root


def test_list_files_skips_hidden_and_sorts(tree):
    assert data.list_files(_uri(tree)) == [_uri(tree / n) for n in ("a.csv", "b.csv", "notes.txt")]
    assert data.list_files(_uri(tree), pattern="*.csv") == [_uri(tree / "a.csv"), _uri(tree / "b.csv")]


def test_list_files_recursive(tree):
    got = data.list_files(_uri(tree), pattern="*.csv", recursive=True)
    assert got == [_uri(tree / r) for r in ("a.csv", "b.csv", "sub/c.csv", "sub/deeper/d.csv")]


def test_list_files_plain_paths_and_hadoop_style_file_uri(tree):
    assert data.list_files(str(tree), "*.csv") == [str(tree / "a.csv"), str(tree / "b.csv")]
    assert data.list_files("file:" + str(tree), "*.csv") == [_uri(tree / "a.csv"), _uri(tree / "b.csv")]
    assert data.list_files(tree, "*.csv") == [str(tree / "a.csv"), str(tree / "b.csv")]  # os.PathLike


def test_list_files_with_sizes(tree):
    assert data.list_files_with_sizes(_uri(tree), "*.csv", recursive=True) == [
        (_uri(tree / "a.csv"), 1), (_uri(tree / "b.csv"), 2), (_uri(tree / "sub/c.csv"), 5),
        (_uri(tree / "sub/deeper/d.csv"), 6)]


def test_list_files_of_a_file_and_of_an_empty_dir(tree):
    assert data.list_files(_uri(tree / "b.csv")) == [_uri(tree / "b.csv")]
    assert data.list_files(_uri(tree / "emptydir")) == []


def test_list_files_missing_dir(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*ctx.absolute_path"):
        data.list_files(_uri(tmp_path / "nope"))


def test_list_files_quotes_special_characters(tmp_path):
    d = tmp_path / "my data"
    _touch(d / "part 1%.csv", 1)
    (got,) = data.list_files(_uri(d))
    assert got == _uri(tmp_path) + "/my%20data/part%201%25.csv"
    assert data.list_files(got) == [got]  # the URI round-trips through pyarrow


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot open"):
        data.list_files("nosuchfs://host/dir")


# --------------------------------------------------------------------------- HDFS without a Hadoop client

@pytest.fixture
def no_hadoop(monkeypatch):
    for name in ("HADOOP_HOME", "CLASSPATH", "ARROW_LIBHDFS_DIR", "HADOOP_CONF_DIR", "JAVA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dfs, "_hadoop_command", lambda: None)


@pytest.mark.parametrize("uri", ["hdfs://127.0.0.1:1/data/train", "viewfs://cluster/data"])
def test_hdfs_without_hadoop_client_says_what_to_set_up(no_hadoop, uri):
    with pytest.raises(HadoopConfigError) as info:
        data.list_files(uri)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, TFOSError)
    msg = str(err)
    assert uri in msg
    for needle in ("JAVA_HOME", "HADOOP_HOME", "CLASSPATH=$($HADOOP_HOME/bin/hadoop classpath --glob)",
                   "ARROW_LIBHDFS_DIR", "spark.executorEnv", "file://"):
        assert needle in msg, needle
    assert "HADOOP_HOME=<Hadoop installation>  (not set)" in msg
    assert len(msg) < 3000  # pyarrow's long libjvm search list is not dumped on the user


def test_hdfs_connection_failure_is_wrapped(monkeypatch, no_hadoop):
    def refuse(uri):
        raise OSError("HDFS connection failed\nmore detail")

    monkeypatch.setattr(dfs, "_libhdfs_loadable", lambda: True)
    monkeypatch.setattr(dfs, "_from_uri", refuse)
    with pytest.raises(HadoopConfigError, match=r"(?s)pyarrow: HDFS connection failed\).*namenode host:port"):
        data.list_files("hdfs://nn.example:8020/x")


def test_hadoop_classpath_is_set_from_the_hadoop_command(monkeypatch, tmp_path):
    script = tmp_path / "bin" / "hadoop"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n[ \"$1 $2\" = 'classpath --glob' ] && echo /opt/hadoop/a.jar:/opt/hadoop/b.jar\n")
    script.chmod(0o755)
    monkeypatch.setenv("HADOOP_HOME", str(tmp_path))
    monkeypatch.delenv("CLASSPATH", raising=False)
    dfs._ensure_hadoop_classpath()
    assert os.environ["CLASSPATH"] == "/opt/hadoop/a.jar:/opt/hadoop/b.jar"
    monkeypatch.setenv("CLASSPATH", "/x/hadoop-common.jar")  # already has Hadoop jars: left alone
    dfs._ensure_hadoop_classpath()
    assert os.environ["CLASSPATH"] == "/x/hadoop-common.jar"


# --------------------------------------------------------------------------- sharding

def _check_partition(files, shards):
    union = sorted(itertools.chain.from_iterable(shards))
    assert union == sorted(files)
    for a, b in itertools.combinations(shards, 2):
        assert not set(a) & set(b)


@pytest.mark.parametrize("n,workers", [(1, 1), (2, 2), (4, 2), (5, 2), (7, 3), (3, 3), (10, 4), (100, 7), (8, 8)])
def test_shard_round_robin_table(n, workers):
    files = [f"hdfs://nn/d/part-{i:05d}" for i in range(n)]
    shards = [data.shard(files, r, workers) for r in range(workers)]
    _check_partition(files, shards)
    counts = [len(s) for s in shards]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    shuffled = files[:]
    random.Random(n).shuffle(shuffled)
    assert [data.shard(shuffled, r, workers) for r in range(workers)] == shards  # listing order is irrelevant


def test_shard_expected_assignment():
    files = ["e", "c", "a", "d", "b"]
    assert data.shard(files, 0, 2) == ["a", "c", "e"]
    assert data.shard(files, 1, 2) == ["b", "d"]
    assert data.shard("only", 0, 1) == ["only"]


@pytest.mark.parametrize("n,workers", [(0, 1), (1, 2), (3, 4)])
def test_shard_too_few_files(n, workers):
    files = [f"f{i}" for i in range(n)]
    with pytest.raises(ConfigError, match="repartition|no input files") as info:
        data.shard(files, 0, workers)
    if n:
        assert f"only {n} file(s) for {workers} workers" in str(info.value)
        assert "allow_empty=True" in str(info.value) and "all-reduce" in str(info.value)
    shards = [data.shard(files, r, workers, allow_empty=True) for r in range(workers)]
    _check_partition(files, shards)
    assert shards[-1] == []


@pytest.mark.parametrize("rank,workers,match", [(2, 2, "rank must be"), (-1, 2, "rank must be"),
                                                (0, 0, "num_workers"), (None, 2, "ps or evaluator"),
                                                (True, 2, "rank must be"), (0, "2", "num_workers")])
def test_shard_bad_rank(rank, workers, match):
    with pytest.raises(ConfigError, match=match):
        data.shard(["a", "b"], rank, workers)


def test_shard_duplicates_rejected():
    with pytest.raises(ConfigError, match="listed twice"):
        data.shard(["a", "b", "a"], 0, 1)


def test_shard_by_size_expected_assignment():
    sizes = {"a": 100, "b": 90, "c": 10, "d": 10, "e": 10, "f": 5}
    # greedy by bytes: a->0, b->1, c->1 (90 < 100), d->0 (100 = 100, fewer files), e->1, f->0
    r0, r1 = (data.shard_by_size(sizes, r, 2) for r in range(2))
    _check_partition(list(sizes), [r0, r1])
    loads = [sum(sizes[f] for f in s) for s in (r0, r1)]
    assert abs(loads[0] - loads[1]) <= max(sizes.values())
    assert r0 == ["a", "d", "f"] and r1 == ["b", "c", "e"]
    assert data.shard_by_size(list(sizes.items()), 1, 2) == r1  # pairs or mapping


@pytest.mark.parametrize("seed,n,workers", [(0, 1, 1), (1, 10, 3), (2, 50, 4), (3, 7, 7), (4, 200, 16), (5, 9, 2)])
def test_shard_by_size_table(seed, n, workers):
    rng = random.Random(seed)
    sizes = {f"part-{i:04d}": rng.choice([0, 1, 10, 1000, rng.randrange(10 ** 6)]) for i in range(n)}
    shards = [data.shard_by_size(sizes, r, workers) for r in range(workers)]
    _check_partition(list(sizes), shards)
    loads = [sum(sizes[f] for f in s) for s in shards]
    assert max(loads) - min(loads) <= max(sizes.values())
    assert all(s == sorted(s) for s in shards)
    assert all(len(s) >= 1 for s in shards)


def test_shard_by_size_errors():
    with pytest.raises(ConfigError, match="only 1 file"):
        data.shard_by_size({"a": 1}, 0, 2)
    assert data.shard_by_size({"a": 1}, 1, 2, allow_empty=True) == []
    with pytest.raises(ConfigError, match="non-negative"):
        data.shard_by_size({"a": -1}, 0, 1)
    with pytest.raises(ConfigError, match="pairs"):
        data.shard_by_size(["a"], 0, 1)


def test_rank_files(tree):
    def ctx(rank, n):
        return types.SimpleNamespace(rank=rank, num_workers=n, absolute_path=lambda p: p)

    got = [data.rank_files(ctx(r, 2), _uri(tree), "*.csv", recursive=True) for r in range(2)]
    assert got == [[_uri(tree / "a.csv"), _uri(tree / "sub/c.csv")],
                   [_uri(tree / "b.csv"), _uri(tree / "sub/deeper/d.csv")]]
    by_size = [data.rank_files(ctx(r, 2), _uri(tree), "*.csv", recursive=True, by_size=True) for r in range(2)]
    assert by_size == [[_uri(tree / "a.csv"), _uri(tree / "sub/deeper/d.csv")],
                       [_uri(tree / "b.csv"), _uri(tree / "sub/c.csv")]]
    with pytest.raises(ConfigError, match="ps or evaluator"):
        data.rank_files(ctx(None, 2), _uri(tree))


# --------------------------------------------------------------------------- tf.train.Example codec

def test_encode_example_parses_with_tensorflow(tf):
    raw = data.encode_example({
        "label": 7, "neg": -3, "big": [2 ** 63 - 1, -(2 ** 63)], "flag": True,
        "x": np.array([[0.5, 1.5], [2.0, -1.0]], dtype=np.float64), "score": 0.25,
        "name": "héllo", "blob": b"\x00\xff", "tags": ["a", "b"], "empty": [], "skipped": None,
        "ints": np.arange(3, dtype=np.int32), "mixed_num": [1, 2.5],
    }, kinds={"empty": "float"})
    ex = tf.train.Example.FromString(raw)
    f = ex.features.feature
    assert list(f["label"].int64_list.value) == [7]
    assert list(f["neg"].int64_list.value) == [-3]
    assert list(f["big"].int64_list.value) == [2 ** 63 - 1, -(2 ** 63)]
    assert list(f["flag"].int64_list.value) == [1]
    assert list(f["x"].float_list.value) == [0.5, 1.5, 2.0, -1.0]
    assert list(f["score"].float_list.value) == [0.25]
    assert list(f["name"].bytes_list.value) == ["héllo".encode()]
    assert list(f["blob"].bytes_list.value) == [b"\x00\xff"]
    assert list(f["tags"].bytes_list.value) == [b"a", b"b"]
    assert f["empty"].WhichOneof("kind") == "float_list" and len(f["empty"].float_list.value) == 0
    assert "skipped" not in f
    assert list(f["ints"].int64_list.value) == [0, 1, 2]
    assert list(f["mixed_num"].float_list.value) == [1.0, 2.5]
    parsed = tf.io.parse_single_example(raw, {"x": tf.io.FixedLenFeature([2, 2], tf.float32),
                                              "label": tf.io.FixedLenFeature([], tf.int64),
                                              "tags": tf.io.VarLenFeature(tf.string)})
    np.testing.assert_array_equal(parsed["x"].numpy(), [[0.5, 1.5], [2.0, -1.0]])
    assert parsed["label"].numpy() == 7
    assert list(tf.sparse.to_dense(parsed["tags"]).numpy()) == [b"a", b"b"]


def test_decode_example_reads_tensorflow_examples(tf):
    ex = tf.train.Example(features=tf.train.Features(feature={
        "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, -2, 2 ** 40])),
        "f": tf.train.Feature(float_list=tf.train.FloatList(value=[0.1, 3.0])),
        "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x", b""])),
        "e": tf.train.Feature(int64_list=tf.train.Int64List()),
        "ü": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"key"])),
    }))
    got = data.decode_example(ex.SerializeToString())
    assert got["i"] == [1, -2, 2 ** 40]
    assert got["f"] == pytest.approx([0.1, 3.0], rel=1e-6)
    assert got["b"] == [b"x", b""]
    assert got["e"] == []
    assert got["ü"] == [b"key"]
    assert set(got) == {"i", "f", "b", "e", "ü"}


def test_example_round_trip_without_tensorflow():
    raw = data.encode_example({"a": [1, 2, 3], "b": 1.5, "c": ["x"], "d": np.zeros(0, np.int64),
                               "e": np.array([True, False]), "f": np.arange(2, dtype=np.uint8)})
    assert data.decode_example(raw) == {"a": [1, 2, 3], "b": [1.5], "c": [b"x"], "d": [], "e": [1, 0], "f": [0, 1]}
    assert list(data.decode_example(raw)) == ["a", "b", "c", "d", "e", "f"]  # sorted by name
    assert data.decode_example(data.encode_example({})) == {}
    assert data.decode_example(memoryview(raw)) == data.decode_example(raw)


def test_encode_example_is_deterministic():
    a = data.encode_example({"x": 1, "y": [0.5], "z": "s"})
    assert data.encode_example({"z": "s", "y": [0.5], "x": 1}) == a  # map entries sorted by key


def test_example_classes_live_in_a_private_descriptor_pool():
    from google.protobuf import descriptor_pool

    assert example.Example.DESCRIPTOR.full_name == "tensorflow.Example"
    assert example.Example.DESCRIPTOR.file.pool is not descriptor_pool.Default()


@pytest.mark.parametrize("features,kinds,match", [
    ({"e": []}, None, "cannot be inferred"), ({"m": [1, "a"]}, None, "mixes"), ({"o": object()}, None, "cannot store"),
    ({"i": 2 ** 64}, None, "does not fit"), ({"i": [1.5]}, {"i": "int64"}, "store it as 'float'"),
    ({"k": 1}, {"k": "double"}, "unknown kind"), ({"n": [1, None]}, None, "holds a NoneType"),
])
def test_encode_example_errors(features, kinds, match):
    with pytest.raises(ConfigError, match=match):
        data.encode_example(features, kinds)


@pytest.mark.parametrize("raw", [b"\x0a\x05\x0a\x03", b"\x0a", b"\x0b\x00", b"\x0a\x80",
                                 b"\x0a\x07\x0a\x05\x0a\x01\xff\x12\x00"])  # last: a key that is not UTF-8
def test_decode_example_malformed(raw):
    with pytest.raises(FeedError, match="malformed"):
        data.decode_example(raw)


# --------------------------------------------------------------------------- TFRecord framing

def test_masked_crc32c_known_value():
    # CRC-32C("123456789") is 0xE3069283 (the standard check value); TFRecord stores it masked:
    # rotate right by 15 bits, add 0xA282EAD8.
    assert tfrecord._masked_crc(b"123456789") == 0xC78AB0E5
    assert tfrecord._masked_crc(b"") == 0xA282EAD8
    framed = data.tfrecord_frame(b"123456789")
    assert framed[:8] == (9).to_bytes(8, "little") and framed[12:21] == b"123456789"
    assert framed[21:] == (0xC78AB0E5).to_bytes(4, "little")


def test_tfrecord_frame_matches_tensorflow_writer(tf, tmp_path):
    records = [b"", b"123456789", os.urandom(300)]
    path = tmp_path / "r.tfrecord"
    _write_tf_records(tf, path, records)
    assert path.read_bytes() == b"".join(data.tfrecord_frame(r) for r in records)


@pytest.mark.parametrize("compression,suffix", [(None, ""), ("GZIP", ".gz"), ("ZLIB", ".zlib")])
def test_python_writer_is_read_by_tensorflow(tf, tmp_path, compression, suffix):
    records = [b"", b"a", os.urandom(1000), b"z" * 70000]
    path = tmp_path / f"r.tfrecord{suffix}"
    with open(path, "wb") as f:
        assert tfrecord._write_records_python(f, iter(records), tfrecord._norm_compression(compression)) == 4
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression or "")]
    assert got == records
    with open(path, "rb") as f:  # and by our own reader (checksums verified)
        raw = tfrecord._decompressing(f, tfrecord._norm_compression(compression))
        assert list(data.iter_tfrecords(raw, verify_checksums=True)) == records


def test_iter_tfrecords_detects_corruption():
    framed = bytearray(data.tfrecord_frame(b"hello") + data.tfrecord_frame(b"world"))
    assert list(data.iter_tfrecords(io.BytesIO(bytes(framed)), verify_checksums=True)) == [b"hello", b"world"]
    bad_len = bytearray(framed)
    bad_len[0] ^= 1
    with pytest.raises(FeedError, match="length checksum"):
        list(data.iter_tfrecords(io.BytesIO(bytes(bad_len))))
    bad_data = bytearray(framed)
    bad_data[13] ^= 1
    with pytest.raises(FeedError, match="data checksum"):
        list(data.iter_tfrecords(io.BytesIO(bytes(bad_data)), verify_checksums=True))
    with pytest.raises(FeedError, match="data checksum"):  # 'auto' (the default) verifies too
        list(data.iter_tfrecords(io.BytesIO(bytes(bad_data))))
    assert list(data.iter_tfrecords(io.BytesIO(bytes(bad_data)), verify_checksums=False))[1] == b"world"
    with pytest.raises(FeedError, match="truncated"):
        list(data.iter_tfrecords(io.BytesIO(bytes(framed[:-3]))))
    with pytest.raises(FeedError, match="length checksum"):  # gzip bytes read as plain TFRecords
        list(data.iter_tfrecords(io.BytesIO(gzip.compress(bytes(framed)))))


# --------------------------------------------------------------------------- tfrecord_dataset

def _write_tf_records(tf, path, examples, compression=""):
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as w:
        for e in examples:
            w.write(e)


@pytest.fixture
def tfrecord_files(tf, tmp_path):
    files = []
    for i in range(3):
        recs = [tf.train.Example(features=tf.train.Features(feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 10 + j])),
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(j), float(i)])),
        })).SerializeToString() for j in range(4)]
        p = tmp_path / "tfr" / f"part-{i:05d}.tfrecord"
        p.parent.mkdir(exist_ok=True)
        _write_tf_records(tf, p, recs)
        files.append(_uri(p))
    return files


@pytest.mark.parametrize("reader", ["auto", "tensorflow", "arrow"])
def test_tfrecord_dataset_round_trip(tf, tfrecord_files, reader):
    ds = data.tfrecord_dataset(tfrecord_files, reader=reader)
    assert _policy_off(tf, ds)
    ids = [data.decode_example(r.numpy())["id"][0] for r in ds]
    assert ids == [i * 10 + j for i in range(3) for j in range(4)]
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([2], tf.float32)}
    parsed = list(data.tfrecord_dataset(tfrecord_files[1:2], features=spec, reader=reader).batch(10))
    assert len(parsed) == 1
    np.testing.assert_array_equal(parsed[0]["id"].numpy(), [10, 11, 12, 13])
    np.testing.assert_array_equal(parsed[0]["x"].numpy(), [[0, 1], [1, 1], [2, 1], [3, 1]])


@pytest.mark.parametrize("reader", ["tensorflow", "arrow"])
@pytest.mark.parametrize("compression,suffix", [("GZIP", ".gz"), ("ZLIB", ".zlib")])
def test_tfrecord_dataset_compressed(tf, tmp_path, reader, compression, suffix):
    recs = [f"r{i}".encode() for i in range(600)]
    path = tmp_path / f"c.tfrecord{suffix}"
    _write_tf_records(tf, path, recs, compression)
    ds = data.tfrecord_dataset([str(path)], reader=reader)  # compression from the extension
    assert [r.numpy() for r in ds] == recs
    explicit = data.tfrecord_dataset([str(path)], compression_type=compression, reader=reader)
    assert len(list(explicit)) == 600


def test_tfrecord_dataset_options(tf):
    ds = data.tfrecord_dataset([], reader="arrow")
    assert list(ds) == [] and _policy_off(tf, ds)
    with pytest.raises(ConfigError, match="reader"):
        data.tfrecord_dataset([], reader="spark")
    with pytest.raises(ConfigError, match="mix compressions"):
        data.tfrecord_dataset(["a.tfrecord", "b.tfrecord.gz"])


# --------------------------------------------------------------------------- parquet_dataset

def _parquet_tables():
    import pyarrow as pa

    def table(start, n):
        ids = np.arange(start, start + n)
        return pa.table({
            "id": pa.array(ids, pa.int64()),
            "x": pa.array((ids * 0.5).astype(np.float32)),
            "name": pa.array([f"n{i}" for i in ids]),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            "pair": pa.array([[int(i), int(-i)] for i in ids], pa.list_(pa.int64())),
            "flag": pa.array(ids % 2 == 0),
        })
    return table(0, 5), table(5, 6)


@pytest.fixture
def parquet_files(tmp_path):
    import pyarrow.parquet as pq

    out = []
    for i, t in enumerate(_parquet_tables()):
        p = tmp_path / "pq" / f"part-{i}.parquet"
        p.parent.mkdir(exist_ok=True)
        pq.write_table(t, p, row_group_size=3)
        out.append(_uri(p))
    return out


def test_parquet_dataset_round_trip(tf, parquet_files):
    ds = data.parquet_dataset(parquet_files, batch_size=4)
    assert _policy_off(tf, ds)
    sig = ds.element_spec
    assert list(sig) == ["id", "x", "name", "vec", "pair", "flag"]
    assert sig["vec"].shape.as_list() == [None, 3] and sig["vec"].dtype == tf.float32
    assert sig["pair"].shape.as_list() == [None, 2] and sig["pair"].dtype == tf.int64
    assert sig["name"].dtype == tf.string and sig["flag"].dtype == tf.bool
    batches = _take_all(ds)
    assert [len(b["id"]) for b in batches] == [4, 4, 3]  # exact batches across file boundaries
    ids = np.concatenate([b["id"] for b in batches])
    np.testing.assert_array_equal(ids, np.arange(11))
    np.testing.assert_allclose(np.concatenate([b["x"] for b in batches]), ids * 0.5)
    np.testing.assert_array_equal(np.concatenate([b["vec"] for b in batches]), np.repeat(ids, 3).reshape(11, 3))
    np.testing.assert_array_equal(np.concatenate([b["pair"] for b in batches]), np.stack([ids, -ids], 1))
    assert list(np.concatenate([b["name"] for b in batches])) == [f"n{i}".encode() for i in ids]
    np.testing.assert_array_equal(np.concatenate([b["flag"] for b in batches]), ids % 2 == 0)
    assert len(_take_all(ds)) == 3  # a second epoch reads again


def test_parquet_dataset_columns_and_drop_remainder(tf, parquet_files):
    ds = data.parquet_dataset(parquet_files, columns=["vec", "id"], batch_size=4, drop_remainder=True)
    assert list(ds.element_spec) == ["vec", "id"]
    assert ds.element_spec["id"].shape.as_list() == [4]
    assert [len(b["id"]) for b in _take_all(ds)] == [4, 4]
    with pytest.raises(ConfigError, match=r"no column\(s\) \['nope'\]"):
        data.parquet_dataset(parquet_files, columns=["id", "nope"])
    with pytest.raises(ConfigError, match="batch_size"):
        data.parquet_dataset(parquet_files, batch_size=0)


def test_parquet_dataset_empty_shard_needs_signature(tf):
    with pytest.raises(ConfigError, match="output_signature"):
        data.parquet_dataset([])
    sig = {"id": tf.TensorSpec([None], tf.int64)}
    ds = data.parquet_dataset([], output_signature=sig)
    assert list(ds) == [] and _policy_off(tf, ds)


def _write_parquet(path, table):
    import pyarrow.parquet as pq

    pq.write_table(table, path)
    return str(path)


def test_parquet_dataset_bad_data(tf, tmp_path):
    import pyarrow as pa

    nulls = _write_parquet(tmp_path / "nulls.parquet", pa.table({"a": pa.array([1.0, None])}))
    with pytest.raises(Exception, match="null value"):
        _take_all(data.parquet_dataset([nulls]))
    ragged = _write_parquet(tmp_path / "ragged.parquet", pa.table({"a": pa.array([[1], [1, 2]])}))
    with pytest.raises(Exception, match="lists of different lengths"):
        _take_all(data.parquet_dataset([ragged]))
    stamp = _write_parquet(tmp_path / "ts.parquet",
                           pa.table({"t": pa.array([0], pa.timestamp("s"))}))
    with pytest.raises(ConfigError, match="timestamps/dates to long"):
        data.parquet_dataset([stamp])
    a = _write_parquet(tmp_path / "w2.parquet", pa.table({"v": pa.array([[1, 2]])}))
    b = _write_parquet(tmp_path / "w3.parquet", pa.table({"v": pa.array([[1, 2, 3]])}))
    with pytest.raises(Exception, match="one length across all files"):
        _take_all(data.parquet_dataset([a, b]))


def test_parquet_dataset_casts_to_first_file_types(tf, tmp_path):
    import pyarrow as pa

    a = _write_parquet(tmp_path / "a.parquet", pa.table({"v": pa.array([1, 2], pa.int64())}))
    b = _write_parquet(tmp_path / "b.parquet", pa.table({"v": pa.array([3], pa.int32())}))
    (batch,) = _take_all(data.parquet_dataset([a, b], batch_size=8))
    assert batch["v"].dtype == np.int64 and list(batch["v"]) == [1, 2, 3]


# --------------------------------------------------------------------------- csv_dataset

def test_csv_dataset_with_header(tf, tmp_path):
    (tmp_path / "a.csv").write_text("label,x,name\n1,0.5,a\n2,1.5,b\n3,2.5,c\n")
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write("label,x,name\n4,3.5,d\n")
    files = [str(tmp_path / "a.csv"), _uri(tmp_path / "b.csv.gz")]
    ds = data.csv_dataset(files, batch_size=3, column_types={"x": "float32"})
    assert _policy_off(tf, ds)
    assert ds.element_spec["x"].dtype == tf.float32 and ds.element_spec["label"].dtype == tf.int64
    batches = _take_all(ds)
    assert [len(b["label"]) for b in batches] == [3, 1]
    assert list(np.concatenate([b["label"] for b in batches])) == [1, 2, 3, 4]
    np.testing.assert_allclose(np.concatenate([b["x"] for b in batches]), [0.5, 1.5, 2.5, 3.5])
    assert list(np.concatenate([b["name"] for b in batches])) == [b"a", b"b", b"c", b"d"]
    sub = data.csv_dataset(files, columns=["name", "label"])
    assert list(sub.element_spec) == ["name", "label"]


def test_csv_dataset_without_header(tf, tmp_path):
    np.savetxt(tmp_path / "train-0.csv", np.array([[0, 1, 2], [1, 3, 4]]), delimiter=",", fmt="%.6g")
    np.savetxt(tmp_path / "train-1.csv", np.array([[1, 5.5, 6]]), delimiter=",", fmt="%.6g")
    files = data.list_files(str(tmp_path), "train-*.csv")
    ds = data.csv_dataset(files, header=False)
    assert list(ds.element_spec) == ["f0", "f1", "f2"]
    named = data.csv_dataset(files, column_names=["y", "a", "b"], column_types={"a": np.float32, "b": "float32"})
    (batch,) = _take_all(named)
    assert list(batch["y"]) == [0, 1, 1]
    np.testing.assert_allclose(batch["a"], [1, 3, 5.5])
    assert batch["a"].dtype == np.float32
    # without column_types the first file makes "a" an integer column; 5.5 in the second file fails clearly
    with pytest.raises(Exception, match="column_types"):
        _take_all(data.csv_dataset(files, column_names=["y", "a", "b"]))


def test_csv_dataset_header_with_own_names_and_delimiter(tf, tmp_path):
    (tmp_path / "s.tsv").write_text("A\tB\n1\tx\n")
    (tmp_path / "empty.tsv").write_text("")
    ds = data.csv_dataset([str(tmp_path / "empty.tsv"), str(tmp_path / "s.tsv")], column_names=["n", "s"],
                          header=True, delimiter="\t")
    (batch,) = _take_all(ds)
    assert list(batch["n"]) == [1] and list(batch["s"]) == [b"x"]


# --------------------------------------------------------------------------- DataFrame <-> TFRecord, without Spark

def test_encode_and_decode_plans():
    schema = _spark_schema()
    assert spark_io._encode_plan(schema) == [
        ("id", "int64", "scalar"), ("small", "int64", "scalar"), ("flag", "int64", "scalar"),
        ("x", "float", "scalar"), ("name", "bytes", "scalar"), ("raw", "bytes", "scalar"),
        ("arr", "float", "list"), ("words", "bytes", "list"), ("vec", "float", "vector")]
    assert [t for _, t, _ in spark_io._decode_plan(schema)] == ["int", "int", "bool", "float", "str", "bytes", "float",
                                                             "str", "float"]
    T = pytest.importorskip("pyspark.sql.types")
    for dt in (T.TimestampType(), T.DecimalType(10, 2), T.ArrayType(T.ArrayType(T.LongType())),
               T.MapType(T.StringType(), T.LongType())):
        bad = T.StructType([T.StructField("c", dt)])
        with pytest.raises(ConfigError, match="'c'"):
            spark_io._encode_plan(bad)
        with pytest.raises(ConfigError, match="'c'"):
            spark_io._decode_plan(bad)


def test_rows_round_trip_through_examples(tf):
    schema = _spark_schema()
    enc, dec = spark_io._encode_plan(schema), spark_io._decode_plan(schema)
    raws = [spark_io._encode_row(r, enc) for r in _rows()]
    first = tf.train.Example.FromString(raws[0]).features.feature
    assert list(first["vec"].float_list.value) == [1.0, 2.0] and list(first["flag"].int64_list.value) == [1]
    back = [spark_io._example_to_row(data.decode_example(r), dec) for r in raws]
    assert back[0][:7] == (1, 2, True, 0.5, "a", b"\x01", [1.0, 2.0]) and back[0][7] == ["p", "q"]
    assert list(back[0][8]) == [1.0, 2.0]
    assert back[1][:8] == (2, None, False, None, None, None, [], None) and list(back[1][8]) == [0.0, 3.0]
    assert back[2] == (-3, -4, None, 1000.0, "ü", b"", None, [], None)


def test_example_to_row_errors():
    T = pytest.importorskip("pyspark.sql.types")
    plan = spark_io._decode_plan(T.StructType([T.StructField("a", T.LongType())]))
    with pytest.raises(ConfigError, match="declare it as an array"):
        spark_io._example_to_row({"a": [1, 2]}, plan)
    with pytest.raises(ConfigError, match="declare float/double"):
        spark_io._example_to_row({"a": [1.5]}, plan)
    with pytest.raises(ConfigError, match="null element"):
        spark_io._encode_row((["x", None],), [("w", "bytes", "list")])


@pytest.mark.parametrize("engine", ["python", "tensorflow"])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_write_partition_and_decode_file_without_spark(tf, tmp_path, engine, compression):
    schema = _spark_schema()
    out = tmp_path / "out"
    fs, path, prefix = dfs._resolve(_uri(out))
    spark_io._prepare_output(fs, path, _uri(out), "error")
    spec = {"uri": _uri(out), "plan": spark_io._encode_plan(schema), "compression": tfrecord._norm_compression(compression),
            "engine": engine}
    rows = _rows()
    ext = ".tfrecord" + (".gz" if compression else "")
    assert spark_io._write_partition(spec, 3, iter(rows)) == [(_uri(out / f"part-00003{ext}"), 3)]
    assert spark_io._write_partition(spec, 3, iter(rows[:1])) == [(_uri(out / f"part-00003{ext}"), 1)]  # a retry replaces
    assert spark_io._write_partition(spec, 4, iter([])) == []  # empty partitions write no file
    spark_io._commit_output(fs, path)
    assert sorted(os.listdir(out)) == ["_SUCCESS", f"part-00003{ext}"]
    assert data.list_files(_uri(out)) == [_uri(out / f"part-00003{ext}")]
    # TensorFlow reads the file (checksums and compression verified)
    (raw,) = [r.numpy() for r in tf.data.TFRecordDataset(str(out / f"part-00003{ext}"),
                                                          compression_type=compression or "")]
    assert tf.train.Example.FromString(raw).features.feature["name"].bytes_list.value[0] == b"a"
    content = (out / f"part-00003{ext}").read_bytes()
    (row,) = spark_io._decode_file(spark_io._decode_plan(schema), "auto", ("file:" + str(out / f"part-00003{ext}"), content))
    assert row[:5] == (1, 2, True, 0.5, "a")
    assert list(spark_io._decode_file([], "auto", ("file:/x/_SUCCESS", b""))) == []


def test_prepare_output_modes(tmp_path):
    out = tmp_path / "o"
    fs, path, _ = dfs._resolve(str(out))
    spark_io._prepare_output(fs, path, str(out), "error")  # creates it
    spark_io._prepare_output(fs, path, str(out), "error")  # empty: fine
    _touch(out / "part-00000.tfrecord", 1)
    with pytest.raises(ConfigError, match="mode='overwrite'"):
        spark_io._prepare_output(fs, path, str(out), "error")
    spark_io._prepare_output(fs, path, str(out), "overwrite")
    assert os.listdir(out) == []
    with pytest.raises(ConfigError, match="mode must be"):
        spark_io._prepare_output(fs, path, str(out), "append")
    with pytest.raises(ConfigError, match="root directory"):
        spark_io._prepare_output(fs, "/", "file:///", "overwrite")


def test_tfos_error_recovered_from_spark_error_text():
    text = ("An error occurred while calling o123.collectAndServe.\nTraceback (most recent call last):\n"
            "  File ...\ntfos.errors.ConfigError: column 'a' holds an array with a null element\n\tat org...")
    err = spark_io._task_error(RuntimeError(text))
    assert type(err) is ConfigError and str(err) == ("column 'a' holds an array with a null element "
                                                     "(raised in a Spark task)")
    other = RuntimeError("boom")
    assert spark_io._task_error(other) is other
