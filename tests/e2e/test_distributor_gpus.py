"""Several GPUs per node, with Spark's GPU scheduling and a fake discovery script (no GPU here):
executors of 4 GPUs and tasks of 2, the executors' own CUDA_VISIBLE_DEVICES=10,11,12,13 read
through. A Spark application of its own (tests/gpus_per_node_app.py in a subprocess), since this
process already holds the suite's SparkContext."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_each_node_sees_its_tasks_gpus_through_the_executors_devices(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpus_per_node_app.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    # spark-tensorflow-distributor's table for tasks of 2 GPUs: slots 2/4/6/8 -> 1/2/3/4 tasks (3 -> 2)
    assert result["runner_tasks"] == {"2": 1, "3": 2, "4": 2, "6": 3, "8": 4}
    devices = {"10", "11", "12", "13"}
    runner = result["runner"]  # 3 slots over 2 tasks: 2 GPUs and 1 GPU, Spark's addresses mapped to 10..13
    assert sorted(len(r["cuda"].split(",")) for r in runner) == [1, 2], runner
    assert all(set(r["cuda"].split(",")) <= devices and r["workers"] == 2 for r in runner), runner
    assert result["runner_rank0"] in [r["cuda"] for r in runner]
    dist = result["distributor"]  # 4 GPU processes on tasks of 2: 2 nodes, each driving its task's 2 GPUs
    assert len(dist) == 2 and all(len(r["cuda"].split(",")) == 2 and set(r["cuda"].split(",")) <= devices
                                  for r in dist), dist
