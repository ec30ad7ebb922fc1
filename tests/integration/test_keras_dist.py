"""tfos.keras_dist: Keras 3 ``model.fit`` on 2 TF worker processes (localhost), no Spark.

Each test launches this file twice as a worker (``python test_keras_dist.py --worker ...``), each
with its own TF_CONFIG. Every rank trains on a disjoint half of scikit-learn's digits, starting
from a different random initialisation (so the initial broadcast matters), with
``DistributedOptimizer`` averaging the gradients. The test checks that both ranks end with the
same weights and reach >= 0.90 test accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tfos.testing.ports import free_ports
from tfos.tf import gloo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN_TIMEOUT = 180.0  # seconds for one 2-worker run (measured: ~15-25 s on 2 cores)


# ------------------------------------------------------------------------------------ worker


def _primitives(opts) -> int:
    """allreduce / broadcast / DistributedOptimizer.apply on known values, eager and in tf.function."""
    from tfos import keras_dist

    rank, size = keras_dist.init_collectives(method=opts.method, timeout_seconds=opts.collective_timeout,
                                             implementation=opts.implementation)
    import keras
    import numpy as np
    import tensorflow as tf

    out = {"rank": rank, "size": size}
    out["mean"] = keras_dist.allreduce(float(rank + 1)).numpy().tolist()
    out["sum"] = keras_dist.allreduce(np.array([rank + 1, 10], "int64"), average=False).numpy().tolist()
    vf = tf.Variable(np.full((2, 3), rank + 1.0, "float32"))
    vi = tf.Variable(np.array([rank + 5, rank + 7], "int64"))
    kv = keras.Variable(np.full((4,), rank + 2.0, "float32"))
    keras_dist.broadcast_variables([vf, vi, kv], root_rank=1)
    out["bcast"] = [vf.numpy().tolist(), vi.numpy().tolist(), np.asarray(kv).tolist()]

    w = keras.Variable(np.zeros((3,), "float32"), name="w")
    u = keras.Variable(np.zeros((2,), "float32"), name="u")
    # bytes_per_pack=8: w (12 bytes) and u (8 bytes) go in separate all-reduces
    opt = keras_dist.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=opts.compression or None,
                                          bytes_per_pack=8)

    @tf.function
    def step(scale):
        g = tf.fill([3], scale * (rank + 1.0))
        opt.apply([g, tf.fill([2], 1.0 / 3.0 * (rank + 1))], [w, u])

    step(tf.constant(1.0))  # traced: w = -1.5
    step(tf.constant(2.0))  # same trace, new instance keys at call time: w = -4.5
    opt.apply([tf.ones([3]) * (rank + 1), tf.zeros([2])], [w, u])  # eager: w = -6.0
    # model.fit's order: scale_loss (divided by the workers) before the gradient, apply sums
    z = keras.Variable(np.zeros((2,), "float32"), name="z")
    opt2 = keras_dist.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=opts.compression or None)

    def fit_like(scale):
        with tf.GradientTape() as tape:
            loss = opt2.scale_loss(tf.reduce_sum(z * scale * (rank + 1.0)))  # d/dz = scale * (rank + 1)
        opt2.apply(tape.gradient(loss, [z]), [z])

    tf.function(fit_like)(tf.constant(1.0))  # traced: z = -1.5
    fit_like(tf.constant(2.0))  # eager: z = -4.5
    opt2.apply([tf.fill([2], rank + 1.0)], [z])  # a custom loop without scale_loss: the mean, z = -6.0
    out["z"] = np.asarray(z).tolist()
    out["w"] = np.asarray(w).tolist()
    out["u"] = np.asarray(u).tolist()
    out["opt_class"] = type(opt).__name__
    out["opt_config_name"] = keras.optimizers.serialize(opt)["class_name"]
    out["implementation"] = keras_dist._state.implementation
    out["gloo_op"] = keras_dist._state.gloo is not None and keras_dist._state.gloo._kernel is not None
    big = np.arange(5_000_000, dtype="float32") * (rank + 1)  # > gloo.CHUNK_BYTES: copied in chunks
    out["big_ok"] = bool(np.array_equal(keras_dist.allreduce(big, average=False).numpy(), big / (rank + 1) * 3))
    out["big_unchanged"] = bool(np.array_equal(big, np.arange(5_000_000, dtype="float32") * (rank + 1)))
    # In a tf.function: a variable's value and an argument the caller keeps must stay as they are;
    # tensors the step made (reduced where they lie with Gloo) come out right, big and small mixed.
    kept_v = tf.Variable(np.full((300_000,), rank + 1.0, "float32"))  # 1.2 MB: reduced on its own
    kept_t = tf.constant(np.full((3_000_000,), rank + 1.0, "float32"))  # 12 MB: copied in parts (Gloo's op)

    @tf.function
    def in_step(v, t, scale):
        made = [tf.fill([400_000], scale * (rank + 1.0)), tf.fill([5], scale * (rank + 1.0)),
                tf.fill([2, 3], tf.cast(scale, tf.float16) * (rank + 1)),
                tf.fill([3_000_001], scale * (rank + 1.0))]  # 12 MB: Gloo gets it in 2 uneven parts (split_count)
        reduced = keras_dist._all_reduce_list([v.value(), t] + made, average=True)
        return [tf.reduce_sum(r) for r in reduced]

    sums = [float(x) for x in in_step(kept_v, kept_t, tf.constant(2.0))]
    out["in_step"] = sums == [450_000.0, 4_500_000.0, 1_200_000.0, 15.0, 18.0, 9_000_003.0]
    out["in_step_sums"] = sums
    out["in_step_unchanged"] = bool(np.all(kept_v.numpy() == rank + 1.0) and np.all(kept_t.numpy() == rank + 1.0))
    out["bf16"] = keras_dist.allreduce(tf.constant([rank + 1.0], tf.bfloat16)).numpy().astype("float32").tolist()
    out["compressed"] = [keras_dist.allreduce(tf.constant([rank + 1.0, 1000.0]), compression=c).numpy().tolist()
                         for c in ("fp16", "bf16")]
    with open(opts.out, "w") as f:
        json.dump(out, f)
    return 0


def _worker(opts) -> int:
    if opts.mode == "primitives":
        return _primitives(opts)
    t0 = time.time()
    from tfos import keras_dist

    rank, size = keras_dist.init_collectives(method=opts.method, timeout_seconds=opts.collective_timeout,
                                             implementation=opts.implementation)
    t_init = time.time() - t0

    import hashlib

    import keras
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    per_rank = len(x_train) // size  # equal shards: every rank runs the same number of steps
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    x_shard, y_shard = x_train[shard], y_train[shard]
    if opts.uneven and rank == 1:
        x_shard, y_shard = x_shard[:-64], y_shard[:-64]

    keras.utils.set_random_seed(1234 + 17 * rank)  # different init per rank: broadcast must fix it
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.Adam(opts.lr)
    if not opts.no_dist_opt:  # --no-dist-opt / --no-broadcast: negative controls (weights must differ)
        opt = keras_dist.DistributedOptimizer(opt, num_workers=size, compression=opts.compression or None)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False, steps_per_execution=opts.steps_per_execution)
    cbs = [keras_dist.MetricAverageCallback()]
    if not opts.no_broadcast:
        cbs.append(keras_dist.BroadcastInitialWeights(root_rank=0))
    t1 = time.time()
    hist = model.fit(x_shard, y_shard, batch_size=32, epochs=opts.epochs, shuffle=True, callbacks=cbs, verbose=0)
    t_fit = time.time() - t1
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    weights = [np.asarray(w) for w in model.get_weights()]
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
    np.savez(opts.out + ".npz", *weights)
    result = {"rank": rank, "size": size, "shard_rows": len(x_shard), "acc": float(acc), "sha256": digest,
              "init_s": t_init, "fit_s": t_fit, "total_s": time.time() - t0,
              "iterations": int(np.asarray(opt.iterations)),
              "loss": [float(v) for v in hist.history["loss"]]}
    with open(opts.out, "w") as f:
        json.dump(result, f)
    return 0


def _worker_main(argv) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="fit")
    p.add_argument("--method", default="strategy")
    p.add_argument("--implementation", default="auto")
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--no-broadcast", action="store_true")
    p.add_argument("--no-dist-opt", action="store_true")
    p.add_argument("--uneven", action="store_true")
    p.add_argument("--compression", default="")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--collective-timeout", type=float, default=120.0)
    opts = p.parse_args(argv)
    import logging

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = 1
    try:
        code = _worker(opts)
        if code == 0:
            _exit_barrier(opts.out)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)  # TF's threads must not keep a finished worker alive


def _exit_barrier(out: str, timeout: float = 60.0) -> None:
    """Wait until every worker finished its part (a marker file each, next to the results) before
    this one exits: TF's collectives pull buffers from the peers, so a rank whose last all-reduce
    is done may still be serving a peer's last pull ("Socket closed" when it exits first)."""
    open(out + ".done", "w").close()
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    n = sum(len(v) for v in cluster.values())
    folder = os.path.dirname(out)
    deadline = time.time() + timeout
    while time.time() < deadline and len([f for f in os.listdir(folder) if f.endswith(".json.done")]) < n:
        time.sleep(0.05)


