"""Cluster core on a real Spark local-cluster[2,1,1024] (shared per session)."""

import json
import os
import re
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tfos import InputMode
from tfos.wire.channel import new_key
from tfos.wire.clients import DriverClient
from tfos.errors import AuthenticationError, ConfigError, NodeFailedError, ReservationTimeoutError


def record_and_train(args, ctx):
    """Record what this node was told, then train digits with MWMS (examples/digits)."""
    import digits_tf

    with open(os.path.join(args.output_dir, f"node-{ctx.node_index}.json"), "w") as f:
        json.dump({"job_name": ctx.job_name, "task_index": ctx.task_index, "rank": ctx.rank,
                   "num_workers": ctx.num_workers, "gpus": ctx.gpus,
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "tf_config": json.loads(os.environ["TF_CONFIG"]), "pid": os.getpid()}, f)
    digits_tf.main_fun(args, ctx)


@pytest.mark.slow
def test_two_nodes_get_distinct_roles_consistent_tf_config_and_identical_weights(tfos_cluster, tmp_path):
    import digits_tf

    data, out = tmp_path / "data", tmp_path / "out"
    out.mkdir()
    info = digits_tf.prepare_shards(str(data))
    args = SimpleNamespace(data_dir=str(data), output_dir=str(out), epochs=8, batch_size=32,
                           learning_rate=0.01, train_rows=info["train_rows"])
    cluster = tfos_cluster(2, 0, backend="mwms",
                                backend_options={"communication": "ring", "bytes_per_pack": 16 << 10})
    cluster.start(record_and_train, args, input_mode=InputMode.TENSORFLOW)
    registered = cluster.nodes
    cluster.shutdown(timeout=300)

    nodes = [json.loads((out / f"node-{i}.json").read_text()) for i in range(2)]
    assert {(n["job_name"], n["task_index"]) for n in nodes} == {("chief", 0), ("worker", 0)}
    assert sorted(n["rank"] for n in nodes) == [0, 1] and all(n["num_workers"] == 2 for n in nodes)
    assert nodes[0]["pid"] != nodes[1]["pid"]
    spec = nodes[0]["tf_config"]["cluster"]
    assert nodes[1]["tf_config"]["cluster"] == spec
    from tfos.tunnel import addresses as private

    block = private.block_for(cluster.config.cluster_id)  # encrypted (the default): each node at its private address
    assert spec == {"chief": [f"{private.node_address(block, 0)}:{registered[0]['tf_port']}"],
                    "worker": [f"{private.node_address(block, 1)}:{registered[1]['tf_port']}"]}
    assert all(r["tunnel_mode"] == "netns" and r["tunnel_port"] for r in registered)
    for n in nodes:
        assert n["tf_config"]["task"] == {"type": n["job_name"], "index": n["task_index"]}
        # GPU pinning from Spark resource scheduling (fake discovery script: 2 GPUs per executor)
        assert len(n["gpus"]) == 1 and n["gpus"][0] in ("0", "1")
        assert n["cuda_visible_devices"] == n["gpus"][0]
    w0, w1 = np.load(out / "weights-rank0.npz"), np.load(out / "weights-rank1.npz")
    assert w0.files == w1.files and len(w0.files) == 4
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    acc = json.loads((out / "result.json").read_text())["accuracy"]
    # training fidelity: within 2 points of the range one process reaches with the same global batch
    # and steps (a comparison, not one of the suite's trainings to an accuracy threshold). The
    # baseline is three seeded runs, not one: on these 449 test rows one unseeded run against
    # another spreads by 2 points on its own (0.955-0.978 over 9 seeds), so a single draw made a
    # two-point check fail by chance.
    import keras

    singles = []
    for seed in (1, 2, 3):
        keras.utils.set_random_seed(seed)
        singles.append(digits_tf.train_single_process(str(data), args.epochs, 2 * args.batch_size,
                                                      args.learning_rate, args.train_rows))
    assert min(singles) - 0.02 <= acc <= max(singles) + 0.02, (acc, singles)


