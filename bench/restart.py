"""Restart time: from a TF process SIGKILLed mid-training to the new attempt's first training
step (max_restarts=1), against its reference, a fresh cluster's reserve -> first step (what a user
does by hand without restarts), in the same run on local-cluster[2,1,1024]. With ``--multihost``
on the multi-host harness (tests/multihost/hosts.py: a Spark standalone cluster of 3 hosts in
network namespaces; root): the victim's whole host is killed (every process SIGKILLed) and the
new attempt runs on the two other hosts; the host comes back between runs. With ``--shrink``
(multi-host harness): 3 nodes on the 3 hosts with ``min_executors=2``, a whole host killed for
good, the restart runs on the 2 hosts left: SIGKILL -> first step on 2 nodes, against a fresh start
of a 2-node cluster (reserve -> first step) in the same run; then the host comes back and the
cluster grows to 3 at rank 0's next ctx.checkpoint_saved: Spark offering the third slot -> first
step on 3 nodes, against the same run's fresh 3-node start (grow_interval=1 s). With ``--evict``
(multi-host harness): 3 nodes checkpointing every 100 steps, ``min_executors=2``; at step 150 a
node's agent gets SIGTERM (an eviction notice) and its host is killed as the platform would. Ours:
the program asks ``ctx.should_checkpoint``, every rank saves at one step, the cluster goes on with
2 nodes from it; the reference, in the same run: the same notice without the save
(``eviction_grace=0``), a restart from the last periodic checkpoint. Steps lost (the highest step
any rank finished before the stop, minus the step the next attempt resumed from) and notice ->
first step on 2 nodes, for both.

    python bench/restart.py [--runs 3] [--multihost | --shrink | --evict]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def mwms_step(strategy):
    """``step()``: one training step of a small Keras model under ``strategy`` (MWMS)."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
        opt = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.run(replica, args=(x, y))

    x, y = tf.random.uniform((32, 64)), tf.zeros((32,), tf.int64)
    return lambda: step(x, y)


def main_fun(args, ctx):
    """MWMS steps on a small model; reports the wall time of this attempt's first step."""
    step = mwms_step(ctx.strategy())
    step()
    ctx.report(first_step_time=time.time(), attempt=ctx.attempt, step=1)
    for i in range(2, args + 1):
        step()
        if i % 20 == 0:
            ctx.report(step=i)
            ctx.checkpoint_saved(i)  # (no checkpoint is written: the signal is what a resize waits for)
        time.sleep(0.01)


def one_eviction(sc, hosts, save: bool, out: str):
    """One eviction of node 2 at step 150: (steps lost, notice -> first step on 2 nodes in s)."""
    import glob
    import tempfile

    from tfos import InputMode, TFCluster, TFOSError

    from restart_programs import evictable_steps  # tests/ is on sys.path since main() (the executors' too)

    d = tempfile.mkdtemp(dir=out)
    cluster = TFCluster.run(sc, evictable_steps, {"out": d, "steps": 10**9, "every": 100, "ask": save}, 3, 0,
                            input_mode=InputMode.TENSORFLOW, master_node="chief", min_executors=2, size_wait=5,
                            grow_interval=None, max_restarts=0 if save else 1, restart_backoff=0,
                            eviction_grace=30 if save else 0, stop_grace_secs=2, report_interval=0.2,
                            progress=False, heartbeat_timeout=10, reservation_timeout=180,
                            checkpoint_dir=os.path.join(d, "ckpt"))
    victim = None
    try:
        wait(lambda: len(cluster.metrics()) == 3 and min(m.get("step", 0) for m in cluster.metrics().values()) >= 150,
             300)
        node = next(n for n in cluster.nodes if n["node_index"] == 2)
        victim = next(h for h in hosts.hosts if h.address == node["host"])
        t_notice = time.time()
        os.kill(cluster.registry.nodes[2].agent.agent_pid, signal.SIGTERM)
        if save:
            wait(lambda: cluster.evictions, 60)
        hosts.kill_host(victim)  # the platform's SIGKILL
        first = first_step(cluster, 1) - t_notice
        resumed = next(m["resumed_from"] for m in cluster.metrics().values() if m.get("attempt") == 1)
        reached = max(int(open(f).read()) for f in glob.glob(os.path.join(d, "last-a0-r*")))
        assert len(cluster.roles) == 2, cluster.roles
    finally:
        cluster._abort(TFOSError("benchmark done"))
        if victim is not None:
            hosts.restart_worker(victim)
    return reached - resumed, first


