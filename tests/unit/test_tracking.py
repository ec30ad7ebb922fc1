"""The MLflow run's pure parts: metric points from report entries, params, the ranks' mean."""

import argparse

import pytest

pytest.importorskip("mlflow")

from tfos.cluster.driver.tracking import _Averager, args_params, flatten_params, metric_points  # noqa: E402


@pytest.mark.parametrize("entries,start,points,counter", [
    ([{"t": 1.0, "step": 3, "loss": 0.5, "acc": 1}], 0, [("rank0/loss", 0.5, 3, 1000), ("rank0/acc", 1.0, 3, 1000)], 0),
    ([{"t": 2.0, "loss": 0.5}, {"t": 3.0, "loss": 0.25}], 7, [("rank0/loss", 0.5, 7, 2000), ("rank0/loss", 0.25, 8, 3000)], 9),
    ([{"t": 1.0, "step": 1, "name": "text", "ok": True, "bad": float("nan"), "v": [1, 2]}], 0, [], 0),
    ([{"t": 1.0, "step": 2, "a b!c": 1.5}], 0, [("rank0/a b_c", 1.5, 2, 1000)], 0),
])
def test_metric_points(entries, start, points, counter):
    assert metric_points(entries, "rank0", start) == (points, counter)


def test_params_flattened_and_bounded():
    assert flatten_params({"a": 1, "b": {"c": [1, 2], "d": {}}, "e": "x" * 600}) == {
        "a": "1", "b.c": "[1, 2]", "b.d": "{}", "e": "x" * 500}
    assert args_params(argparse.Namespace(lr=0.1, layers=[3])) == {"args.lr": "0.1", "args.layers": "[3]"}
    assert args_params({"lr": 0.1}) == {"args.lr": "0.1"}
    assert args_params(["--lr", "0.1"]) == {"args": "['--lr', '0.1']"}
    assert args_params(None) == {}


def test_mean_once_every_rank_reported_a_step():
    avg = _Averager(2)
    assert avg.add("loss", 1, 0, 1.0, 10) is None
    assert avg.add("loss", 2, 0, 3.0, 11) is None
    assert avg.add("loss", 1, 1, 2.0, 12) == ("loss", 1.5, 1, 12)
    assert avg.add("loss", 2, 1, 5.0, 13) == ("loss", 4.0, 2, 13)
    assert avg.pending == {}
