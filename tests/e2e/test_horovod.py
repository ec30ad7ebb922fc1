"""Horovod backend end to end (runs in the TF 2.15 + Horovod 0.28.1 environment; see .ci/run)."""


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
    assert abs(acc - single) <= 0.02, (acc, single)
    timeline = tmp_path / "logs" / "timeline.json"
    assert timeline.exists() and timeline.stat().st_size > 0, "Horovod timeline was not written under log_dir"
