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


def test_horovod_is_refused_under_encryption_unless_accepted(spark):
    """Its collectives would travel in clear: refused with the way through, before any Spark job."""
    from tfos import TFCluster
    from tfos.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Horovod's collectives.*allow_unprotected=True.*encrypt=False"):
        TFCluster.reserve(spark.sparkContext, 2, 0, backend="horovod")