def fail_on_node_1(args, ctx):
    import time

    if ctx.node_index == 1:
        raise RuntimeError("deliberate failure on node 1")
    time.sleep(600)  # node 0 would wait for a peer forever: tfos must stop it


def test_main_fun_raising_on_one_node_makes_shutdown_raise_with_its_traceback(tfos_cluster):
    cluster = tfos_cluster(2, 0, stop_grace_secs=2)
    t0 = time.monotonic()
    cluster.start(fail_on_node_1, None)
    with pytest.raises(NodeFailedError) as exc:
        cluster.shutdown()
    assert time.monotonic() - t0 < 30
    err = exc.value
    assert len(err.failures) == 1
    f = err.failures[0]
    assert (f.node_index, f.job_name, f.task_index) == (1, "worker", 0)
    assert f.host and "RuntimeError: deliberate failure on node 1" in f.traceback
    assert "deliberate failure" in str(err) and "worker:0" in str(err) and "Last log lines" in str(err)
    with pytest.raises(NodeFailedError):  # and every later call raises it too
        cluster.shutdown()


def sleep_long(args, ctx):
    import time

    time.sleep(600)


def test_tf_process_killed_with_sigkill_fails_the_cluster(tfos_cluster):
    cluster = tfos_cluster(2, 0, stop_grace_secs=2)
    cluster.start(sleep_long, None)
    victim = cluster.nodes[1]
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    with pytest.raises(NodeFailedError, match="killed by signal 9") as exc:
        cluster.shutdown()
    assert time.monotonic() - t0 < 30
    assert exc.value.failures[0].node_index == 1 and exc.value.failures[0].exit_code == -9
    # a SIGKILL nobody in tfos sent: named a likely OOM kill, with the memory the agent saw
    assert re.search(r"likely by the kernel's OOM killer \(peak RSS \d+ MB\)", str(exc.value)), str(exc.value)


