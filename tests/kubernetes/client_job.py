"""The Kubernetes suite's client-mode application: three tfos clusters, one after the other, on the
same two executor pods, so that one submission's start (the driver's JVM, two executor pods, their
JVMs) serves four tests. Each phase's outcome (``{"error": null}`` or its traceback) goes to
``phase.json`` in its directories.

1. **digits behind an outsider's target** (HOLD, DIGITS): 2 nodes (chief + worker) start MWMS (TF
   servers up, the tunnels serving), all-reduce once, write where everything listens
   (HOLD/node-<rank>.json) and hold until the test, having run its outsider pod, touches HOLD/done;
   then the same TF processes run examples/digits/digits_tf.py's main_fun as digits_tf.main runs it
   (shards, model, checkpoints, export and result.json under DIGITS). The driver's control service
   listens on CONTROL_PORT for this cluster (the outsider's target).
2. **an executor pod deleted mid-training** (EVICT): tests/restart_programs.evictable_steps (every
   25 steps a checkpoint, ctx.should_checkpoint after each) on 2 MWMS nodes with min_executors=1;
   the test deletes the worker's pod after 60 steps, so its node is evicted through the pod's
   preStop hook, the cluster goes on and grows back once Spark replaces the pod. What happened:
   EVICT/driver.json.
3. **a feed in the pods** (FEED): 4,000 rows in 50-row chunks from 8 partitions into 2 nodes'
   ``batches()``; each node writes how many chunks came through its shared-memory rings (from
   feeding tasks in its own pod) and how many on the channel (from the other pod): FEED/paths-<rank>.json.
4. **an OOM-killed node** (OOM): node 0's TF process touches more memory than its executor pod's
   limit (spark.executor.memory + spark.executor.memoryOverhead), so the kernel's OOM killer ends
   it; the error the driver raised: OOM/error.txt.

    spark-submit ... client_job.py HOLD DIGITS EVICT FEED OOM CONTROL_PORT EVICT_STEPS
"""

import json
import logging
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # tests/: restart_programs
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "digits"))  # digits_tf

import digits_tf  # noqa: E402
import restart_programs  # noqa: E402
from digits_tf import main_fun as digits_main_fun  # noqa: E402


