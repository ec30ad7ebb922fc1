"""Restarts across hosts (max_restarts): a host dies mid-training and the cluster starts again on
the hosts Spark still has, resuming from the checkpoint. The fault matrix's whole-host kill (the
driver's error within 30 s, naming node, role, host and cause) is checked by the Spark feed's
shrink-and-grow test, whose kill is that fault.

Step counts are as short as the checks allow: each restart costs a new TF process per node, the
steps after a kill only need to outlast it."""

import json
import os
import signal
import threading
import time

from tfos import TFCluster
from tfos.errors import Cause, TFOSError, format_failures
from tfos.testing import wait_for

from restart_programs import evictable_steps, fed_steps, ps_checkpointed_steps, trained_ids
from test_faults import FAST, _check_error, _victim, _wait_steps

PS_STEPS = 120  # ps_checkpointed_steps: the kill comes at step 60, 12 rounds of 5 before the end


def _ps_run_past_step_60(sc, tmp_path, num_executors: int):
    """backend='ps' (one ps, the chief, the rest workers) running ps_checkpointed_steps for PS_STEPS
    steps with max_restarts=1; returns (cluster, chief's node index) once the chief reported step
    60. The cluster is aborted if it gets no further."""
    cluster = TFCluster.run(sc, ps_checkpointed_steps, {"steps": PS_STEPS, "out": str(tmp_path)}, num_executors, 1,
                            master_node="chief", backend="ps", max_restarts=1, restart_backoff=1,
                            checkpoint_dir=str(tmp_path / "ckpt"), reservation_timeout=180, **FAST)
    try:
        chief = next(n["node_index"] for n in cluster.nodes if n["job_name"] == "chief")
        assert wait_for(lambda: cluster.metrics()[chief].get("step", 0) >= 60, 180), cluster.metrics()
    except BaseException:
        cluster._abort(TFOSError("the test ended"))
        raise
    return cluster, chief


def test_parameter_server_killed_restarts_every_node_and_the_chief_resumes(mh_sc, tmp_path, record_property):
    """backend='ps' on the three hosts (ps, chief, worker): a lost ps takes the variables with it,
    which TF's ClusterCoordinator cannot survive (join() raises), so tfos restarts all nodes and
    the chief restores the variables from its checkpoint."""
    import os
    import signal

    cluster, _chief = _ps_run_past_step_60(mh_sc, tmp_path, 3)
    try:
        ps = next(n for n in cluster.nodes if n["job_name"] == "ps")
        t_kill = time.time()
        os.kill(ps["pid"], signal.SIGKILL)
        cluster.shutdown(timeout=600)
        assert cluster.attempt == 1 and any(r.job_name == "ps" for r in cluster.restarts), cluster.restarts
        chief = json.loads((tmp_path / "ps-chief.json").read_text())
        assert chief["attempt"] == 1 and chief["steps"] == PS_STEPS and 55 <= chief["resumed_from"] < PS_STEPS, chief
        record_property("seconds_kill_to_first_round_of_attempt_1", round(chief["first_step_time"] - t_kill, 1))
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))


def test_parameter_server_worker_lost_the_coordinator_goes_on_without_it(mh_sc, hosts, tmp_path, record_property):
    """backend='ps' with two workers (a second executor on host 1): one worker SIGKILLed. TF's
    ClusterCoordinator runs the lost worker's scheduled functions on the other one, so tfos
    restarts nothing: the chief's first attempt finishes and the loss is in cluster.lost_nodes."""
    import os
    import signal

    from hosts import wait_executors

    hosts.add_worker(hosts.hosts[0])
    wait_executors(mh_sc, 4)
    try:
        cluster, chief = _ps_run_past_step_60(mh_sc, tmp_path, 4)
    except BaseException:
        hosts.remove_extra_workers()
        raise
    try:
        victim = next(n for n in cluster.nodes if n["job_name"] == "worker")
        at_kill = cluster.metrics()[chief]["step"]
        t_kill = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        cluster.shutdown(timeout=600)  # raises if the loss failed the run
        assert cluster.attempt == 0 and cluster.restarts == [], cluster.restarts
        assert [(n.node_index, n.job_name) for n in cluster.lost_nodes] == [(victim["node_index"], "worker")]
        assert cluster.lost_nodes[0].cause is Cause.KILLED and "killed by signal 9" in cluster.lost_nodes[0].reason
        result = json.loads((tmp_path / "ps-chief.json").read_text())
        # every step ran; a step the lost worker was running may have run again on the other one
        assert result["attempt"] == 0 and result["resumed_from"] == 0 and PS_STEPS <= result["steps"] < PS_STEPS + 10, (
            result)
        assert at_kill < PS_STEPS, at_kill  # the kill landed before the end
        record_property("seconds_kill_to_end_of_training", round(time.time() - t_kill, 1))
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        hosts.remove_extra_workers()


