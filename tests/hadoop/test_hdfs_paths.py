"""hdfs:// through tfos on the real cluster, checked with Hadoop's own FsShell: tfos.data reads
HDFS without a JVM (hdfs-native), and the TF process's staging mirror puts checkpoints and
exports there."""

import os
import types

import numpy as np
import pytest

from tfos import data
from tfos.cluster.node.staging import Mirror


@pytest.fixture
def hdfs_dir(hadoop, request):
    path = f"/tests/{request.node.name}"
    hadoop.fs("-mkdir", "-p", path)
    return path


def _tfrecord_files(tmp_path, n_files, per_file):
    from tfos.data.tfrecord import tfrecord_frame

    paths = []
    for i in range(n_files):
        p = tmp_path / f"part-{i:05d}.tfrecord"
        with open(p, "wb") as f:
            for j in range(per_file):
                f.write(tfrecord_frame(f"{i}:{j}".encode()))
        paths.append(str(p))
    return paths


def test_tfos_data_lists_shards_and_reads_hdfs(hadoop, hdfs_dir, tmp_path):
    pytest.importorskip("tensorflow")
    local = _tfrecord_files(tmp_path, 4, 50)
    hadoop.fs("-put", *local, hdfs_dir)
    uri = f"{hadoop.default_fs}{hdfs_dir}"
    files = data.list_files(uri, pattern="*.tfrecord")
    assert files == [f"{uri}/part-{i:05d}.tfrecord" for i in range(4)]
    assert [s for _, s in data.list_files_with_sizes(uri)] == [os.path.getsize(p) for p in local]
    ctx = [types.SimpleNamespace(rank=r, num_workers=2) for r in range(2)]
    shards = [data.rank_files(c, uri, "*.tfrecord") for c in ctx]
    assert sorted(shards[0] + shards[1]) == files and not set(shards[0]) & set(shards[1])
    records = [r.decode() for r in data.tfrecord_dataset(shards[1], reader="arrow").as_numpy_iterator()]
    assert len(records) == 100 and {r.split(":")[0] for r in records} == {"1", "3"}


def test_streams_read_every_byte_in_any_read_size(hadoop, hdfs_dir, tmp_path):
    """open_input_stream (hdfs-native's range stream, joined per read) and open_input_file (the
    seekable reader) give the file's bytes whatever the read sizes, across the stream's pieces."""
    from tfos.data.fs import _resolve

    blob = np.random.default_rng(0).integers(0, 256, (3 << 20) + 12345, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    hadoop.fs("-put", str(tmp_path / "blob"), hdfs_dir)
    fs, path, _ = _resolve(f"{hadoop.default_fs}{hdfs_dir}/blob")
    for sizes in ([1, 7, 65536, 65537, 1 << 20], [3 << 20], [-1]):
        with fs.open_input_stream(path) as f:
            got, i = [], 0
            while True:
                b = f.read(sizes[i % len(sizes)]) if sizes != [-1] else f.read()
                i += 1
                if not b:
                    break
                got.append(b)
            assert b"".join(got) == blob
    with fs.open_input_file(path) as f:
        f.seek(len(blob) - 100)
        assert f.read() == blob[-100:]
    fs.copy_file(path, path + ".copy")
    with fs.open_input_stream(path + ".copy") as f:
        assert f.read() == blob


def test_mirror_puts_checkpoints_on_hdfs_state_file_last(hadoop, hdfs_dir, tmp_path):
    uri = f"{hadoop.default_fs}{hdfs_dir}/ckpt"
    m = Mirror(uri, str(tmp_path / "local"))
    assert m.restore() == 0
    blob = np.random.default_rng(0).bytes(20 << 20)  # bigger than a copy block
    (tmp_path / "local" / "ckpt-1.data-00000-of-00001").write_bytes(blob)
    (tmp_path / "local" / "ckpt-1.index").write_bytes(b"index")
    (tmp_path / "local" / "checkpoint").write_bytes(b'model_checkpoint_path: "ckpt-1"\n')
    m.close()
    listing = hadoop.fs("-ls", f"{hdfs_dir}/ckpt").stdout
    assert all(n in listing for n in ("ckpt-1.data-00000-of-00001", "ckpt-1.index", "checkpoint"))
    assert ".tfos-upload-" not in listing
    got = tmp_path / "got"
    hadoop.fs("-get", f"{hdfs_dir}/ckpt/ckpt-1.data-00000-of-00001", str(got))
    assert got.read_bytes() == blob
    again = Mirror(uri, str(tmp_path / "second"), upload=False)
    assert again.restore() == 3 and (tmp_path / "second" / "ckpt-1.index").read_bytes() == b"index"


def _never_run(args, ctx):  # an estimator's train_fn, saved and loaded only
    return args


def test_a_pickled_train_fn_loads_from_hdfs_only_if_only_this_user_can_write_it(hadoop, hdfs_dir, spark):
    """TFEstimator.load unpickles train_fn (code) from hdfs:// only when every file under it is
    this user's, as HDFS knows the session, and writable by nobody else: the same rule as on a
    local disk. The files are changed with FsShell, as another writer would."""
    from tfos.errors import ConfigError
    from tfos.ml import TFEstimator

    uri = f"{hadoop.default_fs}{hdfs_dir}/est"
    TFEstimator(_never_run, {"lr": 0.1}, inputCols=["features"]).save(uri)
    loaded = TFEstimator.load(uri)
    assert loaded.train_fn is _never_run and loaded.tf_args == {"lr": 0.1}
    hadoop.fs("-chmod", "g+w", f"{hdfs_dir}/est/train_fn")
    with pytest.raises(ConfigError, match=r"writable by others \(rwxrwxr-x\)"):
        TFEstimator.load(uri)
    hadoop.fs("-chmod", "g-w", f"{hdfs_dir}/est/train_fn")
    part = [line.split()[-1] for line in hadoop.fs("-ls", f"{hdfs_dir}/est/train_fn").stdout.splitlines()
            if line.split() and line.split()[-1].endswith(".parquet")][0]
    hadoop.fs("-chown", "mallory", part)  # the cluster's superuser is this user
    with pytest.raises(ConfigError, match=r"belongs to mallory"):
        TFEstimator.load(uri)
    me = spark.sparkContext._jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser().getShortUserName()
    hadoop.fs("-chown", me, part)
    assert TFEstimator.load(uri).train_fn is _never_run
