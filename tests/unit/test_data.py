"""tfos.data, first half: the import, listing, HDFS set-up errors, sharding and the tf.train.Example
codec (test_data_readers.py: TFRecord framing, the readers, DataFrame <-> TFRecord without Spark)."""

import itertools
import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest

from tfos import data
from tfos.data import example
from tfos.data import fs as dfs
from tfos.errors import ConfigError, FeedError, HadoopConfigError, TFOSError
from _data_helpers import _touch, _uri, tf  # noqa: F401  (tf: a fixture)

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
        "save_as_tfrecords", "load_tfrecords", "filesystem", "KINDS"])
    assert all(callable(getattr(data, name)) for name in data.__all__ if name != "KINDS")


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
    monkeypatch.setattr(dfs, "_hdfs_native_installed", lambda: False)  # nor hdfs-native


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


_RESOLVE = {"nn.example": "10.0.0.5", "localhost": "127.0.0.1"}.__getitem__


@pytest.mark.parametrize("base,core,tokens,expected", [
    # no token file: hdfs-native's own choice (Kerberos ticket, or simple auth)
    ("hdfs://nn.example:8020", {}, None, "hdfs://nn.example:8020"),
    ("hdfs://", {"fs.defaultFS": "hdfs://nn.example:8020"}, None, None),
    # tokens, NameNode named by host name: its address, as Hadoop names the token's service
    ("hdfs://nn.example:8020", {}, "/c/tokens", "hdfs://10.0.0.5:8020"),
    ("hdfs://", {"fs.defaultFS": "hdfs://nn.example:8020"}, "/c/tokens", "hdfs://10.0.0.5:8020"),
    ("hdfs://", {"fs.default.name": "hdfs://localhost:9000"}, "/c/tokens", "hdfs://127.0.0.1:9000"),
    # left alone: an address, an HA nameservice (tokens "ha-hdfs:ns"), viewfs, use_ip off, no port
    ("hdfs://10.0.0.5:8020", {}, "/c/tokens", "hdfs://10.0.0.5:8020"),
    ("hdfs://ns1", {}, "/c/tokens", "hdfs://ns1"),
    ("hdfs://", {"fs.defaultFS": "hdfs://ns1"}, "/c/tokens", None),
    ("viewfs://cluster", {}, "/c/tokens", "viewfs://cluster"),
    ("hdfs://nn.example:8020", {"hadoop.security.token.service.use_ip": " False"}, "/c/tokens",
     "hdfs://nn.example:8020"),
    ("hdfs://unknown.example:8020", {}, "/c/tokens", "hdfs://unknown.example:8020"),  # hdfs-native says
])
def test_hdfs_client_url_matches_the_delegation_token_service(base, core, tokens, expected):
    from tfos.data.hdfs import client_url

    def resolve(host):
        if host not in ("nn.example", "localhost"):
            raise OSError(f"unknown host {host}")
        return _RESOLVE(host)

    assert client_url(base, core, tokens, resolve) == expected


@pytest.mark.parametrize("text,fix", [
    ('GSSAPIError(GssMajorCodes { raw: "0x00070000", routine_error: "GSS_S_NO_CRED" }, "No Kerberos credentials '
     'available (default cache: FILE:/tmp/krb5cc_0)")', True),
    ("NoSASLMechanism", True),
    ("Connection refused (os error 111)", False),
])
def test_missing_kerberos_credentials_name_the_fix(text, fix):
    from tfos.data.hdfs import _hadoop_error

    err = _hadoop_error(RuntimeError(text), "hdfs://nn:8020")
    assert isinstance(err, HadoopConfigError) == fix
    if fix:
        for needle in ("kinit", "KRB5_CLIENT_KTNAME", "--principal and --keytab", "HADOOP_TOKEN_FILE_LOCATION",
                       "hdfs://nn:8020"):
            assert needle in str(err), needle


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
