"""tfos.data: listing, sharding, tf.data readers, the tf.train.Example codec and the Spark
DataFrame <-> TFRecord helpers. Tests marked ``spark`` need the local-cluster fixture."""

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
from tfos.errors import ConfigError, FeedError, HadoopConfigError, TFOSError


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
    monkeypatch.setattr(data, "_hadoop_command", lambda: None)


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

    monkeypatch.setattr(data, "_libhdfs_loadable", lambda: True)
    monkeypatch.setattr(data, "_from_uri", refuse)
    with pytest.raises(HadoopConfigError, match=r"(?s)pyarrow: HDFS connection failed\).*namenode host:port"):
        data.list_files("hdfs://nn.example:8020/x")


def test_hadoop_classpath_is_set_from_the_hadoop_command(monkeypatch, tmp_path):
    script = tmp_path / "bin" / "hadoop"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n[ \"$1 $2\" = 'classpath --glob' ] && echo /opt/hadoop/a.jar:/opt/hadoop/b.jar\n")
    script.chmod(0o755)
    monkeypatch.setenv("HADOOP_HOME", str(tmp_path))
    monkeypatch.delenv("CLASSPATH", raising=False)
    data._ensure_hadoop_classpath()
    assert os.environ["CLASSPATH"] == "/opt/hadoop/a.jar:/opt/hadoop/b.jar"
    monkeypatch.setenv("CLASSPATH", "/x/hadoop-common.jar")  # already has Hadoop jars: left alone
    data._ensure_hadoop_classpath()
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
    raw = data.encode_example({"a": [1, 2, 3], "b": 1.5, "c": ["x"], "d": np.zeros(0, np.int64)})
    assert data.decode_example(raw) == {"a": [1, 2, 3], "b": [1.5], "c": [b"x"], "d": []}
    assert data.decode_example(data.encode_example({})) == {}


@pytest.mark.parametrize("features,kinds,match", [
    ({"e": []}, None, "cannot be inferred"), ({"m": [1, "a"]}, None, "mixes"), ({"o": object()}, None, "cannot store"),
    ({"i": 2 ** 64}, None, "does not fit"), ({"i": [1.5]}, {"i": "int64"}, "store it as 'float'"),
    ({"k": 1}, {"k": "double"}, "unknown kind"), ({"n": [1, None]}, None, "holds a NoneType"),
])
def test_encode_example_errors(features, kinds, match):
    with pytest.raises(ConfigError, match=match):
        data.encode_example(features, kinds)


@pytest.mark.parametrize("raw", [b"\x0a\x05\x0a\x03", b"\x0a", b"\x0b\x00", b"\x0a\x80"])
def test_decode_example_malformed(raw):
    with pytest.raises(FeedError, match="malformed"):
        data.decode_example(raw)


# --------------------------------------------------------------------------- TFRecord framing

def test_crc32c_known_value():
    assert data._crc32c_python(b"123456789") == 0xE3069283
    assert data._crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("compression,suffix", [(None, ""), ("GZIP", ".gz"), ("ZLIB", ".zlib")])
def test_python_writer_is_read_by_tensorflow(tf, tmp_path, compression, suffix):
    records = [b"", b"a", os.urandom(1000), b"z" * 70000]
    path = tmp_path / f"r.tfrecord{suffix}"
    with open(path, "wb") as f:
        assert data._write_records_python(f, iter(records), data._norm_compression(compression)) == 4
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression or "")]
    assert got == records
    with open(path, "rb") as f:  # and by our own reader (checksums verified)
        raw = data._decompressing(f, data._norm_compression(compression))
        assert list(data.iter_tfrecords(raw, verify_checksums=True)) == records


def test_iter_tfrecords_detects_corruption(tmp_path):
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


def test_tfrecord_dataset_options(tf, tmp_path):
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

def _spark_schema():
    T = pytest.importorskip("pyspark.sql.types")
    from pyspark.ml.linalg import VectorUDT

    return T.StructType([
        T.StructField("id", T.LongType()), T.StructField("small", T.IntegerType()),
        T.StructField("flag", T.BooleanType()), T.StructField("x", T.DoubleType()),
        T.StructField("name", T.StringType()), T.StructField("raw", T.BinaryType()),
        T.StructField("arr", T.ArrayType(T.FloatType())), T.StructField("words", T.ArrayType(T.StringType())),
        T.StructField("vec", VectorUDT()),
    ])


def _rows():
    from pyspark.ml.linalg import DenseVector, SparseVector
    from pyspark.sql import Row

    R = Row("id", "small", "flag", "x", "name", "raw", "arr", "words", "vec")
    return [R(1, 2, True, 0.5, "a", b"\x01", [1.0, 2.0], ["p", "q"], DenseVector([1.0, 2.0])),
            R(2, None, False, None, None, None, [], None, SparseVector(2, {1: 3.0})),
            R(-3, -4, None, 1e3, "ü", b"", None, [], None)]


