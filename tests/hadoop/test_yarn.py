"""The digits examples under ``spark-submit --master yarn`` on the real test cluster, in both deploy
modes, with data, checkpoints, TensorBoard logs and the export on HDFS; every node's TF log in
its container's log directory, read back with ``yarn logs``; FsShell (not tfos) checks what
landed on HDFS. And the faults of a YARN application: a killed container, one killed by YARN for
its memory, ``yarn application -kill``.

Each spark-submit pays for its ApplicationMaster's and executors' start-up (a good part of a
minute on 2 cores): the client-mode checks run as phases of one application (yarn_job.py)."""

import json
import os
import re
import threading
import time
import urllib.request

import pytest

from tfos.testing import wait_no_tfos_processes
from tfos.testing.hadoop import yarn

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "digits")
# wait for each node log's end marker, not its name: a log still being aggregated shows its name first
NODE_LOGS_COMPLETE = ["End of LogType:tfos-node-0.log", "End of LogType:tfos-node-1.log"]


def _names(hadoop, path):
    """The names in the HDFS directory ``path`` ([] while it does not exist), from WebHDFS's
    LISTSTATUS: what the waits below poll, every half second, without starting a client JVM
    (FsShell) each time on the 2 cores the job needs."""
    try:
        with urllib.request.urlopen(f"http://{hadoop.webhdfs_address}/webhdfs/v1{path}?op=LISTSTATUS",
                                    timeout=10) as r:
            return [s["pathSuffix"] for s in json.load(r)["FileStatuses"]["FileStatus"]]
    except OSError:  # 404 until the directory exists (HTTPError is an OSError)
        return []


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


def test_spark_mode_from_parquet_on_hdfs_cluster_deploy_mode_survives_a_datanode_stopped(hadoop, tmp_path):
    """InputMode.SPARK from a DataFrame read from HDFS, the driver inside YARN's ApplicationMaster;
    one of the two DataNodes is stopped mid-run (replication 2): the run still succeeds."""
    out = "hdfs:///tmp/yarn-cluster"
    stopped = []

    def stop_a_datanode_once_training_runs():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the checkpoint dir is <log-dir>/checkpoint
            if any("ckpt-" in n for n in _names(hadoop, "/tmp/yarn-cluster/logs/checkpoint")):
                stopped.append(hadoop.stop_daemon("datanode-1"))
                return
            time.sleep(0.5)

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


# ------------------------------------------------ one client-mode application, in phases

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yarn_job.py")


def _submit_in_background(hadoop, args, tmp_path, **kw):
    """Start spark-submit of yarn_job.py; returns (the thread, a list that gets the Submitted)."""
    result = []
    t = threading.Thread(target=lambda: result.append(yarn.spark_submit(hadoop, JOB, args, cwd=str(tmp_path), **kw)),
                         daemon=True)
    t.start()
    return t, result


def _wait_started(hadoop, out, names, submitted, timeout=240):
    """Wait until each of ``names`` (relative paths) exists under the HDFS directory ``out``."""
    thread, result = submitted
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(n.rsplit("/", 1)[-1] in _names(hadoop, f"{out}/{n}".rsplit("/", 1)[0]) for n in names):
            return
        if not thread.is_alive():
            raise AssertionError(f"the job ended before {names} appeared in {out}: "
                                 + (result[0].describe() if result else "spark-submit raised"))
        time.sleep(0.5)
    raise AssertionError(f"{names} never appeared in {out}")


def _executor_jvms(app_id):
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend" in (p.info["cmdline"] or [])
            and app_id in (p.info["cmdline"] or [])]


