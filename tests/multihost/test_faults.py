"""The fault matrix across hosts: each fault reaches the driver as a TFOSError naming node, role,
host and cause within 30 s, nothing hangs, and no tfos process is left behind (the autouse
leftover check of tests/conftest.py runs after each test). A whole host killed: in
test_restarts.py, whose Spark feed's shrink-and-grow test checks the same error first. The driver
killed (nothing left running on any host): in test_outsiders.py, on the second application (Spark's
auth on) that its block-attack test starts anyway, instead of one more application of its own."""

import re
import signal
import threading
import time

import pytest

from tfos import InputMode, TFCluster
from tfos.errors import TFOSError
from tfos.testing import wait_for

from driver_to_kill import slow_reader

SURFACE_SECS = 30.0
FAST = dict(heartbeat_interval=1.0, heartbeat_timeout=10.0, stop_grace_secs=2.0)


def allreduce_loop(args, ctx):
    """MWMS all-reduce steps until stopped: a peer that disappears leaves the others in a collective."""
    import time

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.ones([1024])), axis=None)

    i = 0
    while True:
        step()
        i += 1
        if i % 5 == 0:
            ctx.report(step=i)
        time.sleep(0.05)


def family_loop(args, ctx):
    """Spawns a child, a grandchild and a setsid grandchild (pids reported), then reports forever."""
    import subprocess
    import sys
    import time

    code = ("import subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']),\n"
            "        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
            "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchildren = [int(p) for p in child.stdout.readline().split()]
    i = 0
    while True:
        i += 1
        ctx.report(step=i, family=[child.pid] + grandchildren)
        time.sleep(0.2)


def _victim(cluster, hosts, index=1):
    node = next(n for n in cluster.nodes if n["node_index"] == index)
    return node, hosts.by_address(node["host"])


def _wait_steps(cluster, key="step", at_least=10, timeout=180.0):
    ok = wait_for(lambda: len(cluster.metrics()) == len(cluster.roles)
                  and all(m.get(key, 0) >= at_least for m in cluster.metrics().values()), timeout)
    assert ok, f"the nodes did not make progress: {cluster.metrics()}"


def _surfaced(cluster, t_fault: float) -> tuple[TFOSError, float]:
    """Wait for the driver's error; return it and the seconds since the fault."""
    deadline = t_fault + 90
    while time.monotonic() < deadline:
        try:
            cluster.raise_if_failed()
        except TFOSError as e:
            return e, time.monotonic() - t_fault
        time.sleep(0.2)
    pytest.fail("no error on the driver within 90s of the fault")


def _assert_names(err: BaseException, nodes: list[dict], node: dict, cause: str) -> None:
    """The error names a node with its role and host, and a cause. The node is the one hit by the
    fault, or a peer whose collective failed first because of it (then the cause is TF's)."""
    text = str(err)
    named = [n for n in nodes
             if re.search(rf"node {n['node_index']} \({n['job_name']}:{n['task_index']} on {re.escape(n['host'])}\)",
                          text)]
    assert named, text
    if node not in named:
        cause = "UnavailableError|CancelledError|collective|peer"
    assert re.search(cause, text), text


def _check_error(err, secs: float, cluster, node: dict, cause: str, record_property, nodes=None) -> None:
    """``nodes``: the attempt's nodes (default: the cluster's now)."""
    _assert_names(err, cluster.nodes if nodes is None else nodes, node, cause)
    assert secs < SURFACE_SECS, secs
    record_property("seconds_to_error", round(secs, 1))


def _cleanup(cluster):
    if not cluster.lifecycle.ended:
        cluster._abort(TFOSError("the test ended"))


def _shutdown_raises(cluster):
    with pytest.raises(TFOSError):
        cluster.shutdown(timeout=120)


def test_network_cut_mid_training(mh_sc, hosts, record_property):
    cluster = TFCluster.run(mh_sc, allreduce_loop, None, 2, 0, master_node="chief", **FAST)
    node, host = _victim(cluster, hosts)
    try:
        _wait_steps(cluster)
        t0 = time.monotonic()
        hosts.cut(host)
        err, secs = _surfaced(cluster, t0)
        _check_error(err, secs, cluster, node, "lost contact with the node agent", record_property)
        hosts.reconnect(host)
        _shutdown_raises(cluster)
    finally:
        hosts.reconnect(host)
        _cleanup(cluster)


def test_network_cut_mid_feed(mh_sc, hosts, record_property):
    cluster = TFCluster.run(mh_sc, slow_reader, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief", **FAST)
    node, host = _victim(cluster, hosts)
    cut_at = []

    def cutter():
        if wait_for(lambda: all(m.get("rows", 0) >= 500 for m in cluster.metrics().values())
                    and len(cluster.metrics()) == 2, 180, 0.2):
            cut_at.append(time.monotonic())
            hosts.cut(host)

    t = threading.Thread(target=cutter, daemon=True)
    t.start()
    try:
        with pytest.raises(TFOSError) as info:
            cluster.train(mh_sc.parallelize(range(400_000), 4), num_epochs=1)
        t.join(5)
        assert cut_at, "the feed ended before the cut"
        secs = time.monotonic() - cut_at[0]
        _check_error(info.value, secs, cluster, node, "lost contact with the node agent", record_property)
        hosts.reconnect(host)
        _shutdown_raises(cluster)
    finally:
        hosts.reconnect(host)
        _cleanup(cluster)


def test_agent_killed_takes_the_tf_process_and_all_its_descendants(mh_sc, hosts, record_property):
    import psutil

    cluster = TFCluster.run(mh_sc, family_loop, None, 2, 0, master_node="chief", **FAST)
    node, _host = _victim(cluster, hosts)
    try:
        _wait_steps(cluster, at_least=2)
        family = cluster.metrics()[1]["family"]
        agent_pid = cluster.registry.nodes[1].agent.agent_pid
        tree = [node["pid"]] + family
        assert all(psutil.pid_exists(p) for p in tree)
        t0 = time.monotonic()
        psutil.Process(agent_pid).kill()
        assert wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                        for p in tree), 15, 0.1), [p for p in tree if psutil.pid_exists(p)]
        record_property("seconds_to_no_descendant", round(time.monotonic() - t0, 1))
        err, secs = _surfaced(cluster, t0)
        _check_error(err, secs, cluster, node, "lost the node agent|lost contact with the node agent|exited", record_property)
        _shutdown_raises(cluster)
    finally:
        _cleanup(cluster)


