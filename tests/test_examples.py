"""The bundled examples, run against the shared local-cluster."""

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dataframe", "rdd"])
def test_digits_spark_example_trains_and_writes_predictions(spark, source, tmp_path, capfd, caplog):
    import logging

    import digits_spark

    caplog.set_level(logging.INFO, logger="tfos")
    acc = digits_spark.main(["--source", source, "--epochs", "8", "--output-dir", str(tmp_path)], spark=spark)
    assert acc >= 0.9
    assert list((tmp_path / "predictions").glob("part-*"))
    err = capfd.readouterr().err
    assert "tfos " in err and "step" in err and "loss=" in err  # the progress bar
    assert "per-rank summary" in caplog.text and "chief:0" in caplog.text and "rows fed" in caplog.text


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path):
    import os

    import nbclient
    import nbformat

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nb = nbformat.read(os.path.join(root, "examples", "notebook", "tfos_step_by_step.ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "test accuracy" in outputs
