"""The digits examples under ``spark-submit --master yarn`` on the real test cluster, in both deploy
modes, with data, checkpoints, TensorBoard logs and the export on HDFS; every node's TF log in
its container's log directory, read back with ``yarn logs``; FsShell (not tfos) checks what
landed on HDFS."""

import os
import re
import threading
import time

import pytest

from tfos.testing import wait_no_tfos_processes
from tfos.testing.hadoop import yarn

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "digits")
# wait for each node log's end marker, not its name: a log still being aggregated shows its name first
NODE_LOGS_COMPLETE = ["End of LogType:tfos-node-0.log", "End of LogType:tfos-node-1.log"]


def _hdfs_files(hadoop, path):
    return hadoop.fs("-ls", "-R", path).stdout


def _node_logs(text):
    """{node index: that node's TF log} from ``yarn logs`` output."""
    found = {}
    for m in re.finditer(r"LogType:tfos-node-(\d+)\.log\n.*?LogContents:\n(.*?)End of LogType:tfos-node-\1\.log",
                         text, re.S):
        found[int(m.group(1))] = found.get(int(m.group(1)), "") + m.group(2)
    return found


def _check_finished_cleanly(hadoop, run):
    assert run.returncode == 0, run.describe()
    assert run.app_id, run.describe()
    report = yarn.application_report(hadoop, run.app_id)
    assert (report["state"], report["finalStatus"]) == ("FINISHED", "SUCCEEDED"), report
    assert wait_no_tfos_processes(60) == []  # a normal finish leaves no agent or TF process


def test_tensorflow_mode_on_tfrecords_in_hdfs_client_deploy_mode(hadoop, tmp_path):
    """InputMode.TENSORFLOW: the driver writes TFRecords to HDFS with Spark, each rank reads its
    shards through tfos.data; checkpoints, TensorBoard events and the export go to HDFS."""
    out = "hdfs:///tmp/yarn-client"
    run = yarn.spark_submit(hadoop, os.path.join(EXAMPLES, "digits_tf.py"),
                            ["--epochs", "3", "--data-dir", "hdfs:///tmp/yarn-client-data", "--output-dir", out,
                             "--export-dir", f"{out}/export"], deploy_mode="client", cwd=str(tmp_path))
    _check_finished_cleanly(hadoop, run)
    acc = float(re.search(r"test accuracy ([\d.]+)", run.stdout).group(1))
    assert acc >= 0.8, run.stdout[-2000:]

    files = _hdfs_files(hadoop, "/tmp")
    assert re.search(r"/tmp/yarn-client-data/train/part-\d+\.tfrecord", files), files
    assert re.search(r"/tmp/yarn-client/logs/checkpoint/ckpt-\d+\.index", files), files
    assert "/tmp/yarn-client/logs/train/events.out.tfevents." in files, files
    assert "/tmp/yarn-client/export/saved_model.pb" in files, files

    logs = _node_logs(yarn.logs(hadoop, run.app_id, want=NODE_LOGS_COMPLETE))
    assert sorted(logs) == [0, 1], logs
    for rank, text in logs.items():
        assert f"rank {rank} epoch 2: loss" in text, text[-2000:]
    assert "chief: test accuracy" in logs[0]


def test_spark_mode_from_parquet_on_hdfs_cluster_deploy_mode_survives_a_datanode_stopped(hadoop, tmp_path):
    """InputMode.SPARK from a DataFrame read from HDFS, the driver inside YARN's ApplicationMaster;
    one of the two DataNodes is stopped mid-run (replication 2): the run still succeeds."""
    out = "hdfs:///tmp/yarn-cluster"
    hadoop.fs("-mkdir", "-p", "/tmp/yarn-cluster")
    stopped = []

    def stop_a_datanode_once_training_runs():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if "ckpt-" in hadoop.fs("-ls", "-R", "/tmp/yarn-cluster", check=False).stdout:
                stopped.append(hadoop.stop_daemon("datanode-1"))
                return
            time.sleep(1)

    stopper = threading.Thread(target=stop_a_datanode_once_training_runs, daemon=True)
    stopper.start()
    try:
        run = yarn.spark_submit(hadoop, os.path.join(EXAMPLES, "digits_spark.py"),
                                ["--epochs", "4", "--input", "hdfs:///tmp/yarn-cluster-input.parquet",
                                 "--log-dir", f"{out}/logs", "--export-dir", f"{out}/export"],
                                deploy_mode="cluster", py_files=[os.path.join(EXAMPLES, "digits_tf.py")],
                                cwd=str(tmp_path))
    finally:
        stopper.join(5)
        hadoop.start_daemon("datanode-1")
    _check_finished_cleanly(hadoop, run)
    assert stopped, "training never wrote a checkpoint to HDFS, so no DataNode was stopped"

    text = yarn.logs(hadoop, run.app_id, want=[*NODE_LOGS_COMPLETE, "test accuracy"])
    acc = float(re.search(r"test accuracy ([\d.]+)", text).group(1))  # the driver's stdout, in the AM's container
    assert acc >= 0.8
    logs = _node_logs(text)
    assert sorted(logs) == [0, 1], logs
    for node, log in logs.items():
        assert re.search(rf"node {node}: trained \d+ steps", log), log[-2000:]
    files = _hdfs_files(hadoop, "/tmp")
    assert "/tmp/yarn-cluster-input.parquet/_SUCCESS" in files, files
    assert re.search(r"/tmp/yarn-cluster/logs/checkpoint/ckpt-\d+\.index", files), files
    assert "/tmp/yarn-cluster/export/saved_model.pb" in files, files