def test_killed_agent_takes_its_tf_process_down_and_driver_notices(tfos_cluster):
    """An agent killed -9 (as if its executor died): its TF process dies with it, and the driver,
    whose heartbeat connection from that agent closed, declares the node lost within the
    disconnect grace (a few seconds), long before heartbeat_timeout, and stops the others."""
    from tfos.testing import tfos_processes

    cluster = tfos_cluster(2, 0, heartbeat_timeout=30, stop_grace_secs=2)
    cluster.start(sleep_long, None)
    tf_pid = cluster.nodes[1]["pid"]
    agent_pid = cluster.registry.nodes[1].agent.agent_pid
    os.kill(agent_pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(NodeFailedError, match="lost the node agent: its connection to the driver closed"):
        cluster.shutdown()
    assert time.monotonic() - t0 < 20  # heartbeat_timeout alone would take 30 s
    assert tf_pid not in [p.pid for p in tfos_processes()]


def test_too_few_executors_fails_within_reservation_timeout(tfos_cluster):
    t0 = time.monotonic()
    with pytest.raises(ReservationTimeoutError, match="reservation_timeout"):
        tfos_cluster(3, 0, reservation_timeout=5)
    assert time.monotonic() - t0 < 5 + 5


@pytest.mark.parametrize("args,match", [((2, 2), "no node to train"), ((0,), "num_executors"),
                                        ((2, 0), "master_node")])
def test_bad_arguments_fail_before_any_spark_job(sc, tfos_cluster, args, match):
    jobs_before = set(sc.statusTracker().getJobIdsForGroup(None))
    kwargs = {"master_node": "boss"} if match == "master_node" else {}
    with pytest.raises(ConfigError, match=match):
        tfos_cluster(*args, **kwargs)
    assert set(sc.statusTracker().getJobIdsForGroup(None)) == jobs_before


def tfos_compat_fun(args, ctx):
    import json
    import os

    fields = {k: repr(getattr(ctx, k)) for k in ("job_name", "task_index", "num_workers", "executor_id",
                                                  "worker_num", "cluster_spec", "defaultFS", "working_dir", "mgr")}
    fields["absolute_path"] = ctx.absolute_path("models/x")
    fields["has_get_data_feed"] = callable(ctx.get_data_feed)
    with open(os.path.join(args["out"], f"compat-{ctx.executor_id}.json"), "w") as f:
        json.dump(fields, f)
    while not os.path.exists(os.path.join(args["out"], "go")):  # hold the cluster open for the probe
        __import__("time").sleep(0.1)


def test_tensorflowonspark_style_run_and_control_endpoint_rejects_strangers(sc, tmp_path):
    from tfos import TFCluster as TFC  # module-style use, as `from tensorflowonspark import TFCluster`

    cluster = TFC.run(sc, tfos_compat_fun, {"out": str(tmp_path)}, 2, 0, False, TFC.InputMode.TENSORFLOW)
    try:
        port = cluster.service.port
        with pytest.raises(AuthenticationError):
            DriverClient(cluster.driver_host, port, new_key(cluster.config.key.encrypt), cluster.cluster_id, 0).heartbeat()
        assert DriverClient(cluster.driver_host, port, cluster.config.key, cluster.cluster_id, 0).heartbeat() is False
    finally:
        (tmp_path / "go").write_text("1")
    cluster.shutdown(timeout=60)
    for i in range(2):
        f = json.loads((tmp_path / f"compat-{i}.json").read_text())
        assert f["job_name"] == "'worker'" and f["executor_id"] == str(i) and f["num_workers"] == "2"
        assert f["absolute_path"].startswith("file:///") and f["absolute_path"].endswith("/models/x")
        assert f["has_get_data_feed"] is True


def ps_or_chief(args, ctx):
    import time

    if ctx.job_name == "ps":
        time.sleep(600)  # a ps node serves forever, as with tf.distribute.Server(...).join()


def test_ps_nodes_are_stopped_when_the_chief_finishes(tfos_cluster):
    cluster = tfos_cluster(2, 1, stop_grace_secs=2)
    cluster.start(ps_or_chief, None)
    assert [(n["job_name"], n["task_index"]) for n in cluster.nodes] == [("ps", 0), ("chief", 0)]
    t0 = time.monotonic()
    cluster.shutdown(grace_secs=1)
    assert time.monotonic() - t0 < 30


def note_loaded_modules(out_dir, ctx):
    import sys

    with open(os.path.join(out_dir, f"modules-{ctx.node_index}.json"), "w") as f:
        json.dump({"tensorflow": "tensorflow" in sys.modules}, f)


@pytest.mark.parametrize("preimport", [True, False])
def test_tensorflow_is_imported_during_the_rendezvous_unless_turned_off(tfos_cluster, tmp_path, preimport):
    cluster = tfos_cluster(2, 0, preimport_tensorflow=preimport, progress=False)
    cluster.start(note_loaded_modules, str(tmp_path))
    cluster.shutdown(timeout=120)
    for i in range(2):
        assert json.loads((tmp_path / f"modules-{i}.json").read_text())["tensorflow"] is preimport


def raise_after_one_allreduce(args, ctx):
    import tensorflow as tf

    strategy = ctx.strategy()

    def all_reduce():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)

    all_reduce()
    if ctx.rank == 1:
        raise ValueError("rank 1's own error, after one all-reduce")
    for _ in range(10000):  # rank 0 waits for rank 1 in the next all-reduce, until TF or tfos ends it
        all_reduce()


def test_the_node_that_failed_first_leads_the_error_with_its_own_exception(tfos_cluster):
    cluster = tfos_cluster(2, 0, stop_grace_secs=2)
    cluster.start(raise_after_one_allreduce, None)
    with pytest.raises(NodeFailedError) as exc:
        cluster.shutdown(timeout=120)
    text = str(exc.value)
    assert text.startswith("[node 1 "), text[:2000]
    assert "rank 1's own error, after one all-reduce" in text.split("\nthen ")[0], text[:2000]
