"""Start-up: reserve -> every node registered, and reserve -> first training step, tfos against
TensorFlowOnSpark 2.2.5, in ONE run on local-cluster[2,1,1024] (2 nodes: chief + worker).

Each round starts a tfos cluster and a TensorFlowOnSpark cluster, in alternating order, with the
same main function: import TensorFlow, build a MultiWorkerMirroredStrategy, run one training step
of a small Keras model on it, note the wall time. Spark's Python workers are not reused (each
task forks a fresh one), so every round imports TensorFlow in new processes, as a new application
would; the first round is cold (nothing in the page cache yet), later rounds warm. Reported:

  registered   reserve -> every node registered: tfos ``TFCluster.run`` (= reserve + start) returns;
               TensorFlowOnSpark ``TFCluster.run`` returns (its reservation server has every node)
  first step   reserve -> the last node's first training step ended; tfos also without
               preimport_tensorflow (TF imported by main_fun instead of during the rendezvous)

Run:  bash scripts/bench.sh startup [--rounds 4]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import restart  # noqa: E402  (bench/restart.py: the same training step)
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(restart)  # the executors cannot import bench/restart.py


def first_step(out_dir: str, name: str) -> None:
    """One MWMS training step of a small model; writes the wall time it ended to out_dir/name."""
    import tensorflow as tf

    restart.mwms_step(tf.distribute.MultiWorkerMirroredStrategy())()
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(repr(time.time()))


def tfos_main(out_dir, ctx):
    first_step(out_dir, f"tfos-{ctx.node_index}")


def legacy_main(out_dir, ctx):
    first_step(out_dir, f"tfonspark-{ctx.executor_id}")


def last_first_step(out_dir: str, prefix: str, n: int, timeout: float = 300) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        names = [f for f in os.listdir(out_dir) if f.startswith(prefix)]
        if len(names) == n:
            time.sleep(0.05)  # the file is written in one call; let it close
            return max(float(open(os.path.join(out_dir, f)).read()) for f in names)
        time.sleep(0.05)
    raise TimeoutError(f"{prefix}: not every node made its first step within {timeout} s")


def run_tfos(sc, preimport: bool = True) -> tuple[float, float]:
    from tfos import InputMode, TFCluster

    out = tempfile.mkdtemp(prefix="tfos-startup-")
    t0 = time.time()
    cluster = TFCluster.run(sc, tfos_main, out, 2, 0, input_mode=InputMode.TENSORFLOW, master_node="chief",
                            progress=False, preimport_tensorflow=preimport)
    registered = time.time() - t0
    try:
        step = last_first_step(out, "tfos-", 2) - t0
    finally:
        cluster.shutdown(timeout=300)
    return registered, step


def run_legacy(sc) -> tuple[float, float]:
    from tensorflowonspark import TFCluster

    out = tempfile.mkdtemp(prefix="tfonspark-startup-")
    t0 = time.time()
    cluster = TFCluster.run(sc, legacy_main, out, 2, 0, False, TFCluster.InputMode.TENSORFLOW, master_node="chief")
    registered = time.time() - t0
    try:
        step = last_first_step(out, "tfonspark-", 2) - t0
    finally:
        cluster.shutdown()
    return registered, step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tfos.testing import local_cluster_session

    # Fresh Python workers for every task: TensorFlowOnSpark runs main_fun in the Spark task's
    # Python worker, and a reused worker cannot configure MWMS's collectives a second time.
    spark = local_cluster_session(2, app_name="tfos-bench-startup", conf={"spark.python.worker.reuse": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    rows = []
    try:
        for i in range(args.rounds):
            if i % 2 == 0:
                ours, plain, ref = run_tfos(sc), run_tfos(sc, preimport=False), run_legacy(sc)
            else:
                ref, plain, ours = run_legacy(sc), run_tfos(sc, preimport=False), run_tfos(sc)
            rows.append((ours, ref, plain))
    finally:
        spark.stop()
    print("start-up of 2 nodes on local-cluster[2,1,1024], seconds (round 1 is cold)")
    print("| round | tfos registered | TFoS registered | tfos first step | TFoS first step | "
          "registered tfos/TFoS | first step tfos/TFoS | tfos first step, preimport_tensorflow=False |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")

    def row(label, reg, lreg, step, lstep, pstep):
        print(f"| {label} | {reg:.2f} | {lreg:.2f} | {step:.2f} | {lstep:.2f} | {reg / lreg:.2f} | {step / lstep:.2f} "
              f"| {pstep:.2f} |")
    for i, ((reg, step), (lreg, lstep), (_, pstep)) in enumerate(rows, 1):
        row(i, reg, lreg, step, lstep, pstep)
    warm = rows[1:] or rows
    row("warm median", *[statistics.median(x) for x in zip(*[(a[0], b[0], a[1], b[1], c[1]) for a, b, c in warm])])
    print("targets: registered tfos/TFoS <= 1.0, tfos registered <= 2 s warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