def test_parameter_servers_restart_at_a_new_size_and_the_chief_resumes(mh_sc, hosts, tmp_path, record_property):
    """backend='ps' with a size range (4 nodes: ps, chief, two workers; min_executors=3): the ps is
    SIGKILLed and a host's second executor goes for good. The restart runs on the 3 slots left
    (ps, chief, one worker: the ps moves if its executor went) and the chief restores the
    variables from its checkpoint."""
    from hosts import wait_executors

    hosts.add_worker(hosts.hosts[0])
    wait_executors(mh_sc, 4)
    try:
        cluster = TFCluster.run(mh_sc, ps_checkpointed_steps, {"steps": PS_STEPS, "out": str(tmp_path)}, 4, 1,
                                master_node="chief", backend="ps", min_executors=3, size_wait=5, grow_interval=None,
                                max_restarts=1, restart_backoff=5, checkpoint_dir=str(tmp_path / "ckpt"),
                                reservation_timeout=180, **FAST)
    except BaseException:
        hosts.remove_extra_workers()
        raise
    try:
        chief = next(n["node_index"] for n in cluster.nodes if n["job_name"] == "chief")
        assert wait_for(lambda: cluster.metrics()[chief].get("step", 0) >= 60, 180), cluster.metrics()
        ps = next(n for n in cluster.nodes if n["job_name"] == "ps")
        t_kill = time.time()
        os.kill(ps["pid"], signal.SIGKILL)
        hosts.remove_extra_workers()  # within restart_backoff: Spark offers 3 slots when the restart asks
        cluster.shutdown(timeout=600)
        # the first cause: the ps, or the chief whose coordinator lost it (whichever the driver heard first)
        assert cluster.attempt == 1 and {r.job_name for r in cluster.restarts} <= {"ps", "chief"}, cluster.restarts
        assert [job for job, _ in cluster.roles] == ["ps", "chief", "worker"], cluster.roles
        result = json.loads((tmp_path / "ps-chief.json").read_text())
        # rounds of 5 steps; one cut short by the loss leaves the count off a multiple of 5
        assert (result["attempt"] == 1 and PS_STEPS <= result["steps"] < PS_STEPS + 5
                and 55 <= result["resumed_from"] < PS_STEPS), result
        record_property("seconds_kill_to_first_round_on_3_nodes", round(result["first_step_time"] - t_kill, 1))
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        hosts.remove_extra_workers()


