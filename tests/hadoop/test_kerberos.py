"""A Kerberos Hadoop cluster (a MiniKdc from Maven Central; every daemon logs in from its keytab:
``python -m tfos.testing.hadoop up --kerberos``). HDFS is reached by tfos.data and the TF process's
TFRecord reader with the credentials a user has: a keytab (or a kinit ticket), or, as in a YARN
container, HDFS delegation tokens alone; without credentials the error names the fix (each case
in a fresh process with only its own credentials). And the digits example trains under
``spark-submit --principal --keytab`` on its YARN, the containers holding only the job's tokens."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tfos.testing import wait_no_tfos_processes
from tfos.testing.hadoop import yarn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FETCH_TOKEN = "org.apache.hadoop.hdfs.tools.DelegationTokenFetcher"  # what 'hdfs fetchdt' runs


@pytest.fixture(scope="module")
def secure(secure_hadoop, tmp_path_factory):
    cluster, exports = secure_hadoop
    assert set(exports) == {"KRB5_CONFIG", "KRB5CCNAME", "KRB5_CLIENT_KTNAME", "HADOOP_CONF_DIR"}
    records = tmp_path_factory.mktemp("records") / "part-00000.tfrecord"
    from tfos.data.tfrecord import tfrecord_frame

    records.write_bytes(b"".join(tfrecord_frame(f"r{i}".encode()) for i in range(20)))
    cluster.fs("-mkdir", "-p", "/secure")  # Hadoop's own client, with the ticket `up` obtained
    cluster.fs("-put", str(records), "/secure/")
    return cluster, exports


CHILD = textwrap.dedent("""
    import json, sys
    from tfos import data
    from tfos.data.fs import _resolve

    uri, reader = sys.argv[1], sys.argv[2]  # 'list' (no records), 'arrow', 'tensorflow' or 'gfile' (TF alone)
    out = {}
    try:
        if reader == "gfile":
            import tensorflow as tf
            from tfos.data import tfhdfs

            tfhdfs.register(required=True)
            tf.io.gfile.stat(uri)  # listdir would say only "could not find directory" (its isdir check)
            out["files"] = tf.io.gfile.listdir(uri)
            reader = "list"
        files = out.get("files") or data.list_files(uri, pattern="*.tfrecord")
        out["files"] = [f.rsplit("/", 1)[1] for f in files]
        if reader != "list":  # TFRecordDataset fed by tfos's reader process, or opening hdfs:// itself (plugin)
            ds = data.tfrecord_dataset(files, reader=reader)
            out["records"] = sorted(r.decode() for r in ds.as_numpy_iterator())
            fs, path, _ = _resolve(uri + "/written.bin")
            with fs.open_output_stream(path) as w:
                w.write(b"from a Kerberos client")
            with fs.open_input_stream(path) as r:
                out["written"] = r.read().decode()
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
""")


def _client(secure, tmp_path, uri, *, keytab=False, tokens=None, conf=None, reader="list"):
    """CHILD in a fresh process: the realm's krb5.conf, an empty ticket cache of its own, and only
    the credentials asked for."""
    cluster, exports = secure
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRB5") and k != "HADOOP_TOKEN_FILE_LOCATION"}
    env.update(HADOOP_CONF_DIR=str(conf or exports["HADOOP_CONF_DIR"]), KRB5_CONFIG=exports["KRB5_CONFIG"],
               KRB5CCNAME=f"FILE:{tmp_path / 'ccache'}")
    if keytab:
        env["KRB5_CLIENT_KTNAME"] = exports["KRB5_CLIENT_KTNAME"]
    if tokens:
        env["HADOOP_TOKEN_FILE_LOCATION"] = str(tokens)
    proc = subprocess.run([sys.executable, "-c", CHILD, uri, reader], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("reader", ["arrow", "tensorflow"])
def test_a_keytab_reads_records_and_writes(secure, tmp_path, plugin, reader):
    cluster, _ = secure
    got = _client(secure, tmp_path, f"{cluster.default_fs}/secure", keytab=True, reader=reader)
    assert got == {"files": ["part-00000.tfrecord"], "records": sorted(f"r{i}" for i in range(20)),
                   "written": "from a Kerberos client"}


@pytest.mark.parametrize("reader", ["list", "gfile"])
def test_without_credentials_the_error_names_the_fix(secure, tmp_path, plugin, reader):
    """Through tfos's fs layer (HadoopConfigError) and through TensorFlow's own gfile (the plugin)."""
    cluster, _ = secure
    got = _client(secure, tmp_path, f"{cluster.default_fs}/secure", reader=reader)
    assert got["error"].startswith("HadoopConfigError: " if reader == "list" else "UnauthenticatedError: "), got
    for needle in ("no Kerberos credentials", "kinit", "--principal and --keytab", "HADOOP_TOKEN_FILE_LOCATION",
                   "GSS_S_NO_CRED"):
        assert needle in got["error"], needle


def test_delegation_tokens_alone_reach_a_namenode_named_by_host_name(secure, tmp_path, plugin):
    """As in a YARN container: no ticket, the job's HDFS token in HADOOP_TOKEN_FILE_LOCATION. Hadoop
    names the token's service by the NameNode's address (127.0.0.1:port); the user names the
    NameNode by host name (localhost:port), in the URI or in fs.defaultFS."""
    cluster, exports = secure
    tokens = tmp_path / "tokens"
    cluster.hadoop_cli([FETCH_TOKEN, "--renewer", "tfos", str(tokens)])  # 'hdfs fetchdt', with the ticket
    port = cluster.ports["nn_rpc"]
    by_name = f"hdfs://localhost:{port}"
    for reader in ("arrow", "tensorflow"):  # tfos's fs layer, and TensorFlow through the plugin
        got = _client(secure, tmp_path, f"{by_name}/secure", tokens=tokens, reader=reader)
        assert got.get("records") == sorted(f"r{i}" for i in range(20)), (reader, got)
    conf = tmp_path / "conf"  # the same cluster, fs.defaultFS by host name
    shutil.copytree(exports["HADOOP_CONF_DIR"], conf)
    core = conf / "core-site.xml"
    core.write_text(core.read_text().replace(cluster.default_fs, by_name))
    assert _client(secure, tmp_path, "hdfs:///secure", tokens=tokens, conf=conf) == {"files": ["part-00000.tfrecord"]}
    got = _client(secure, tmp_path, "hdfs:///secure", tokens=tokens, conf=conf, reader="tensorflow")
    assert got.get("records") == sorted(f"r{i}" for i in range(20)), got
    # why tfos connects by address: hdfs-native looks the token up by the URL's host:port as written
    raw = subprocess.run([sys.executable, "-c", "import sys, hdfs_native; hdfs_native.Client(sys.argv[1]).get_file_info('/')",
                          by_name], capture_output=True, text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("KRB5")},
                              "HADOOP_CONF_DIR": str(conf), "KRB5_CONFIG": exports["KRB5_CONFIG"],
                              "KRB5CCNAME": f"FILE:{tmp_path / 'raw-ccache'}", "HADOOP_TOKEN_FILE_LOCATION": str(tokens)})
    assert raw.returncode != 0 and "GSS_S_NO_CRED" in raw.stderr


@pytest.mark.slow
def test_spark_submit_with_a_keytab_trains_on_kerberos_yarn_with_tokens_alone_in_the_containers(secure, tmp_path,
                                                                                                plugin):
    """``spark-submit --principal --keytab``, cluster deploy mode: Spark logs in from the keytab and
    hands HDFS delegation tokens to every container. The driver (in the ApplicationMaster's
    container) and the TF processes inherit the NodeManagers' environment, which holds no ticket,
    so the TFRecords written by Spark, the ranks' reads through tfos.data, the checkpoints, the
    TensorBoard events and the export all reach HDFS through those tokens; the ranks' TFRecords are
    read by TensorFlow itself, through the hdfs:// plugin named in the executors' environment."""
    cluster, _ = secure
    pids = json.loads((cluster.dir / "pids").read_text())
    for name in ("nodemanager-0", "nodemanager-1"):
        with open(f"/proc/{pids[name]}/environ", "rb") as f:
            assert not [v for v in f.read().split(b"\0") if v.startswith(b"KRB5")], name
    out = "hdfs:///tmp/secure-yarn"
    run = yarn.spark_submit(cluster, os.path.join(ROOT, "examples", "digits", "digits_tf.py"),
                            ["--epochs", "2", "--data-dir", "hdfs:///tmp/secure-yarn-data", "--output-dir", out,
                             "--export-dir", f"{out}/export"], deploy_mode="cluster", cwd=str(tmp_path),
                            conf={"spark.executorEnv.TFOS_HDFS_TF_PLUGIN": plugin})
    assert run.returncode == 0 and run.app_id, run.describe()
    report = yarn.application_report(cluster, run.app_id)
    assert (report["state"], report["finalStatus"]) == ("FINISHED", "SUCCEEDED"), report
    assert wait_no_tfos_processes(60) == []
    logs = yarn.local_logs(cluster, run.app_id)  # no log aggregation on this cluster (tfos.testing.hadoop.kerberos)
    assert sorted(name.rsplit("/", 1)[1] for name in logs if "tfos-node-" in name) == ["tfos-node-0.log",
                                                                                     "tfos-node-1.log"], list(logs)
    text = "".join(logs.values())
    assert float(re.search(r"test accuracy ([\d.]+)", text).group(1)) >= 0.8, list(logs)
    assert all("TensorFlow opens hdfs:// through tfos's plugin" in body for name, body in logs.items()
               if "tfos-node-" in name), "the TF processes did not load the plugin"
    files = cluster.fs("-ls", "-R", "/tmp").stdout
    for pattern in (r"/tmp/secure-yarn-data/train/part-\d+\.tfrecord", r"/tmp/secure-yarn/logs/checkpoint/ckpt-\d+\.index",
                    r"/tmp/secure-yarn/logs/train/events\.out\.tfevents\.", r"/tmp/secure-yarn/export/saved_model\.pb"):
        line = re.search(rf"^.*{pattern}.*$", files, re.M)
        assert line and " tfos supergroup " in line.group(0), (pattern, files)  # written as the keytab's user
