"""TensorFlow's own hdfs:// through tfos's plugin (tfos.data.tfhdfs, built with cargo), on the real
cluster: each case runs in a fresh TF process that only registers the plugin, and what it wrote is
checked with Hadoop's FsShell."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("tensorflow")


def _tf(hadoop, script, *args, env=None):
    """``script`` in a fresh Python with HADOOP_CONF_DIR; returns the JSON of its last line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HADOOP_CONF_DIR": str(hadoop.conf_dir),
                                            "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


GFILE = """
    import json, sys
    import tensorflow as tf
    from tfos.data import tfhdfs

    assert tfhdfs.register(required=True)
    g, base, out = tf.io.gfile, sys.argv[1], {}
    g.makedirs(base + "/a/b")
    with g.GFile(base + "/a/x.txt", "w") as f:
        f.write("hello\\n" * 3)
    with g.GFile(base + "/a/x.txt", "a") as f:
        f.write("more")
    out["text"] = g.GFile(base + "/a/x.txt").read()
    out["size"] = g.stat(base + "/a/x.txt").length
    out["listing"] = sorted(g.listdir(base + "/a"))
    out["isdir"] = [g.isdir(base + "/a/b"), g.isdir(base + "/a/x.txt")]
    out["glob"] = g.glob(base + "/a/*.txt")
    g.GFile(base + "/a/y.txt", "w").write("old")
    g.rename(base + "/a/x.txt", base + "/a/y.txt", overwrite=True)  # how TF makes a file appear whole
    out["renamed"] = [g.exists(base + "/a/x.txt"), g.GFile(base + "/a/y.txt").read()[:5]]
    for what, call in (("missing", lambda: g.GFile(base + "/nope").read()),
                       ("onto_dir", lambda: g.GFile(base + "/a", "w").write("x")),
                       ("parent", lambda: g.GFile(base + "/no/such/dir/f", "w").write("x"))):
        try:
            call()
            out[what] = None
        except tf.errors.OpError as e:
            out[what] = type(e).__name__
    g.makedirs(base + "/gone/deep")
    g.GFile(base + "/gone/deep/f", "w").write("x")
    g.rmtree(base + "/gone")
    out["gone"] = g.exists(base + "/gone")

    # a checkpoint, a SavedModel and TensorBoard events written by TF itself
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, base + "/ckpt", max_to_keep=2)
    for _ in range(3):
        manager.save()
    weights = [w.numpy().tolist() for w in model.weights]
    fresh = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    tf.train.Checkpoint(model=fresh).restore(tf.train.latest_checkpoint(base + "/ckpt")).assert_consumed()
    out["restored"] = [w.numpy().tolist() for w in fresh.weights] == weights
    out["latest"] = tf.train.latest_checkpoint(base + "/ckpt")
    tf.saved_model.save(model, base + "/export")
    out["served"] = tf.saved_model.load(base + "/export").signatures is not None
    writer = tf.summary.create_file_writer(base + "/tb")
    with writer.as_default():
        tf.summary.scalar("loss", 0.5, step=1)
    writer.close()
    print(json.dumps(out))
"""


def test_tensorflow_itself_reads_and_writes_hdfs(hadoop, plugin):
    base = "/tests/plugin-gfile"
    got = _tf(hadoop, GFILE, f"hdfs://{base}")
    assert got["text"] == "hello\n" * 3 + "more" and got["size"] == 22
    assert got["listing"] == ["b", "x.txt"] and got["isdir"] == [True, False]
    assert got["glob"] == [f"hdfs://{base}/a/x.txt"]
    assert got["renamed"] == [False, "hello"]
    assert (got["missing"], got["onto_dir"], got["parent"]) == ("NotFoundError", "FailedPreconditionError",
                                                               "NotFoundError")
    assert got["gone"] is False
    assert got["restored"] and got["latest"] == f"hdfs://{base}/ckpt/ckpt-3" and got["served"]
    # what HDFS holds, as Hadoop's own client lists it
    listing = hadoop.fs("-ls", "-R", base).stdout
    names = {line.split()[-1][len(base) + 1:] for line in listing.splitlines() if line.startswith(("-", "d"))}
    assert {"a/y.txt", "ckpt/checkpoint", "ckpt/ckpt-3.index", "ckpt/ckpt-3.data-00000-of-00001",
            "export/saved_model.pb", "export/variables/variables.index"} <= names, names
    assert "ckpt/ckpt-1.index" not in names and not any(n.startswith("gone") for n in names)
    assert [n for n in names if n.startswith("tb/events.out.tfevents.")]
    assert hadoop.fs("-cat", f"{base}/a/y.txt").stdout == "hello\n" * 3 + "more"