def test_encode_and_decode_plans():
    schema = _spark_schema()
    assert data._encode_plan(schema) == [
        ("id", "int64", "scalar"), ("small", "int64", "scalar"), ("flag", "int64", "scalar"),
        ("x", "float", "scalar"), ("name", "bytes", "scalar"), ("raw", "bytes", "scalar"),
        ("arr", "float", "list"), ("words", "bytes", "list"), ("vec", "float", "vector")]
    assert [t for _, t, _ in data._decode_plan(schema)] == ["int", "int", "bool", "float", "str", "bytes", "float",
                                                             "str", "float"]
    T = pytest.importorskip("pyspark.sql.types")
    for dt in (T.TimestampType(), T.DecimalType(10, 2), T.ArrayType(T.ArrayType(T.LongType())),
               T.MapType(T.StringType(), T.LongType())):
        bad = T.StructType([T.StructField("c", dt)])
        with pytest.raises(ConfigError, match="'c'"):
            data._encode_plan(bad)
        with pytest.raises(ConfigError, match="'c'"):
            data._decode_plan(bad)


def test_rows_round_trip_through_examples(tf):
    schema = _spark_schema()
    enc, dec = data._encode_plan(schema), data._decode_plan(schema)
    raws = [data._encode_row(r, enc) for r in _rows()]
    first = tf.train.Example.FromString(raws[0]).features.feature
    assert list(first["vec"].float_list.value) == [1.0, 2.0] and list(first["flag"].int64_list.value) == [1]
    back = [data._example_to_row(data.decode_example(r), dec) for r in raws]
    assert back[0][:7] == (1, 2, True, 0.5, "a", b"\x01", [1.0, 2.0]) and back[0][7] == ["p", "q"]
    assert list(back[0][8]) == [1.0, 2.0]
    assert back[1][:8] == (2, None, False, None, None, None, [], None) and list(back[1][8]) == [0.0, 3.0]
    assert back[2] == (-3, -4, None, 1000.0, "ü", b"", None, [], None)


def test_example_to_row_errors():
    T = pytest.importorskip("pyspark.sql.types")
    plan = data._decode_plan(T.StructType([T.StructField("a", T.LongType())]))
    with pytest.raises(ConfigError, match="declare it as an array"):
        data._example_to_row({"a": [1, 2]}, plan)
    with pytest.raises(ConfigError, match="declare float/double"):
        data._example_to_row({"a": [1.5]}, plan)
    with pytest.raises(ConfigError, match="null element"):
        data._encode_row((["x", None],), [("w", "bytes", "list")])


@pytest.mark.parametrize("engine", ["python", "tensorflow"])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_write_partition_and_decode_file_without_spark(tf, tmp_path, engine, compression):
    schema = _spark_schema()
    out = tmp_path / "out"
    fs, path, prefix = data._resolve(_uri(out))
    data._prepare_output(fs, path, _uri(out), "error")
    spec = {"uri": _uri(out), "plan": data._encode_plan(schema), "compression": data._norm_compression(compression),
            "engine": engine}
    rows = _rows()
    ext = ".tfrecord" + (".gz" if compression else "")
    assert data._write_partition(spec, 3, iter(rows)) == [(_uri(out / f"part-00003{ext}"), 3)]
    assert data._write_partition(spec, 3, iter(rows[:1])) == [(_uri(out / f"part-00003{ext}"), 1)]  # a retry replaces
    assert data._write_partition(spec, 4, iter([])) == []  # empty partitions write no file
    data._commit_output(fs, path)
    assert sorted(os.listdir(out)) == ["_SUCCESS", f"part-00003{ext}"]
    assert data.list_files(_uri(out)) == [_uri(out / f"part-00003{ext}")]
    # TensorFlow reads the file (checksums and compression verified)
    (raw,) = [r.numpy() for r in tf.data.TFRecordDataset(str(out / f"part-00003{ext}"),
                                                          compression_type=compression or "")]
    assert tf.train.Example.FromString(raw).features.feature["name"].bytes_list.value[0] == b"a"
    content = (out / f"part-00003{ext}").read_bytes()
    (row,) = data._decode_file(data._decode_plan(schema), "auto", ("file:" + str(out / f"part-00003{ext}"), content))
    assert row[:5] == (1, 2, True, 0.5, "a")
    assert list(data._decode_file([], "auto", ("file:/x/_SUCCESS", b""))) == []


def test_prepare_output_modes(tmp_path):
    out = tmp_path / "o"
    fs, path, _ = data._resolve(str(out))
    data._prepare_output(fs, path, str(out), "error")  # creates it
    data._prepare_output(fs, path, str(out), "error")  # empty: fine
    _touch(out / "part-00000.tfrecord", 1)
    with pytest.raises(ConfigError, match="mode='overwrite'"):
        data._prepare_output(fs, path, str(out), "error")
    data._prepare_output(fs, path, str(out), "overwrite")
    assert os.listdir(out) == []
    with pytest.raises(ConfigError, match="mode must be"):
        data._prepare_output(fs, path, str(out), "append")
    with pytest.raises(ConfigError, match="root directory"):
        data._prepare_output(fs, "/", "file:///", "overwrite")


