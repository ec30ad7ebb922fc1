"""The tfos command's dispatch (no Spark): usage, unknown commands and build targets, and that each
subcommand reaches the module that does the work (run's and hadoop's own argument checks answer)."""

import subprocess
import sys


def tfos(*args):
    return subprocess.run([sys.executable, "-m", "tfos.cli", *args], capture_output=True, text=True, timeout=120)


def test_usage_and_unknown_commands():
    out = tfos()
    assert out.returncode == 2 and "tfos doctor" in out.stdout and "tfos build" in out.stdout
    assert tfos("--help").returncode == 0
    assert tfos("launch").returncode == 2
    bad = tfos("build", "everything")
    assert bad.returncode == 2 and "choose from all, tunnel, gloo, hdfs" in bad.stderr


def test_subcommands_reach_their_modules():
    run = tfos("run", "--path")  # python -m tfos.run's own option
    assert run.returncode == 0 and run.stdout.strip().endswith("tfos/run.py")
    hadoop = tfos("hadoop", "up")  # its own check: --dir is required
    assert hadoop.returncode == 2 and "--dir is required" in hadoop.stderr
    doctor = tfos("doctor", "--conf", "novalue")
    assert doctor.returncode == 2 and "KEY=VALUE" in doctor.stderr