READS = """
    import hashlib, json, sys
    import tensorflow as tf
    from tfos import data
    from tfos.data import tfhdfs

    blob, records, spans = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    out = {"pieces": []}
    ds = data.tfrecord_dataset([records])  # 'auto': TensorFlow reads hdfs:// itself once the plugin is there
    out["plugin"] = tfhdfs.registered() is not None
    h, n = hashlib.sha256(), 0
    for r in ds.as_numpy_iterator():
        h.update(r)
        n += 1
    out["records"], out["records_sha"] = n, h.hexdigest()
    with tf.io.gfile.GFile(blob, "rb") as f:  # reads anywhere in the file, then front to back
        for offset, size in spans:
            f.seek(offset)
            out["pieces"].append(hashlib.sha256(f.read(size)).hexdigest())
        f.seek(0)
        out["whole"] = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps(out))
"""


def test_reads_give_every_byte_in_order_and_anywhere(hadoop, plugin, tmp_path):
    """A file read from the front streams; a read elsewhere is one ranged read: both give the file's
    bytes. tfos.data.tfrecord_dataset hands hdfs:// to TensorFlow once the plugin is registered."""
    from tfos.data.tfrecord import tfrecord_frame

    rng = np.random.default_rng(1)
    blob = rng.integers(0, 256, (9 << 20) + 4321, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    payloads = [rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes() for _ in range(3000)]
    (tmp_path / "r.tfrecord").write_bytes(b"".join(tfrecord_frame(p) for p in payloads))
    base = "/tests/plugin-reads"
    hadoop.fs("-mkdir", "-p", base)
    hadoop.fs("-put", "-f", str(tmp_path / "blob"), str(tmp_path / "r.tfrecord"), base)
    spans = [(5 << 20, 1000), (17, 1 << 20), (len(blob) - 10, 100), ((1 << 20) - 3, 7), (0, 65537)]
    got = _tf(hadoop, READS, f"{hadoop.default_fs}{base}/blob", f"hdfs://{base}/r.tfrecord", json.dumps(spans))
    assert got["plugin"]
    assert got["records"] == len(payloads)
    assert got["records_sha"] == hashlib.sha256(b"".join(payloads)).hexdigest()
    assert got["pieces"] == [hashlib.sha256(blob[o:o + s]).hexdigest() for o, s in spans]
    assert got["whole"] == hashlib.sha256(blob).hexdigest()


def test_switched_off_tfos_reads_through_its_own_layer(hadoop, plugin, tmp_path):
    """TFOS_HDFS_TF=0: no plugin; tfrecord_dataset reads hdfs:// through tfos's reader process, and
    TensorFlow alone still cannot open hdfs:// (why the plugin exists)."""
    from tfos.data.tfrecord import tfrecord_frame

    (tmp_path / "r.tfrecord").write_bytes(b"".join(tfrecord_frame(f"{i}".encode()) for i in range(50)))
    base = "/tests/plugin-off"
    hadoop.fs("-mkdir", "-p", base)
    hadoop.fs("-put", "-f", str(tmp_path / "r.tfrecord"), base)
    got = _tf(hadoop, """
        import json, sys
        import tensorflow as tf
        from tfos import data
        from tfos.data import tfhdfs

        out = {"records": len(list(data.tfrecord_dataset([sys.argv[1]]).as_numpy_iterator())),
               "plugin": tfhdfs.registered()}
        try:
            tf.io.gfile.exists(sys.argv[1])
        except tf.errors.UnimplementedError:
            out["tf_alone"] = "unimplemented"
        print(json.dumps(out))
    """, f"hdfs://{base}/r.tfrecord", env={"TFOS_HDFS_TF": "0"})
    assert got == {"records": 50, "plugin": None, "tf_alone": "unimplemented"}


def test_a_stopped_datanode_does_not_stop_a_read(hadoop, plugin, tmp_path):
    """Replication 2 and 1 MB blocks: with a DataNode stopped (the NameNode still lists it, so a
    block's first location is often the dead one), TF reads every byte from the other replicas."""
    blob = np.random.default_rng(2).integers(0, 256, (6 << 20) + 777, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    base = "/tests/plugin-datanode"
    hadoop.fs("-mkdir", "-p", base)
    hadoop.fs("-D", "dfs.blocksize=1048576", "-put", "-f", str(tmp_path / "blob"), base)
    assert hadoop.fs("-stat", "%r %o", f"{base}/blob").stdout.split() == ["2", "1048576"]
    hadoop.stop_daemon("datanode-0")
    try:
        got = _tf(hadoop, """
            import hashlib, json, sys
            import tensorflow as tf
            from tfos.data import tfhdfs

            tfhdfs.register(required=True)
            with tf.io.gfile.GFile(sys.argv[1], "rb") as f:
                print(json.dumps({"sha": hashlib.sha256(f.read()).hexdigest()}))
        """, f"hdfs://{base}/blob")
    finally:
        hadoop.start_daemon("datanode-0")
    assert got["sha"] == hashlib.sha256(blob).hexdigest()
