"""The reduction server's data path on real TF processes without Spark: 2 workers
(tfos.keras_dist, implementation='reduction_server') and 2 or 3 reducers
(``python -m tfos.tf.reduction serve``) on loopback. Exact sums for every dtype and awkward size;
a reducer that dies or stalls fails the workers' all-reduce with CollectiveError naming it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tfos.tf import gloo
from tfos.testing import wait_for
from tfos.testing.ports import free_ports

pytestmark = pytest.mark.skipif(not gloo.installed(), reason="PyTorch (tfos[gloo]) is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(ROOT, "tests", "reduction_programs.py")


class Group:
    """2 workers and ``reducers`` reducers as processes; every one is killed when the test ends."""

    def __init__(self, tmp_path, reducers: int, mode: str, timeout: float = 20.0):
        self.procs: list[subprocess.Popen] = []
        self.outs = [str(tmp_path / f"worker{r}.json") for r in range(2)]
        ports = free_ports(2)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
                   TF_CPP_MIN_LOG_LEVEL="2", TFOS_REDUCERS=str(reducers), RS_TIMEOUT=str(timeout))
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        self.logs = []
        for r in range(reducers):
            self._start([sys.executable, "-m", "tfos.tf.reduction", "serve", "--index", str(r), "--workers", "2",
                         "--reducers", str(reducers), "--store", cluster["worker"][0], "--host", "127.0.0.1",
                         "--timeout", str(timeout)], env, tmp_path / f"reducer{r}.log")
        for i in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            self._start([sys.executable, PROGRAM, mode, self.outs[i]], dict(env, TF_CONFIG=tf_config),
                        tmp_path / f"worker{i}.log")
        self.reducers = self.procs[:reducers]
        self.workers = self.procs[reducers:]

    def _start(self, cmd, env, log):
        self.logs.append(log)
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT))

    def wait_workers(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        for p in self.workers:
            p.wait(max(0.1, deadline - time.monotonic()))
        return [p.returncode for p in self.workers]

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n" + log.read_text(errors="replace")[-1500:] for log in self.logs)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.mark.parametrize("reducers", [2, 3])
def test_every_dtype_and_awkward_size_sums_exactly_and_the_reducers_end_with_the_workers(tmp_path, reducers):
    g = Group(tmp_path, reducers, "sums")
    try:
        assert g.wait_workers(240) == [0, 0], g.tails()
        results = [json.loads(open(out).read()) for out in g.outs]
        for result in results:
            wrong = {k: v for k, v in result["errors"].items() if v != 0.0}
            assert not wrong, wrong
            assert result["broadcast"] == 2000.0  # rank 1's 1000 twos, on both ranks
        for p in g.reducers:  # the workers left between all-reduces: the reducers end cleanly
            assert p.wait(30) == 0, g.tails()
    finally:
        g.close()


@pytest.mark.parametrize("fault,mode", [("SIGKILL", "loop"), ("SIGSTOP", "loop"), ("SIGKILL", "pauses")])
def test_a_reducer_that_dies_or_stalls_fails_the_step_with_a_collective_error_naming_it(tmp_path, fault, mode):
    """``pauses``: the reducer dies between two all-reduces, so the next one fails as it starts,
    in Gloo's send, whose error names an address only."""
    timeout = 8.0
    g = Group(tmp_path, 2, mode, timeout=timeout)
    try:
        assert wait_for(lambda: all(os.path.exists(o + ".started") for o in g.outs), 180), g.tails()
        time.sleep(1.0)
        t_fault = time.time()
        g.reducers[1].send_signal(getattr(signal, fault))
        assert g.wait_workers(timeout + 30) == [3, 3], g.tails()
        errors = [json.loads(open(out).read()) for out in g.outs]
        for err in errors:  # in a tf.function TF raises its own error; a tfos node raises CollectiveError from it
            assert "CollectiveError: reduction-server all-reduce failed on worker" in err["text"], err
            limit = (5.0 if mode == "loop" else 7.0) if fault == "SIGKILL" else timeout + 5.0
            assert err["time"] - t_fault < limit, (err["time"] - t_fault, err)
        # a worker one all-reduce ahead waits on reducer 0, which waits for the other worker: it names
        # reducer 0; the one held up by the stalled reducer names it
        assert any("reducer 1 died or stopped answering" in err["text"] for err in errors), errors
        if mode == "pauses":  # both were between all-reduces: both name the dead reducer
            assert all("reducer 1 died or stopped answering" in err["text"] for err in errors), errors
    finally:
        g.close()
