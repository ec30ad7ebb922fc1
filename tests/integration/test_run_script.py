"""TFCluster.run_script and ``python -m tfos.run``: unchanged TF scripts on the real local-cluster."""

import json
import os
import subprocess
import sys

import pytest

from tfos import TFCluster
from tfos.errors import ConfigError, NodeFailedError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS_SCRIPT = os.path.join(ROOT, "examples", "digits", "digits_script.py")


@pytest.mark.slow
def test_plain_mwms_script_trains_on_both_workers(sc, tmp_path, caplog):
    """The script reads only TF_CONFIG; both workers run every step together (the digits examples
    train to accuracy in tests/e2e). After the success every node's log is kept where the
    end-of-run line says."""
    import logging
    import re

    caplog.set_level(logging.INFO, logger="tfos")
    out = tmp_path / "result.json"
    TFCluster.run_script(sc, DIGITS_SCRIPT, ["--epochs", "3", "--output", str(out)], num_executors=2)
    result = json.loads(out.read_text())
    assert 0.0 <= result["accuracy"] <= 1.0, result
    assert result["steps"] == 3 * ((1797 - 1797 // 4) // 2 // 32)  # both workers ran every step together
    logs = re.findall(r"node (\d) \(worker:\d\) on \S+: (\S+)", caplog.text)  # workers only
    assert sorted(i for i, _ in logs) == ["0", "1"], caplog.text[-2000:]
    for _, path in logs:
        assert os.path.getsize(path) > 0 and oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"


def test_failing_script_reports_exit_code_and_last_lines(sc):
    with pytest.raises(NodeFailedError) as e:
        TFCluster.run_script(sc, DIGITS_SCRIPT, ["--fail", "3"], num_executors=2)
    text = str(e.value)
    assert "exited with code 3" in text and "failing on purpose as asked" in text
    assert e.value.failures and {f.node_index for f in e.value.failures} <= {0, 1}  # the first failure stops the rest


def test_script_must_be_readable_on_the_driver(sc, tmp_path):
    with pytest.raises(ConfigError, match="cannot read the script"):
        TFCluster.run_script(sc, str(tmp_path / "missing.py"), num_executors=2)
    with pytest.raises(ConfigError, match="list of arguments"):
        TFCluster.run_script(sc, DIGITS_SCRIPT, "--epochs 3", num_executors=2)


def test_tfos_run_command_exit_code_and_errors(tmp_path):
    """``python -m tfos.run`` with its own Spark session (``local[2]``: the command's exit code and
    output are the subject, not the executors; the nodes are processes of their own either way):
    the worker's non-zero exit makes the command exit 1 and print the node's exit code and output;
    the chief's copy ran with its role, and what it printed is on the console (rank 0's lines
    reach the driver)."""
    script = tmp_path / "roles.py"
    script.write_text("import json, os, sys, time\n"
                      "import helper\n"  # a module beside the script: shipped with it
                      "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
                      "print('role', task['type'], task['index'], 'args', sys.argv[1:], helper.WORD, flush=True)\n"
                      "time.sleep(2 if task['index'] == 1 else 0)\n"
                      "sys.exit(4 if task['index'] == 1 else 0)\n")
    (tmp_path / "helper.py").write_text("WORD = 'from-the-sibling'\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, "-m", "tfos.run", "--master", "local[2]", "--num-executors", "2",
                          str(script), "--lr", "0.1"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    # workers only (the default layout of scripts): worker 1 failed, worker 0 is rank 0
    assert "exited with code 4" in out.stderr and "role worker 1 args ['--lr', '0.1'] from-the-sibling" in out.stderr
    assert "[worker:0] role worker 0 args ['--lr', '0.1'] from-the-sibling" in out.stdout, out.stdout[-2000:]
    assert "[worker:1]" not in out.stdout  # node_output='chief': rank 0's lines only