def test_a_spark_feed_through_a_shrink_and_a_grow_trains_every_row_once_per_epoch(mh_sc, hosts, tmp_path,
                                                                                  record_property):
    """InputMode.SPARK, 3 MWMS nodes on 3 hosts, min_executors=2, every rank calling
    ctx.checkpoint_saved (its feed position) every 10 steps. A whole host dies in epoch 1: within
    30 s the driver knows, naming the node, role, host and cause (or a peer's failed collective:
    the fault matrix's whole-host kill), and the restart runs on the 2 slots Spark still has once
    restart_backoff passed, not after reservation_timeout (600 s) waiting for a third, never on the
    dead host, from the checkpoint's step and feed position. The host comes back: at rank 0's next
    checkpoint (ctx.checkpoint_saved) the cluster grows to 3 by a planned restart and the feed
    resumes from there; all 3 ranks finish with the same weights. What the final model trained on
    holds every row once per epoch (counted; but for the rows equal steps drop at the end), and
    each new attempt was fed exactly the rows its checkpoint lacked, not the interrupted epoch
    again."""
    import collections

    from tfos import InputMode

    n, epochs, batch = 6000, 3, 20
    rdd = mh_sc.parallelize([(i,) for i in range(n)], 6)
    cluster = TFCluster.run(mh_sc, fed_steps, {"out": str(tmp_path), "batch": batch, "every": 10, "sleep": 0.05}, 3,
                            0, input_mode=InputMode.SPARK, master_node="chief", min_executors=2, size_wait=5,
                            grow_interval=2, max_restarts=1, restart_backoff=1, checkpoint_dir=str(tmp_path / "ckpt"),
                            reservation_timeout=600, stall_timeout=60, **FAST)
    node, host = _victim(cluster, hosts)
    first_nodes = cluster.nodes
    fed, back = [], False
    feeding = threading.Thread(target=lambda: fed.append(cluster.train(rdd, num_epochs=epochs, chunk_rows=100)),
                               daemon=True)
    feeding.start()
    try:
        _wait_steps(cluster, at_least=55)  # epoch 1 of 100 steps at 3 nodes, past the checkpoint at 50
        t_kill = time.time()
        assert hosts.kill_host(host) > 0
        assert wait_for(lambda: cluster.attempt == 1 and len(cluster.roles) == 2 and len(cluster.metrics()) == 2
                        and all(m.get("attempt") == 1 for m in cluster.metrics().values()), 180), (
            cluster.attempt, cluster.roles, cluster.metrics())
        failures = [f for f in cluster.supervisor.every_failure() if f.attempt == 0]
        _check_error(format_failures(failures), cluster.restarts[0].time - t_kill, cluster, node,
                     "lost the node agent|lost contact with the node agent|reservation job failed|executor",
                     record_property, first_nodes)
        on_2 = list(cluster.metrics().values())
        to_first_step = min(m["first_step_time"] for m in on_2) - t_kill
        assert to_first_step < 120, to_first_step  # far below reservation_timeout
        record_property("seconds_kill_to_first_step_on_2_nodes", round(to_first_step, 1))
        assert all(m["resumed_from"] >= 50 for m in on_2), on_2  # the checkpoint at 50 or a later one, not step 0
        assert host.address not in {n["host"] for n in cluster.nodes}, cluster.nodes  # the dead host is not used again
        t_back = time.time()
        hosts.restart_worker(host)  # the host comes back: the cluster grows at a checkpoint
        back = True
        feeding.join(600)
        assert fed, "train() did not return"
        cluster.shutdown(timeout=600)
        assert [(r.from_nodes, r.to_nodes) for r in cluster.resizes] == [(2, 3)], cluster.resizes
        assert cluster.attempt == 2 and len(cluster.roles) == 3 and {r.attempt for r in cluster.restarts} == {0}
        ranks = [json.loads((tmp_path / f"attempt-rank{r}.json").read_text()) for r in range(3)]
        # grown from that checkpoint or a later one, past where the shrunk attempt started
        assert all(r["attempt"] == 2 and r["resumed_from"] >= cluster.resizes[0].step > 50 for r in ranks), (
            ranks, cluster.resizes)
        assert ranks[0]["weights"] == ranks[1]["weights"] == ranks[2]["weights"]
        record_property("seconds_host_back_to_first_step_on_3_nodes",
                        round(min(r["first_step_time"] for r in ranks) - t_back, 1))
        counts = collections.Counter(trained_ids(tmp_path))
        dropped = sum(m.get("rows_dropped", 0) for m in cluster.metrics().values())
        assert set(counts) <= set(range(n)) and max(counts.values()) == epochs, counts.most_common(3)  # none twice
        assert sum(epochs - counts[i] for i in range(n)) == dropped <= 3 * (batch - 1), dropped  # all others once
        # the grown attempt was fed exactly what its checkpoint lacked (the interrupted epoch not again in full)
        before = len(trained_ids(tmp_path, before=2))
        assert 0 < before % n and cluster.feeds.events[-1]["args"]["rows"] == epochs * n - before
        record_property("rows_of_the_last_attempt", cluster.feeds.events[-1]["args"]["rows"])
        record_property("rows_trained_before_it", before)
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        feeding.join(60)
        if not back:
            hosts.restart_worker(host)


