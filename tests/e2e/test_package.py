"""The package as users get it: a wheel and an sdist from ``python -m build``, the wheel installed
into a fresh virtualenv whose ``tfos`` command and main job run from it; and ``tfos doctor`` on a
healthy local-cluster (exit 0) and on one with a problem of each kind (exit 1, each named with its
fix). Every part is its own process with its own Spark application."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASTER = "local-cluster[2,1,1024]"


def run(cmd, timeout=900, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """A fresh virtualenv with tfos installed from the wheel just built. Its dependencies (TensorFlow,
    pyspark: gigabytes) are this environment's, seen through a .pth line, not downloaded again; the
    editable tfos of this environment is not (its hook is a .pth of its own, which a path added by
    a .pth line does not run)."""
    dist = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(dist), ROOT])
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheels = list(dist.glob("tfos-*.whl"))
    sdists = list(dist.glob("tfos-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(dist)
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    installed = run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index",
                     str(wheels[0])])
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    return env_dir, wheels[0], sdists[0]


@pytest.mark.slow
def test_the_wheel_carries_the_sources_and_one_version(wheel_venv):
    env_dir, wheel, sdist = wheel_venv
    import zipfile

    from tfos.host.versions import TFOS_VERSION

    assert wheel.name.startswith(f"tfos-{TFOS_VERSION}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for part in ("tfos/tunnel/shim.c", "tfos/tunnel/rust/Cargo.toml", "tfos/tunnel/rust/Cargo.lock",
                 "tfos/tunnel/rust/src/relay.rs", "tfos/tunnel/rust/src/wire/tests.rs", "tfos/tf/gloo_cc/op.cc", "tfos/tf/gloo_cc/tfos_gloo.h",
                 "tfos/data/hdfs_tf/Cargo.toml", "tfos/data/hdfs_tf/src/lib.rs"):
        assert part in names, part
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tfos = tfos.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: cryptography" in metadata and "Provides-Extra: connect" in metadata


@pytest.mark.slow
def test_the_main_job_runs_from_the_installed_wheel_and_its_console_is_one_progress_line(wheel_venv, tmp_path):
    """The README's main job (scripts/run_example.sh runs it) from the installed wheel, as a user
    sees it: one tfos line with step and loss, updated in place, no py4j, oneDNN or Spark start-up
    chatter, and the trained model's accuracy."""
    env_dir, _, _ = wheel_venv
    py, cli = str(env_dir / "bin" / "python"), str(env_dir / "bin" / "tfos")
    where = run([py, "-c", "import tfos; print(tfos.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(env_dir)), where.stdout + where.stderr  # not the clone's tfos
    built = run([cli, "build", "tunnel"], cwd=tmp_path)  # the wheel's sources have the clone's key: a cache hit
    assert built.returncode == 0 and "tfos-tunnel" in built.stdout, built.stdout + built.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "TF_CPP_MIN_LOG_LEVEL")}
    job = subprocess.run([py, os.path.join(ROOT, "examples", "digits", "digits_tf.py"), "--epochs", "3",
                          "--output-dir", str(tmp_path / "out")], cwd=tmp_path, env=env,
                         capture_output=True, timeout=900)  # bytes: keep the \r
    stdout, stderr = job.stdout.decode(errors="replace"), job.stderr.decode(errors="replace")
    assert job.returncode == 0, stdout[-3000:] + stderr[-3000:]
    acc = float(re.search(r"test accuracy ([0-9.]+)", stdout).group(1))
    assert acc >= 0.85, stdout[-2000:]
    console = stdout + stderr
    bar_lines = [line for line in console.split("\n") if re.search(r"tfos [0-9a-f]{12}:", line)]
    assert len(bar_lines) == 1, bar_lines  # one line, redrawn with \r
    last = bar_lines[0].split("\r")[-1]
    assert re.search(r"\d+step", last) and "loss=" in last, last
    for noise in ("py4j", "oneDNN", "Using Spark's default log4j profile", "resolves to a loopback address"):
        assert noise not in console, noise


def doctor(*args, env=None):
    return run([sys.executable, "-m", "tfos.cli", "doctor", "--master", MASTER, "--conf",
                f"spark.pyspark.python={sys.executable}", *args], timeout=600,
               env=dict(os.environ, PYSPARK_PYTHON=sys.executable, **(env or {})))


@pytest.mark.slow
def test_doctor_on_a_healthy_cluster_exits_0():
    out = doctor()
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = {line.split()[0]: line for line in out.stdout.splitlines()
            if line and not line.startswith((" ", "tfos doctor:"))}
    for check in ("executors", "python", "tfos", "tensorflow", "driver", "gpus", "node", "encryption", "java"):
        assert check in rows and " OK " in rows[check], out.stdout
    assert "nothing found that would fail a job" in out.stdout and "2 task(s) reported" in rows["executors"]


@pytest.mark.slow
def test_doctor_names_each_problem_with_its_fix(tmp_path):
    """Executors with another tfos (a copy of the package with another version first on their
    path), a driver address they cannot reach (the doctor listens on 127.0.0.2 and tells executors
    127.0.0.3, where nothing listens: no packet leaves the machine) and an empty build cache
    (nothing built)."""
    other = tmp_path / "other"
    shutil.copytree(os.path.join(ROOT, "tfos"), other / "tfos", ignore=shutil.ignore_patterns("__pycache__", "target"))
    versions = other / "tfos" / "host" / "versions.py"
    versions.write_text(versions.read_text().replace('TFOS_VERSION = "', 'TFOS_VERSION = "9.9.9-other-'))
    path = os.pathsep.join([str(other)] + [p for p in sys.path if p])
    out = doctor("--conf", f"spark.executorEnv.PYTHONPATH={path}", "--conf",
                 f"spark.executorEnv.TFOS_CACHE_DIR={tmp_path / 'empty-cache'}", "--timeout", "3",
                 env={"TFOS_SERVER_HOST": "127.0.0.2", "TFOS_ADVERTISE_HOST": "127.0.0.3"})
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    text = out.stdout
    assert re.search(r"^tfos +FAIL .*9\.9\.9-other-", text, re.M), text
    assert "fix: install the same tfos on the executors" in text
    assert re.search(r"^driver address +FAIL .*127\.0\.0\.3:\d+ \(ConnectionRefusedError", text, re.M), text
    assert "TFOS_ADVERTISE_HOST" in text
    assert re.search(r"^node tunnel +WARN .*not built yet", text, re.M) and "tfos build tunnel" in text, text
    assert re.search(r"problem\(s\) would fail a job: tfos, driver address", text), text


@pytest.mark.slow
def test_doctor_on_a_cluster_that_gives_no_executor_says_so_within_its_deadline():
    """Executors of 2 cores on workers of 1: Spark never starts one, the job would wait forever."""
    out = doctor("--tasks", "1", "--job-timeout", "5", "--conf", "spark.executor.cores=2")
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert re.search(r"^executors +FAIL .*did not finish: still running after 5 s \(cancelled\)", out.stdout, re.M)
