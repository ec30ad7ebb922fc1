"""The reduction server across hosts: 2 training nodes and 1 reducer, each on a host of its own
(an encrypted cluster: the reducers' traffic goes through the node tunnels like every Gloo group's).
Keras 3 fit through the reducer trains to the usual accuracy; the reducer's host killed mid-training
fails the workers' step with a CollectiveError naming the reducer within the collective timeout,
and the restart on the host that came back finishes from the last backup."""

import json
import time

import numpy as np

from tfos import TFCluster
from tfos.errors import TFOSError
from tfos.testing import wait_for

from reduction_programs import reduction_fit
from test_faults import FAST

TIMEOUT = 20.0  # the collective timeout of the workers' all-reduces (s)


def test_reducer_host_killed_mid_training_fails_the_step_naming_it_and_the_restart_finishes(
        mh_sc, hosts, tmp_path, record_property):
    import digits_tf

    info = digits_tf.prepare_shards(str(tmp_path / "data"))
    out = tmp_path / "out"
    out.mkdir()
    args = {"data": str(tmp_path / "data"), "out": str(out), "rows_per_rank": info["train_rows"] // 2 - 40,
            "epochs": 12, "timeout": TIMEOUT}
    cluster = TFCluster.run(mh_sc, reduction_fit, args, 2, 0, master_node="chief", num_reducers=1, max_restarts=1,
                            restart_backoff=1, checkpoint_dir=str(tmp_path / "ckpt"), reservation_timeout=240,
                            report_interval=0.2, **FAST)
    reducer = next(n for n in cluster.nodes if n["job_name"] == "reducer")
    host = hosts.by_address(reducer["host"])
    killed = False
    try:
        trainers = {n["host"] for n in cluster.nodes if n["job_name"] != "reducer"}
        assert reducer["host"] not in trainers and len(trainers) == 2, cluster.nodes  # a host of its own
        assert wait_for(lambda: len(cluster.metrics()) >= 2
                        and min(m.get("epoch", 0) for i, m in cluster.metrics().items()
                                if i != reducer["node_index"]) >= 3, 300, 0.1), cluster.metrics()
        t_kill = time.time()
        assert hosts.kill_host(host) > 0
        killed = True
        assert wait_for(lambda: cluster.restarts, TIMEOUT + 30, 0.1), "no restart after the reducer's host died"
        record_property("seconds_kill_to_restart_decision", round(cluster.restarts[0].time - t_kill, 1))
        hosts.restart_worker(host)  # the host comes back: the restart needs its slot
        killed = False
        cluster.shutdown(timeout=600)
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        if killed:
            hosts.restart_worker(host)
    assert {r.attempt for r in cluster.restarts} == {0}, cluster.restarts  # one restart (of every failed node)
    assert cluster.restarts[0].time - t_kill < TIMEOUT + 15, (cluster.restarts[0].time - t_kill, cluster.restarts)
    name = f"reducer 0 (node {reducer['node_index']} on {reducer['host']})"
    failures = [f for f in cluster.supervisor.every_failure() if f.attempt == 0]
    # the workers' step failed with tfos's CollectiveError naming the reducer, long before its heartbeats stopped
    named = [f for f in failures if "tfos.errors.CollectiveError" in f.traceback and name in f.traceback]
    assert named, failures
    assert cluster.attempt == 1
    result = json.loads((out / "result.json").read_text())
    assert result["attempt"] == 1 and result["accuracy"] >= 0.85, result
    w0, w1 = np.load(out / "weights-rank0.npz"), np.load(out / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