def test_a_node_told_to_go_every_rank_saves_at_one_step_and_no_step_is_lost(mh_sc, hosts, tmp_path, record_property):
    """3 MWMS nodes whose program asks ctx.should_checkpoint; node 2's agent gets SIGTERM (an
    eviction notice with eviction_grace), then its host dies as the platform's SIGKILL would.
    Every rank checkpoints at the same step, none steps past it, and the cluster goes on with 2
    nodes from that step (0 steps lost, no max_restarts used)."""
    # 150 steps: the notice comes at step 40, and should_checkpoint holds every rank at the agreed step
    cluster = TFCluster.run(mh_sc, evictable_steps, {"steps": 150, "out": str(tmp_path)}, 3, 0,
                            master_node="chief", min_executors=2, size_wait=5, grow_interval=None, max_restarts=0,
                            restart_backoff=1, eviction_grace=30, checkpoint_dir=str(tmp_path / "ckpt"),
                            reservation_timeout=600, **FAST)
    node, host = _victim(cluster, hosts, index=2)
    killed = False
    try:
        _wait_steps(cluster, at_least=40)
        agent_pid = cluster.supervisor.registry.nodes[2].agent.agent_pid
        t_notice = time.time()
        os.kill(agent_pid, signal.SIGTERM)  # the notice: its TF process goes on until every rank saved
        assert wait_for(lambda: cluster.evictions, 30), "the cluster did not save"
        record_property("seconds_notice_to_saved", round(time.time() - t_notice, 1))
        # the loop goes on once rank 0 said checkpoint_saved; the other ranks record theirs within
        # the grace (the platform's SIGKILL comes at its end, not at rank 0's word)
        records = [tmp_path / f"saved-a0-r{r}.json" for r in range(3)]
        assert wait_for(lambda: all(p.exists() for p in records), 30), "a rank did not record its save"
        assert hosts.kill_host(host) > 0  # the platform's SIGKILL
        killed = True
        cluster.shutdown(timeout=600)
        (ev,) = cluster.evictions
        assert ev.nodes == (2,) and ev.attempt == 0 and "termination signal" in ev.why, ev
        saved = [json.loads(p.read_text()) for p in records]
        assert saved == [[ev.step]] * 3, saved  # every rank, the same step, once
        last = [int((tmp_path / f"last-a0-r{r}").read_text()) for r in range(3)]
        assert last == [ev.step] * 3, (last, ev.step)  # no rank stepped past the save: nothing to lose
        ranks = [json.loads((tmp_path / f"attempt-rank{r}.json").read_text()) for r in range(2)]
        assert all(r["attempt"] == 1 and r["resumed_from"] == ev.step and r["steps"] == 150 for r in ranks), ranks
        assert ranks[0]["weights"] == ranks[1]["weights"]
        assert cluster.restarts == [] and len(cluster.roles) == 2
        record_property("steps_lost", max(last) - ranks[0]["resumed_from"])
        record_property("seconds_notice_to_first_step_on_2_nodes",
                        round(min(r["first_step_time"] for r in ranks) - t_notice, 1))
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        if killed:
            hosts.restart_worker(host)


def test_keras_fit_across_hosts_told_to_go_saves_and_resumes_on_two_hosts(mh_sc, hosts, tmp_path, record_property):
    """Keras 3 fit through tfos.keras_dist on 3 hosts with tfos.callbacks.save_before_eviction and
    min_executors=2: node 2's agent gets SIGTERM, rank 0 backs up at the step every rank agreed
    on, its host dies, and fit resumes on 2 nodes (a new collective group of 2) in the epoch of
    that backup, replicas identical."""
    from types import SimpleNamespace

    import numpy as np

    import digits_keras_fit
    import digits_tf

    # 20 epochs of 9 steps: the notice comes after epoch 2 (save_before_eviction holds every rank at the
    # agreed step), and 180 Adam steps reach 0.85 (keras_dist: 0.90 after ~105, tests/integration)
    epochs = 20
    args = SimpleNamespace(keras="3", epochs=epochs, batch_size=32, learning_rate=0.01, compression=None,
                           data_dir=str(tmp_path / "data"), output_dir=str(tmp_path / "out"))
    os.makedirs(args.output_dir)
    # 8 shards: at 3 ranks the third reads 2 of them; every rank trains on as many rows at any size
    args.rows_per_rank = digits_tf.prepare_shards(args.data_dir)["train_rows"] // 4 - 20
    per_epoch = args.rows_per_rank // args.batch_size
    cluster = TFCluster.run(mh_sc, digits_keras_fit.main_fun, args, 3, 0, master_node="chief", min_executors=2,
                            size_wait=5, grow_interval=None, restart_backoff=1, eviction_grace=60,
                            checkpoint_dir=str(tmp_path / "ckpt"), report_interval=0.2, reservation_timeout=600,
                            **FAST)
    node, host = _victim(cluster, hosts, index=2)
    killed = False
    try:
        assert wait_for(lambda: len(cluster.metrics()) == 3
                        and min(m.get("epoch", 0) for m in cluster.metrics().values()) >= 2, 300, 0.05)
        t_notice = time.time()
        os.kill(cluster.supervisor.registry.nodes[2].agent.agent_pid, signal.SIGTERM)
        assert wait_for(lambda: cluster.evictions, 60), "the cluster did not save"
        record_property("seconds_notice_to_saved", round(time.time() - t_notice, 1))
        assert hosts.kill_host(host) > 0
        killed = True
        cluster.shutdown(timeout=900)
    finally:
        if not cluster.lifecycle.ended:
            cluster._abort(TFOSError("the test ended"))
        if killed:
            hosts.restart_worker(host)
    (ev,) = cluster.evictions
    assert ev.nodes == (2,) and ev.step >= 2 * per_epoch, (ev, per_epoch)
    assert cluster.attempt == 1 and len(cluster.roles) == 2 and cluster.restarts == []
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["attempt"] == 1 and result["epochs_run"] == list(range((ev.step - 1) // per_epoch, epochs)), (
        result, ev)
    w0, w1 = np.load(tmp_path / "out" / "weights-rank0.npz"), np.load(tmp_path / "out" / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    assert result["accuracy"] >= 0.85, result
