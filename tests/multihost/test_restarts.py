"""Restarts across hosts (max_restarts): a host dies mid-training and the cluster starts again on
the hosts Spark still has, resuming from the checkpoint."""

import json
import time

from tfos import TFCluster
from tfos.errors import TFOSError

from restart_programs import checkpointed_steps
from test_faults import FAST, _victim, _wait_steps


def test_whole_host_killed_mid_training_restarts_on_the_other_hosts(mh_sc, hosts, tmp_path, record_property):
    cluster = TFCluster.run(mh_sc, checkpointed_steps, {"steps": 300, "out": str(tmp_path)}, 2, 0,
                            master_node="chief", max_restarts=1, restart_backoff=1,
                            checkpoint_dir=str(tmp_path / "ckpt"), reservation_timeout=180, **FAST)
    node, host = _victim(cluster, hosts)
    try:
        _wait_steps(cluster, at_least=60)
        t_kill = time.time()
        assert hosts.kill_host(host) > 0
        cluster.shutdown(timeout=600)
        assert cluster.attempt == 1 and cluster.restarts
        ranks = [json.loads((tmp_path / f"attempt-rank{r}.json").read_text()) for r in range(2)]
        assert all(r["attempt"] == 1 and r["steps"] == 300 and 55 <= r["resumed_from"] < 300 for r in ranks), ranks
        assert ranks[0]["weights"] == ranks[1]["weights"]
        assert host.address not in {r["host"] for r in ranks}  # the dead host is not used again
        record_property("seconds_kill_to_first_step_of_attempt_1",
                        round(min(r["first_step_time"] for r in ranks) - t_kill, 1))
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        hosts.restart_worker(host)