# ------------------------------------------------------------------------------------ driver


class WorkersFailed(AssertionError):
    """A worker exited non-zero; ``codes`` and full ``logs`` (one per rank) are attached."""

    def __init__(self, codes, logs):
        super().__init__(f"worker exit codes {codes}:\n" + "\n".join(t[-4000:] for t in logs))
        self.codes, self.logs = codes, logs


def _kill_group(proc, grace=5.0):
    """SIGTERM, then SIGKILL: a TF worker may ignore SIGTERM (preemption handler)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_workers(n=2, timeout=RUN_TIMEOUT, extra_args=(), attempts=2, chief=None, workdir=None):
    """Launch n local TF tasks (``chief``: a job name, 'chief' or 'master', for the first task;
    the others are workers); return (results by rank, wall seconds, tmp dir). Kills everything
    on exit."""
    for attempt in range(attempts):
        tmp = str(workdir) if workdir is not None else tempfile.mkdtemp(prefix="tfos-kd-")
        os.makedirs(tmp, exist_ok=True)
        hosts = [f"127.0.0.1:{p}" for p in free_ports(n)]
        procs, logs = [], []
        t0 = time.time()
        try:
            for i in range(n):
                env = dict(os.environ)
                if chief:
                    cluster = {chief: hosts[:1], "worker": hosts[1:]}
                    task = {"type": chief, "index": 0} if i == 0 else {"type": "worker", "index": i - 1}
                else:
                    cluster, task = {"worker": hosts}, {"type": "worker", "index": i}
                env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
                env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                env.setdefault("OMP_NUM_THREADS", "1")
                env.setdefault("TF_NUM_INTRAOP_THREADS", "1")
                env.setdefault("TF_NUM_INTEROP_THREADS", "2")
                log = open(os.path.join(tmp, f"worker{i}.log"), "w+")
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", "--out", os.path.join(tmp, f"r{i}.json"),
                     *extra_args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            deadline = t0 + timeout
            for p in procs:
                p.wait(timeout=max(0.1, deadline - time.time()))
            wall = time.time() - t0
            codes = [p.returncode for p in procs]
            texts = []
            for log in logs:
                log.seek(0)
                texts.append(log.read())
            if any(codes):
                if attempt + 1 < attempts and any("ddress already in use" in t or "Failed to add port" in t
                                                  for t in texts):
                    continue  # lost the port race: retry once with new ports
                raise WorkersFailed(codes, texts)
            results = [json.load(open(os.path.join(tmp, f"r{i}.json"))) for i in range(n)]
            return results, wall, tmp
        except subprocess.TimeoutExpired:
            texts = []
            for log in logs:
                log.flush()
                log.seek(0)
                texts.append(log.read()[-3000:])
            raise AssertionError(f"workers did not finish within {timeout} s:\n" + "\n".join(texts))
        finally:
            for p in procs:
                _kill_group(p)
            for log in logs:
                log.close()
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------ process tests


def _check(results, tmp, min_acc=0.90, bitwise=True):
    import numpy as np

    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["shard_rows"] == results[1]["shard_rows"]
    w0 = np.load(os.path.join(tmp, "r0.json.npz"))
    w1 = np.load(os.path.join(tmp, "r1.json.npz"))
    assert list(w0.keys()) == list(w1.keys())
    for k in w0:
        assert np.allclose(w0[k], w1[k], atol=1e-6, rtol=0), k
    if bitwise:
        assert results[0]["sha256"] == results[1]["sha256"]
    assert results[0]["iterations"] == results[1]["iterations"]
    for r in results:
        assert r["acc"] >= min_acc, r
    # MetricAverageCallback: both ranks log the same (averaged) epoch losses
    assert np.allclose(results[0]["loss"], results[1]["loss"], rtol=1e-6)


needs_gloo = pytest.mark.skipif(not gloo.installed(), reason="PyTorch (tfos[gloo]) is not installed")



@pytest.mark.slow
@pytest.mark.parametrize("chief,method,implementation", [
    ("chief", "strategy", "tf"), ("master", "strategy", "tf"), ("master", "context", "tf"),
    pytest.param("master", "strategy", "auto", marks=needs_gloo),
    pytest.param("chief", "context", "gloo without its op", marks=needs_gloo)])
def test_primitives_two_workers(tmp_path, monkeypatch, chief, method, implementation):
    """Exact values: mean/sum all-reduce, broadcast from rank 1 (3 dtypes), optimizer averaging in a
    traced tf.function called twice and eagerly, a 20 MB all-reduce (Gloo: copied in chunks; the
    input stays unchanged), in a tf.function a variable's value and a kept argument unchanged beside
    tensors the step made (Gloo reduces those where they lie), bfloat16. Cluster = 1 chief (rank 0) + 1 worker (rank 1); the chief's
    job may have TF 1.x's name 'master' (``master_node='master'``). 'auto' is Gloo on this CPU host
    (PyTorch is installed), so that case runs the Gloo implementation, in tf.function through
    tfos's op (built here if it is not); 'gloo without its op' through tf.py_function."""
    if implementation == "auto":
        from tfos.tf import gloo_kernel

        gloo_kernel.build()  # kept in the cache: once per source and version
    elif implementation == "gloo without its op":
        monkeypatch.setenv("TFOS_GLOO_KERNEL", "0")
        implementation = "gloo"
    results, wall, tmp = run_workers(extra_args=["--mode", "primitives", "--method", method,
                                                 "--implementation", implementation], timeout=120,
                                     chief=chief, workdir=tmp_path)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["implementation"] == ("tf" if implementation == "tf" else "gloo")
        assert r["gloo_op"] == (implementation == "auto")
        assert r["big_ok"] and r["big_unchanged"] and r["bf16"] == [1.5]
        assert r["in_step"] and r["in_step_unchanged"], r["in_step_sums"]
        assert r["compressed"] == [[1.5, 1000.0], [1.5, 1000.0]]
        assert r["mean"] == 1.5 and r["sum"] == [3, 20]
        assert r["bcast"] == [[[2.0] * 3] * 2, [6, 8], [3.0] * 4]
        assert r["w"] == [-6.0] * 3
        assert r["z"] == [-6.0] * 2  # scale_loss + apply (fit's path) gives the mean too, traced and eager
        assert r["u"] == pytest.approx([-1.0] * 2, abs=1e-6)  # 2 traced steps of mean(1/3, 2/3) = 0.5
        assert r["opt_class"] == "SGD" and r["opt_config_name"] == "SGD"