def wait(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError("benchmark step timed out")


def first_step(cluster, attempt):
    return wait(lambda: next((m["first_step_time"] for m in cluster.metrics().values()
                              if m.get("attempt") == attempt and "first_step_time" in m), None), 300)


def fresh_start(sc, nodes: int) -> float:
    """A fresh cluster of ``nodes``: reserve -> first training step (s)."""
    from tfos import InputMode, TFCluster

    t0 = time.time()
    cluster = TFCluster.run(sc, main_fun, 100000, nodes, 0, input_mode=InputMode.TENSORFLOW, master_node="chief",
                            stop_grace_secs=2, report_interval=0.2, progress=False, heartbeat_timeout=10,
                            reservation_timeout=180)
    try:
        return first_step(cluster, 0) - t0
    finally:
        cluster._abort(__import__("tfos").TFOSError("benchmark done"))


def one_run(sc, hosts=None, shrink: bool = False):
    from tfos import InputMode, TFCluster

    reference = fresh_start(sc, 2) if shrink else None
    t0 = time.time()
    cluster = TFCluster.run(sc, main_fun, 100000, 3 if shrink else 2, 0, input_mode=InputMode.TENSORFLOW,
                            master_node="chief", min_executors=2 if shrink else None, grow_interval=1,
                            max_restarts=1, restart_backoff=0, stop_grace_secs=2, report_interval=0.2,
                            progress=False, heartbeat_timeout=10 if hosts else 30, reservation_timeout=180)
    victim = None
    try:
        fresh = first_step(cluster, 0) - t0
        wait(lambda: min(m.get("step", 0) for m in cluster.metrics().values()) >= 40, 300)
        node = next(n for n in cluster.nodes if n["node_index"] == 1)
        t_kill = time.time()
        if hosts is None:
            os.kill(node["pid"], signal.SIGKILL)
        else:
            victim = next(h for h in hosts.hosts if h.address == node["host"])
            hosts.kill_host(victim)
        restarted = first_step(cluster, 1) - t_kill
        noticed = cluster.restarts[0].time - t_kill
        grown = None
        if shrink:
            assert len(cluster.roles) == 2, cluster.roles  # it went on smaller
            from tfos.cluster.driver.spark import slots_offered

            hosts.restart_worker(victim)  # the host comes back
            victim = None
            wait(lambda: slots_offered(sc) >= 3, 120)
            t_back = time.time()
            grown = first_step(cluster, 2) - t_back
            assert len(cluster.roles) == 3 and cluster.resizes, cluster.resizes
    finally:
        cluster._abort(__import__("tfos").TFOSError("benchmark done"))
        if victim is not None:  # the host comes back for the next run
            hosts.restart_worker(victim)
    if shrink:
        return reference, restarted, noticed, fresh, grown
    return fresh, restarted, noticed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--multihost", action="store_true", help="on the multi-host harness: a whole host is killed")
    p.add_argument("--shrink", action="store_true", help="on the multi-host harness: 3 nodes, min_executors=2, a "
                   "host killed for good; against a fresh 2-node start")
    p.add_argument("--evict", action="store_true", help="on the multi-host harness: an eviction notice with the "
                   "save (ctx.should_checkpoint) against the same notice without it")
    args = p.parse_args(argv)
    args.multihost = args.multihost or args.shrink or args.evict
    logging.basicConfig(level=logging.WARNING)
    # the supervisor's restart line times the phases ("attempt N started in T s (stopping the nodes ...,
    # cancel and teardown ..., reservation to registered ...)"): shown, the rest of tfos stays at WARNING
    logging.getLogger("tfos.cluster.driver.supervisor").setLevel(logging.INFO)
    if args.multihost:
        sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))
        sys.path.insert(0, os.path.join(ROOT, "tests"))  # --evict's program; before the session: executors get it
        from hosts import Hosts, can_run, wait_executors

        why = can_run()
        if why:
            raise SystemExit(f"the multi-host harness cannot run here: {why}")
        with Hosts(3) as hosts:
            spark = hosts.spark_session("tfos-bench-restart")
            rows = []
            for _ in range(args.runs):
                wait_executors(spark.sparkContext, 3)
                if args.evict:
                    import tempfile

                    out = tempfile.mkdtemp(prefix="tfos-bench-evict-")
                    ours = one_eviction(spark.sparkContext, hosts, True, out)
                    wait_executors(spark.sparkContext, 3)
                    rows.append(ours + one_eviction(spark.sparkContext, hosts, False, out))
                else:
                    rows.append(one_run(spark.sparkContext, hosts, args.shrink))
            spark.stop()
        if args.evict:
            print("multi-host harness (3 hosts, min_executors=2): at step 150 node 2's agent gets SIGTERM, then its "
                  "host is killed; periodic checkpoints every 100 steps")
            print("| run | save first: steps lost | save first: notice -> first step on 2 nodes (s) | no save: steps "
                  "lost | no save: notice -> first step on 2 nodes (s) | time, save / no save |")
            print("|---:|---:|---:|---:|---:|---:|")
            for i, (lost, t, lost_ref, t_ref) in enumerate(rows, 1):
                print(f"| {i} | {lost} | {t:.1f} | {lost_ref} | {t_ref:.1f} | {t / t_ref:.2f} |")
            m = [statistics.median(c) for c in zip(*rows)]
            print(f"| median | {m[0]:g} | {m[1]:.1f} | {m[2]:g} | {m[3]:.1f} | {m[1] / m[3]:.2f} |")
            return
        print("multi-host harness (3 hosts): the victim's whole host killed"
              + (" (3 nodes, min_executors=2: the restart runs on the 2 hosts left; the reference is a fresh "
                 "2-node start)" if args.shrink else ""))
    else:
        from tfos.testing import local_cluster_session

        spark = local_cluster_session(2, app_name="tfos-bench-restart")
        spark.sparkContext.setLogLevel("ERROR")
        rows = [one_run(spark.sparkContext) for _ in range(args.runs)]
        spark.stop()
        print("local-cluster[2,1,1024]: the victim's TF process SIGKILLed")
    if args.shrink:
        print("| run | fresh start of 2 nodes (s) | shrink: SIGKILL -> first step on 2 nodes (s) | SIGKILL -> driver "
              "acts (s) | shrink / fresh 2 | fresh start of 3 nodes (s) | grow: 3rd slot offered -> first step on 3 "
              "nodes (s) | grow / fresh 3 |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for i, (f2, shrunk, noticed, f3, grown) in enumerate(rows, 1):
            print(f"| {i} | {f2:.1f} | {shrunk:.1f} | {noticed:.1f} | {shrunk / f2:.2f} | {f3:.1f} | {grown:.1f} | "
                  f"{grown / f3:.2f} |")
        m = [statistics.median(c) for c in zip(*rows)]
        print(f"| median | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[1] / m[0]:.2f} | {m[3]:.1f} | {m[4]:.1f} | "
              f"{m[4] / m[3]:.2f} |")
        return
    print("| run | fresh start: reserve -> first step (s) | restart: SIGKILL -> first step of attempt 1 (s) | "
          "SIGKILL -> driver acts (s) | restart / fresh |")
    print("|---:|---:|---:|---:|---:|")
    for i, (fresh, restarted, noticed) in enumerate(rows, 1):
        print(f"| {i} | {fresh:.1f} | {restarted:.1f} | {noticed:.1f} | {restarted / fresh:.2f} |")
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"| median | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[1] / med[0]:.2f} |")


if __name__ == "__main__":
    main()