def listeners(pid="self"):
    """The TCP listening addresses of a process: /proc/<pid>/net/tcp{,6} rows whose socket the process holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    addr, port = cols[1].split(":")
                    raw = bytes.fromhex(addr)[-4:][::-1]  # IPv4, or the IPv4 of a mapped IPv6 address
                    out.append((".".join(map(str, raw)) if name == "tcp" or addr.startswith("0000000000000000FFFF0000")
                                else addr, int(port, 16)))
    return out


def hold(out_dir, ctx):
    """TF servers up and a collective through the tunnels; where everything listens in
    OUT/node-<rank>.json; then wait for OUT/done (the test's outsider is through)."""
    import tensorflow as tf

    strategy = ctx.strategy()  # the TF server and the collectives' group (digits' main_fun gets the same)
    with strategy.scope():
        v = tf.Variable(1.0)
    total = strategy.reduce("SUM", strategy.run(lambda: v * 1.0), axis=None)  # traffic through the tunnels
    me = {"rank": ctx.rank, "nodes": ctx.nodes, "spec": {str(n.node_index): n.address for n in ctx.spec_nodes},
          "listeners": listeners(), "sum": float(total), "pod_ip": os.environ.get("SPARK_EXECUTOR_POD_IP")}
    path = os.path.join(out_dir, f"node-{ctx.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(me, f)
    os.replace(path + ".tmp", path)  # whole or absent when the test reads it
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(out_dir, "done")) and time.monotonic() < deadline:
        time.sleep(0.5)
    ctx.all_gather("end", 0)
    open(os.path.join(out_dir, f"held-{ctx.rank}"), "w").close()


def held_digits(args, ctx):
    """The outsider's target first, then the digits example's training in the same TF processes."""
    hold(args.hold_dir, ctx)
    digits_main_fun(args, ctx)


def grow(_args, ctx):
    if ctx.node_index == 0:
        import numpy as np

        blocks = []
        for _ in range(64):  # 64 x 64 MiB, touched: past a 2 GiB limit
            blocks.append(np.ones(64 << 20, dtype=np.uint8))
    time.sleep(120)  # the other node waits; the driver ends it when node 0 fails


def digits_phase(spark, hold_dir, digits_dir, control_port):
    """What digits_tf.main does under spark-submit (its session is this application's and stays
    open for the next phases), with held_digits as the nodes' function."""
    from tfos import InputMode, TFCluster

    args = digits_tf.parse_args(["--epochs", "3", "--data-dir", f"{digits_dir}/data", "--output-dir",
                                 f"{digits_dir}/out", "--export-dir", f"{digits_dir}/export"])
    args.train_rows = digits_tf.prepare_shards(args.data_dir)["train_rows"]
    args.hold_dir = hold_dir
    os.environ["TFOS_SERVER_PORT"] = str(control_port)  # read when the cluster is reserved
    try:
        cluster = TFCluster.run(spark, held_digits, args, args.num_executors, 0, input_mode=InputMode.TENSORFLOW,
                                master_node="chief", max_restarts=args.max_restarts,
                                min_executors=args.min_executors, log_dir=f"{args.output_dir}/logs",
                                checkpoint_dir=args.checkpoint_dir)
    finally:
        os.environ.pop("TFOS_SERVER_PORT", None)
    cluster.shutdown()
    result = json.loads(digits_tf.read_file(args.output_dir, "result.json"))
    print(f"digits: {args.num_executors} nodes, {args.epochs} epochs, test accuracy {result['accuracy']:.4f}",
          flush=True)


def evict_phase(spark, out, steps):
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(spark.sparkContext, restart_programs.evictable_steps,
                            {"steps": steps, "out": out, "every": 25}, 2, 0, input_mode=InputMode.TENSORFLOW,
                            master_node="chief", min_executors=1, size_wait=5, grow_interval=2, max_restarts=0,
                            restart_backoff=1, eviction_grace=60, checkpoint_dir=os.path.join(out, "ckpt"),
                            reservation_timeout=600, heartbeat_interval=1.0, heartbeat_timeout=20.0)
    with open(os.path.join(out, "nodes.json"), "w") as f:
        json.dump({"hosts": {n["node_index"]: n["host"] for n in cluster.nodes}}, f)
    try:
        cluster.shutdown(timeout=900)
    finally:
        with open(os.path.join(out, "driver.json"), "w") as f:
            json.dump({"evictions": [{"nodes": list(e.nodes), "step": e.step, "why": e.why, "attempt": e.attempt}
                                     for e in cluster.evictions],
                       "resizes": [[r.from_nodes, r.to_nodes, r.step] for r in cluster.resizes],
                       "restarts": len(cluster.restarts), "roles": [list(r) for r in cluster.roles],
                       "attempt": cluster.attempt}, f)


FEED_ROWS = 4000


def count_paths(out_dir, ctx):
    """One feed read whole; the rows and how the chunks came (wire.ring: a ring within the pod)."""
    feed = ctx.get_data_feed(train_mode=True)
    rows = sum(len(ids) for ids, _vec in feed.batches(64))
    with open(os.path.join(out_dir, f"paths-{ctx.rank}.json"), "w") as f:
        json.dump({"rows": rows, "shm": feed.hub.shm_chunks, "channel": feed.hub.channel_chunks}, f)


def feed_phase(spark, out):
    from tfos import InputMode, TFCluster

    sc = spark.sparkContext
    cluster = TFCluster.run(sc, count_paths, out, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            preimport_tensorflow=False)  # batches() needs no TensorFlow
    try:
        rdd = sc.parallelize(range(FEED_ROWS), 8).map(lambda i: (i, [float(i)] * 8))
        fed = cluster.train(rdd, num_epochs=1, chunk_rows=50, uneven=None)
    finally:
        cluster.shutdown(timeout=300)
    if fed != FEED_ROWS:
        raise AssertionError(f"fed {fed} of {FEED_ROWS} rows")


def oom_phase(spark, out):
    from tfos import InputMode, TFCluster

    try:  # grow never imports TensorFlow: its TF processes need not either
        TFCluster.run(spark.sparkContext, grow, None, 2, 0, input_mode=InputMode.TENSORFLOW, master_node=None,
                      preimport_tensorflow=False).shutdown(timeout=300)
        message = "no error"
    except Exception as e:  # noqa: BLE001 (the test reads what the user would see)
        message = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, "error.txt"), "w") as f:
        f.write(message)


def phase(dirs, fn, *args) -> bool:
    """Run one phase; whether it raised, in phase.json of each of ``dirs`` (the later phases run either way)."""
    try:
        fn(*args)
        error = None
    except Exception:  # noqa: BLE001 (the phase's test reports it)
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
    for d in dirs:
        with open(os.path.join(d, "phase.json"), "w") as f:
            json.dump({"error": error}, f)
    return error is None


if __name__ == "__main__":
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for module in (digits_tf, restart_programs):  # the image has tfos and its examples' copy, not these modules
        cloudpickle.register_pickle_by_value(module)
    hold_dir, digits_dir, evict_dir, feed_dir, oom_dir, control_port, steps = sys.argv[1:8]
    spark = SparkSession.builder.appName("tfos-client").getOrCreate()
    ok = [phase([hold_dir, digits_dir], digits_phase, spark, hold_dir, digits_dir, int(control_port)),
          phase([evict_dir], evict_phase, spark, evict_dir, int(steps)),
          phase([feed_dir], feed_phase, spark, feed_dir),
          phase([oom_dir], oom_phase, spark, oom_dir)]
    spark.stop()
    sys.exit(0 if all(ok) else 1)