IMPLEMENTATIONS = ["tf", pytest.param("gloo", marks=needs_gloo)]


@pytest.mark.slow
def test_fit_two_workers_identical_weights(tmp_path):
    """TF's collectives, to accuracy (one of the suite's three trainings to accuracy); Gloo's fp32
    fit is checked the same way in the test against one process below."""
    results, wall, tmp = run_workers(extra_args=["--epochs", "5", "--implementation", "tf"], workdir=tmp_path)
    print(f"fp32 tf: wall {wall:.1f}s, results {results}")
    _check(results, tmp)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_fit_two_workers_fp16_compression(tmp_path, implementation):
    results, wall, tmp = run_workers(extra_args=["--epochs", "2", "--compression", "fp16", "--implementation",
                                                 implementation], workdir=tmp_path)
    print(f"fp16 {implementation}: wall {wall:.1f}s, results {results}")
    _check(results, tmp, min_acc=0.5)  # it learns; accuracy: the fp32 test above


@pytest.mark.slow
@needs_gloo
def test_gloo_accuracy_within_2_points_of_one_process(tmp_path):
    """Two ranks with Gloo (each on half of the data) against one process on all of it."""
    (one,), _, _ = run_workers(n=1, extra_args=["--epochs", "5"], workdir=tmp_path / "one")
    two, _, tmp = run_workers(extra_args=["--epochs", "5", "--implementation", "gloo"], workdir=tmp_path / "two")
    _check(two, tmp)
    print(f"accuracy: one process {one['acc']:.4f}, two Gloo ranks {two[0]['acc']:.4f}")
    assert abs(two[0]["acc"] - one["acc"]) <= 0.02