# ----------------------------------------------------------------------------- faults on YARN

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yarn_job.py")


def _submit_in_background(hadoop, args, tmp_path, **kw):
    """Start spark-submit of yarn_job.py; returns (the thread, a list that gets the Submitted)."""
    result = []
    t = threading.Thread(target=lambda: result.append(yarn.spark_submit(hadoop, JOB, args, cwd=str(tmp_path), **kw)),
                         daemon=True)
    t.start()
    return t, result


def _wait_started(hadoop, out, names, submitted, timeout=240):
    thread, result = submitted
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = hadoop.fs("-ls", "-R", out, check=False).stdout
        if all(f"{out}/{n}" in listing for n in names):
            return
        if not thread.is_alive():
            raise AssertionError(f"the job ended before {names} appeared in {out}: "
                                 + (result[0].describe() if result else "spark-submit raised"))
        time.sleep(1)
    raise AssertionError(f"{names} never appeared in {out}")


def _executor_jvms(app_id):
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend" in (p.info["cmdline"] or [])
            and app_id in (p.info["cmdline"] or [])]


def test_a_killed_container_restarts_from_the_hdfs_checkpoint_and_the_feed_gives_every_row_once(hadoop, tmp_path):
    out = "/tmp/yarn-restart"
    thread, result = submitted = _submit_in_background(hadoop, ["restart", f"hdfs://{out}"], tmp_path)
    _wait_started(hadoop, out, ["started-0-0", "started-0-1", "ckpt/checkpoint"], submitted)
    app_id = yarn.running_applications(hadoop)[-1]
    victims = _executor_jvms(app_id)
    assert len(victims) == 2, victims
    victims[-1].kill()  # SIGKILL the container's JVM: its node agent and TF process go with it
    thread.join(600)
    run = result[0]
    assert run.returncode == 0, run.describe()
    m = re.search(r"RESULT attempt=(\d+) restored=\[(\d+), (\d+)\] rows=(\d+) distinct=(\d+) complete=(\w+)",
                  run.stdout)
    assert m, run.describe()
    attempt, restored0, _r1, rows, distinct, complete = m.groups()
    assert attempt == "1" and int(restored0) > 0, m.group(0)  # the chief resumed from HDFS
    assert rows == distinct == "6000" and complete == "True", m.group(0)  # every row exactly once
    assert wait_no_tfos_processes(60) == []


def test_yarn_application_kill_leaves_no_tfos_or_tf_process(hadoop, tmp_path):
    out = "/tmp/yarn-kill"
    thread, result = submitted = _submit_in_background(hadoop, ["forever", f"hdfs://{out}"], tmp_path)
    _wait_started(hadoop, out, ["started-0-0", "started-0-1"], submitted)
    app_id = yarn.running_applications(hadoop)[-1]
    yarn.kill(hadoop, app_id)
    t0 = time.monotonic()
    assert wait_no_tfos_processes(60) == []
    seconds = time.monotonic() - t0
    thread.join(300)
    assert result and result[0].returncode != 0
    assert yarn.application_report(hadoop, app_id)["state"] == "KILLED"
    print(f"yarn application -kill: no tfos process left after {seconds:.1f}s")


def test_a_container_killed_for_memory_names_yarn_and_memory_overhead(hadoop, tmp_path):
    out = "/tmp/yarn-memory"
    run = yarn.spark_submit(hadoop, JOB, ["memory", f"hdfs://{out}"], cwd=str(tmp_path), timeout=600)
    assert run.returncode != 0, run.describe()
    err = run.stdout + run.stderr  # spark-submit passes the Python driver's stderr on to its stdout
    assert "NodeFailedError" in err, run.describe()
    assert re.search(r"killed by YARN for exceeding (physical )?memory", err, re.I), run.describe()
    assert "spark.executor.memoryOverhead" in err, run.describe()
    assert wait_no_tfos_processes(60) == []