def test_client_mode_digits_then_a_killed_container_a_memory_kill_and_yarn_application_kill(hadoop, tmp_path):
    """One client-mode application (yarn_job.py), its checks in the order its phases run:

    digits   InputMode.TENSORFLOW (examples/digits/digits_tf.py's main()): the driver writes
             TFRecords to HDFS with Spark, each rank reads its shards through tfos.data;
             checkpoints, TensorBoard events and the export go to HDFS.
    restart  a container's JVM is SIGKILLed mid-feed: the cluster restarts from the checkpoint on
             HDFS (max_restarts=1) and the feed gives every row exactly once.
    memory   node 1's TF process grows past its container's limit: YARN kills the container and the
             cluster fails with a NodeFailedError; the output names YARN, memory and
             spark.executor.memoryOverhead.
    forever  ``yarn application -kill`` leaves no tfos or TF process.

    A normal finish (FINISHED/SUCCEEDED, no process left) is checked by the cluster-mode test above
    and by test_kerberos.py's spark-submit."""
    out = "/tmp/yarn-phases"
    thread, result = submitted = _submit_in_background(
        hadoop, ["digits,restart,memory,forever", f"hdfs://{out}"], tmp_path,
        py_files=[os.path.join(EXAMPLES, "digits_tf.py")], timeout=1800)
    app_id = None
    try:
        _wait_started(hadoop, f"{out}/restart", ["started-0-0", "started-0-1", "ckpt/checkpoint"], submitted,
                      timeout=600)
        app_id = yarn.running_applications(hadoop)[-1]
        victims = _executor_jvms(app_id)
        assert len(victims) == 2, victims
        victims[-1].kill()  # SIGKILL the container's JVM: its node agent and TF process go with it
        _wait_started(hadoop, f"{out}/forever", ["started-0-0", "started-0-1"], submitted, timeout=900)
        yarn.kill(hadoop, app_id)
        t0 = time.monotonic()
        assert wait_no_tfos_processes(60) == []
        seconds = time.monotonic() - t0
        thread.join(300)
    finally:
        if thread.is_alive():  # a check above failed: end the application, not the next test's time
            for app in yarn.running_applications(hadoop):
                yarn.kill(hadoop, app, check=False)
    assert result, "spark-submit did not end within 300 s of yarn application -kill"
    run = result[0]
    assert run.returncode != 0, run.describe()
    assert yarn.application_report(hadoop, app_id)["state"] == "KILLED"
    print(f"yarn application -kill: no tfos process left after {seconds:.1f}s")

    # digits
    acc = re.search(r"digits: 2 nodes, 3 epochs, test accuracy ([\d.]+)", run.stdout)
    assert acc and float(acc.group(1)) >= 0.8, run.describe()
    files = _hdfs_files(hadoop, f"{out}/digits")
    assert re.search(rf"{out}/digits/data/train/part-\d+\.tfrecord", files), files
    assert re.search(rf"{out}/digits/logs/checkpoint/ckpt-\d+\.index", files), files
    assert f"{out}/digits/logs/train/events.out.tfevents." in files, files
    assert f"{out}/digits/export/saved_model.pb" in files, files

    # restart
    m = re.search(r"RESULT attempt=(\d+) restored=\[(\d+), (\d+)\] rows=(\d+) distinct=(\d+) complete=(\w+)",
                  run.stdout)
    assert m, run.describe()
    attempt, restored0, _r1, rows, distinct, complete = m.groups()
    assert attempt == "1" and int(restored0) > 0, m.group(0)  # the chief resumed from HDFS
    assert rows == distinct == "6000" and complete == "True", m.group(0)  # every row exactly once

    # memory: the error the cluster raised, then YARN's and tfos's words anywhere in the output
    failure = re.search(r"MEMORY-FAILURE-BEGIN\n(.*?)MEMORY-FAILURE-END", run.stdout, re.S)
    assert failure and "NodeFailedError" in failure.group(1), run.describe()
    err = run.stdout + run.stderr  # spark-submit passes the Python driver's stderr on to its stdout
    assert re.search(r"killed by YARN for exceeding (physical )?memory", err, re.I), run.describe()
    assert "spark.executor.memoryOverhead" in err, run.describe()

    # every node's log in its container's log directory (the digits phase's, among the later ones')
    logs = _node_logs(yarn.logs(hadoop, app_id, timeout=120, want=[
        *NODE_LOGS_COMPLETE, "rank 0 epoch 2: loss", "rank 1 epoch 2: loss", "chief: test accuracy"]))
    assert sorted(logs) == [0, 1], logs
    for rank, text in logs.items():
        assert f"rank {rank} epoch 2: loss" in text, text[-2000:]
    assert "chief: test accuracy" in logs[0]