@pytest.mark.slow
def test_fit_two_workers_context_method_steps_per_execution(tmp_path):
    """init_collectives(method='context') (no MultiWorkerMirroredStrategy object at all), and
    steps_per_execution=4: the collectives run inside Keras' tf.while_loop/tf.cond."""
    results, wall, tmp = run_workers(
        extra_args=["--epochs", "2", "--method", "context", "--steps-per-execution", "4", "--implementation", "tf"],
        workdir=tmp_path)
    print(f"context: wall {wall:.1f}s, results {results}")
    _check(results, tmp, min_acc=0.5)


@pytest.mark.slow
def test_uneven_shards_fail_fast_on_all_ranks(tmp_path):
    """Shards giving different steps per epoch: BroadcastInitialWeights raises on every rank
    instead of pairing unrelated collectives (which ends in a hang or a collective timeout)."""
    with pytest.raises(WorkersFailed) as err:
        run_workers(extra_args=["--epochs", "1", "--uneven"], timeout=120, workdir=tmp_path)
    assert err.value.codes == [1, 1]
    for log in err.value.logs:
        assert "ValueError: workers plan different training lengths" in log, log[-3000:]


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker_main(sys.argv[1:])
    else:
        res, secs, d = run_workers(extra_args=sys.argv[1:])
        print(json.dumps(res, indent=1), f"wall {secs:.1f}s", d)
