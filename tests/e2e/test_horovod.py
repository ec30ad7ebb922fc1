"""Horovod backend end to end (runs in the TF 2.15 + Horovod 0.28.1 environment; see .ci/run)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

hvd = pytest.importorskip("horovod.tensorflow", reason="Horovod is installed only in the TF 2.15 environment")

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_horovod_digits_identical_weights_and_accuracy(spark, tmp_path, compression):
    import digits_horovod
    import digits_tf

    out = tmp_path / "out"
    acc = digits_horovod.main(["--epochs", "8", "--compression", compression, "--output-dir", str(out),
                               "--timeline", "timeline.json", "--log-dir", str(tmp_path / "logs")], spark=spark)
    w0, w1 = np.load(out / "weights-rank0.npz"), np.load(out / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_allclose(w0[k], w1[k], atol=1e-6)
    assert acc >= 0.9
    data = tmp_path / "single"
    rows = digits_tf.prepare_shards(str(data))["train_rows"]
    single = digits_tf.train_single_process(str(data), 8, 64, 0.01, rows)
    # fidelity to one process: 2 points (9 of the 449 test rows) for exact fp32 all-reduce; fp16
    # compression rounds every gradient to 11 bits, so it gets one point more (a 9-row gap was seen)
    assert abs(acc - single) <= (0.02 if compression == "none" else 0.03), (acc, single)
    timeline = tmp_path / "logs" / "timeline.json"
    assert timeline.exists() and timeline.stat().st_size > 0, "Horovod timeline was not written under log_dir"


def test_horovod_digits_killed_at_half_resumes_from_its_checkpoint(tfos_cluster, tmp_path):
    """max_restarts with backend='horovod': a TF process SIGKILLed at half of training; tfos stops
    the other rank, starts a new Gloo rendezvous and both ranks again, and fit resumes from rank 0's
    last checkpoint (digits_horovod.restore_checkpoint)."""
    import digits_horovod
    import digits_tf

    from restart_programs import kill_rank_1_at_half_and_check

    from tfos import InputMode

    data, out = tmp_path / "data", tmp_path / "out"
    rows = digits_tf.prepare_shards(str(data))["train_rows"]
    args = SimpleNamespace(data_dir=str(data), output_dir=str(out), epochs=30, batch_size=32, learning_rate=0.01,
                           train_rows=rows)
    planned = args.epochs * (rows // 64)
    cluster = tfos_cluster(2, 0, backend="horovod", allow_unprotected=True, max_restarts=1, restart_backoff=1,
                           stop_grace_secs=2,
                           report_interval=0.2, checkpoint_dir=str(tmp_path / "ckpt"))
    cluster.start(digits_horovod.main_fun, args, input_mode=InputMode.TENSORFLOW)
    ranks = kill_rank_1_at_half_and_check(cluster, planned, out)  # optimizer iterations restored, not redone
    assert ranks[0]["first_epoch"] == ranks[1]["first_epoch"]
    assert args.epochs // 2 - 3 <= ranks[0]["first_epoch"] < args.epochs, ranks  # from the checkpoint
    result = json.loads((out / "result.json").read_text())
    assert result["accuracy"] >= 0.9 and result["attempt"] == 1
    w0, w1 = np.load(out / "weights-rank0.npz"), np.load(out / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_allclose(w0[k], w1[k], atol=1e-6)


def test_horovod_restarts_smaller_then_grows_back_at_a_checkpoint(tfos_cluster, sc, tmp_path):
    """backend='horovod' at a new size: 2 nodes; Spark kills node 1's executor (killExecutor, no
    replacement), the restart runs on the 1 slot left (min_executors=1; Horovod size 1); Spark
    gets an executor again (requestExecutors) and at rank 0's next checkpoint the cluster grows back
    to 2 by a planned restart with a new Gloo rendezvous; both ranks resume from that checkpoint
    and end with the same weights."""
    import psutil

    import digits_horovod
    import digits_tf

    from tfos import InputMode
    from tfos.testing import wait_for

    data, out = tmp_path / "data", tmp_path / "out"
    rows = digits_tf.prepare_shards(str(data))["train_rows"]
    args = SimpleNamespace(data_dir=str(data), output_dir=str(out), epochs=60, batch_size=32, learning_rate=0.01,
                           train_rows=rows)
    jsc = sc._jsc.sc()
    cluster = tfos_cluster(2, 0, backend="horovod", allow_unprotected=True, min_executors=1, size_wait=3,
                           grow_interval=1, max_restarts=1, restart_backoff=3, stop_grace_secs=2,
                           report_interval=0.2, checkpoint_dir=str(tmp_path / "ckpt"), heartbeat_interval=0.5)
    cluster.start(digits_horovod.main_fun, args, input_mode=InputMode.TENSORFLOW)
    epoch = lambda: min(m.get("epoch", 0) for m in cluster.metrics().values())  # noqa: E731
    try:
        assert wait_for(lambda: epoch() >= 3, 300, interval=0.1)
        agent = psutil.Process(cluster.registry.nodes[1].agent.agent_pid)
        jvm = next(p for p in agent.parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))
        argv = jvm.cmdline()
        assert jsc.killExecutor(argv[argv.index("--executor-id") + 1])  # gone, and not replaced
        assert wait_for(lambda: cluster.attempt == 1 and len(cluster.roles) == 1, 120, interval=0.1), cluster.roles
    finally:
        # capacity comes back, and the shared session has its 2 executors again: on local-cluster
        # the kill leaves Spark's executor target at 0 (requestExecutors(1) adds none), 2 fills both workers
        jsc.requestExecutors(2)
    assert wait_for(lambda: len(cluster.roles) == 2, 300, interval=0.2), "did not grow back"
    cluster.shutdown(timeout=600)

    # one restart, after node 1's loss (node 0's Horovod call fails with it: recorded too)
    assert 1 in [r.node_index for r in cluster.restarts] and {r.attempt for r in cluster.restarts} == {0}, \
        cluster.restarts
    assert [(r.from_nodes, r.to_nodes, r.attempt) for r in cluster.resizes] == [(1, 2, 1)], cluster.resizes
    assert cluster.attempt == 2
    ranks = [json.loads((out / f"attempt-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["attempt"] == ranks[1]["attempt"] == 2, ranks
    assert ranks[0]["first_epoch"] == ranks[1]["first_epoch"] >= cluster.resizes[0].step > 0, (ranks, cluster.resizes)
    result = json.loads((out / "result.json").read_text())
    assert result["size"] == 2 and result["attempt"] == 2 and result["accuracy"] >= 0.9, result
    w0, w1 = np.load(out / "weights-rank0.npz"), np.load(out / "weights-rank1.npz")
    for k in w0.files:
        np.testing.assert_allclose(w0[k], w1[k], atol=1e-6)


def test_horovod_is_refused_under_encryption_unless_accepted(spark):
    """Its collectives would travel in clear: refused with the way through, before any Spark job."""
    from tfos import TFCluster
    from tfos.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Horovod's collectives.*allow_unprotected=True.*encrypt=False"):
        TFCluster.reserve(spark.sparkContext, 2, 0, backend="horovod")