def test_tfos_error_recovered_from_spark_error_text():
    text = ("An error occurred while calling o123.collectAndServe.\nTraceback (most recent call last):\n"
            "  File ...\ntfos.errors.ConfigError: column 'a' holds an array with a null element\n\tat org...")
    err = data._tfos_error_from(RuntimeError(text))
    assert type(err) is ConfigError and "null element" in str(err)
    other = RuntimeError("boom")
    assert data._tfos_error_from(other) is other


class _FakeRDD:
    """Just enough of an RDD to run the driver code of save/load_tfrecords without Spark: task
    functions are pickled with Spark's cloudpickle, as Spark would ship them."""

    def __init__(self, partitions):
        self.partitions = partitions

    def _ship(self, fn):
        from pyspark import cloudpickle

        return cloudpickle.loads(cloudpickle.dumps(fn))

    def mapPartitionsWithIndex(self, fn):
        fn = self._ship(fn)
        return _FakeRDD([list(fn(i, iter(p))) for i, p in enumerate(self.partitions)])

    def flatMap(self, fn):
        fn = self._ship(fn)
        return _FakeRDD([[y for x in p for y in fn(x)] for p in self.partitions])

    def collect(self):
        return [x for p in self.partitions for x in p]


class _FakeSpark:
    def __init__(self):
        self.sparkContext = types.SimpleNamespace(master="local[2]", binaryFiles=self._binary_files)
        self.sparkSession = self

    def _binary_files(self, paths, minPartitions=None):
        files = []
        for p in paths.split(","):
            assert p.startswith("file:///"), p
            local = p[len("file://"):]
            names = sorted(os.listdir(local)) if os.path.isdir(local) else [None]
            for n in names:
                path = os.path.join(local, n) if n else local
                files.append(("file:" + path, open(path, "rb").read()))
        return _FakeRDD([files])

    def createDataFrame(self, rows, schema):
        return types.SimpleNamespace(schema=schema, rows=rows.collect() if isinstance(rows, _FakeRDD) else rows)


def _fake_df(rows, schema, num_partitions=2):
    parts = [rows[i::num_partitions] for i in range(num_partitions)]
    return types.SimpleNamespace(schema=schema, rdd=_FakeRDD(parts), sparkSession=_FakeSpark())


def test_save_and_load_driver_code_with_a_fake_spark(tf, tmp_path):
    schema = _spark_schema()
    rows = _rows()
    df = _fake_df(rows, schema, num_partitions=3)
    out = tmp_path / "saved"
    written = data.save_as_tfrecords(df, str(out), engine="python")
    assert written == [(str(out / f"part-{i:05d}.tfrecord"), 1) for i in range(3)]
    assert sorted(os.listdir(out)) == ["_SUCCESS"] + [f"part-{i:05d}.tfrecord" for i in range(3)]
    with pytest.raises(ConfigError, match="already exists"):
        data.save_as_tfrecords(df, str(out))
    written = data.save_as_tfrecords(_fake_df(rows, schema, 1), _uri(out), mode="overwrite", compression="ZLIB")
    assert written == [(_uri(out / "part-00000.tfrecord.zlib"), 3)]
    loaded = data.load_tfrecords(_FakeSpark(), str(out), schema)
    assert [r[0] for r in loaded.rows] == [1, 2, -3] and loaded.rows[2][4] == "ü"
    assert [r.numpy() for r in data.tfrecord_dataset(data.list_files(_uri(out)))][0] == data._encode_row(
        rows[0], data._encode_plan(schema))


def test_save_as_tfrecords_task_error_is_raised_as_config_error(tmp_path):
    T = pytest.importorskip("pyspark.sql.types")
    schema = T.StructType([T.StructField("w", T.ArrayType(T.StringType()))])
    out = tmp_path / "bad"

    class FailingRDD(_FakeRDD):
        def mapPartitionsWithIndex(self, fn):
            try:
                return super().mapPartitionsWithIndex(fn)
            except Exception as e:  # what reaches the driver: a Py4J error holding the Python traceback
                import traceback

                raise RuntimeError("Job aborted.\n" + "".join(traceback.format_exception(e))) from None

    df = types.SimpleNamespace(schema=schema, rdd=FailingRDD([[(["a", None],)]]), sparkSession=_FakeSpark())
    with pytest.raises(ConfigError, match="null element.*raised in a Spark task"):
        data.save_as_tfrecords(df, str(out), engine="python")
    assert os.listdir(out) == []  # _temporary cleaned up, no _SUCCESS


# --------------------------------------------------------------------------- Spark (run by the integrator)

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
