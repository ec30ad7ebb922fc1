"""The bundled examples, run against the shared local-cluster."""

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dataframe", "rdd"])
def test_digits_spark_example_trains_and_writes_predictions(spark, source, tmp_path):
    import digits_spark

    acc = digits_spark.main(["--source", source, "--epochs", "8", "--output-dir", str(tmp_path)], spark=spark)
    assert acc >= 0.9
    assert list((tmp_path / "predictions").glob("part-*"))