def test_agent_stopped_with_sigstop(mh_sc, hosts, record_property):
    """A hung executor: the agent stops answering. The driver reports it; once the agent runs again
    it finds it was asked to stop and ends its TF process."""
    import psutil

    cluster = TFCluster.run(mh_sc, allreduce_loop, None, 2, 0, master_node="chief", **FAST)
    node, _host = _victim(cluster, hosts)
    agent = psutil.Process(cluster.registry.nodes[1].agent.agent_pid)
    try:
        _wait_steps(cluster)
        t0 = time.monotonic()
        agent.send_signal(signal.SIGSTOP)
        err, secs = _surfaced(cluster, t0)
        _check_error(err, secs, cluster, node, "lost contact with the node agent", record_property)
        _shutdown_raises(cluster)
    finally:
        agent.send_signal(signal.SIGCONT)
        _cleanup(cluster)


def test_executor_lost_with_task_retries_never_runs_a_second_copy(mh_sc, hosts, record_property):
    """spark.task.maxFailures=2 here: Spark retries the barrier stage after the executor of node 1
    dies, starting every node again; the driver refuses the second copies and reports the loss."""
    import psutil

    assert mh_sc.getConf().get("spark.task.maxFailures") == "2"
    cluster = TFCluster.run(mh_sc, allreduce_loop, None, 2, 0, master_node="chief", **FAST)
    node, host = _victim(cluster, hosts)
    first = {i: (n.agent.agent_pid, n.info.pid) for i, n in cluster.registry.nodes.items()}
    try:
        _wait_steps(cluster)
        executors = hosts.executor_pids(host)
        assert executors
        t0 = time.monotonic()
        for pid in executors:
            psutil.Process(pid).kill()
        err, secs = _surfaced(cluster, t0)
        _check_error(err, secs, cluster, node, "lost the node agent|lost contact with the node agent|executor JVM|exited|a second time",
                     record_property)
        _shutdown_raises(cluster)
        # whatever Spark retried, each node's registration is still its first copy
        assert {i: (n.agent.agent_pid, n.info.pid) for i, n in cluster.registry.nodes.items()} == first
    finally:
        _cleanup(cluster)
        from conftest import wait_executors

        wait_executors(mh_sc, 3)
