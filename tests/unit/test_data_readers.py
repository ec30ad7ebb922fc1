"""tfos.data, second half: TFRecord framing, the tf.data readers (TFRecord, Parquet, CSV) and the Spark
DataFrame <-> TFRecord helpers without Spark (tests/integration/test_data_spark.py runs them on Spark)."""

import gzip
import io
import os

import numpy as np
import pytest

from tfos import data
from tfos.data import spark_io, tfrecord
from tfos.data import fs as dfs
from tfos.errors import ConfigError, FeedError
from _data_helpers import _policy_off, _take_all, _touch, _uri, tf  # noqa: F401  (tf: a fixture)
from tfos_test_data import spark_rows as _rows
from tfos_test_data import spark_schema as _spark_schema

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


def test_whole_records_stops_at_the_last_complete_record():
    from tfos.data.spool import whole_records
    from tfos.data.tfrecord import tfrecord_frame

    a, b = tfrecord_frame(b"x" * 10), tfrecord_frame(b"y" * 300)
    assert whole_records(a + b) == len(a + b) and whole_records(a + b[:-1]) == len(a)
    assert whole_records(a[:5]) == 0 and whole_records(b"") == 0


@pytest.mark.parametrize("sizes,block", [
    ([10, 300, 5, 5000, 1, 0, 64], 7),      # carries shorter than a record's 8-byte length
    ([10, 300, 5, 5000, 1, 0, 64], 100),    # a record longer than several blocks
    ([10, 300, 5, 5000, 1, 0, 64], 26),     # the first record ends exactly at the block's end
    ([100] * 50, 116 * 3),                  # every cut on a record boundary: no carry
    ([100] * 50, 8 << 20),                  # one block holds everything
])
def test_cut_block_writes_whole_records_in_order_without_joining(sizes, block):
    from tfos.data.spool import cut_block, whole_records
    from tfos.data.tfrecord import tfrecord_frame

    stream = b"".join(tfrecord_frame(bytes([i % 256]) * n) for i, n in enumerate(sizes))
    written, carry = [], b""
    for pos in range(0, len(stream), block):
        parts, carry = cut_block(carry, memoryview(stream[pos:pos + block]))
        if parts:
            piece = b"".join(bytes(p) for p in parts)
            assert whole_records(piece) == len(piece)  # each file TF reads holds whole records only
            written.append(piece)
    assert carry == b"" and b"".join(written) == stream


def test_one_reader_process_serves_dataset_after_dataset(tf, tmp_path):
    """tf.data runs the paths generator on threads that end with each iterator; the reader process
    must not die with them (Linux's parent-death signal follows the starting thread)."""
    from tfos.data import spool

    spool._close_idle()
    path = tmp_path / "r.tfrecord"
    with open(path, "wb") as f:
        for i in range(100):
            f.write(data.tfrecord_frame(b"%d" % i))
    pids = []
    for _ in range(3):
        assert sum(int(b.shape[0]) for b in data.tfrecord_dataset([str(path)], reader="arrow").batch(7)) == 100
        assert len(spool._idle) == 1 and spool._idle[0].proc.poll() is None
        pids.append(spool._idle[0].proc.pid)
    assert len(set(pids)) == 1, pids
    spool._close_idle()


def test_the_arrow_reader_streams_blocks_and_names_a_truncated_file(tf, tmp_path, monkeypatch):
    """Blocks much smaller than the file: records cross block ends; a file cut inside a record is an
    error naming it; a consumer that stops early leaves no reader process and no spooled block."""
    import glob

    from tfos.data import spool
    from tfos.host import private

    monkeypatch.setenv("TFOS_SPOOL_BLOCK", "1000")  # for new reader processes: end the idle ones
    spool._close_idle()
    recs = [bytes([i % 256]) * (i % 97 + 1) for i in range(2000)]
    path = tmp_path / "r.tfrecord"
    with open(path, "wb") as f:
        for r in recs:
            f.write(data.tfrecord_frame(r))
    assert [r.numpy() for r in data.tfrecord_dataset([str(path)], reader="arrow")] == recs
    assert [r.numpy() for r in data.tfrecord_dataset([str(path)], reader="arrow").take(3)] == recs[:3]
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(tf.errors.UnknownError, match=r"truncated TFRecord in .*cut\.tfrecord"):
        list(data.tfrecord_dataset([str(cut)], reader="arrow"))
    assert not glob.glob(private.private_dir("spool") + "/spool-*/*.tfrecord")
    spool._close_idle()
