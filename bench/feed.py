"""Feed and inference throughput of tfos vs. its references, in ONE run on local-cluster[2,1,MEM].

Rows: 784 float32 features + an int label (MNIST-shaped), generated on the executors.

  (a) limit   the same Spark job converting the same partitions to Arrow and discarding them
  (b) tfos    cluster.train() into a main_fun that only counts rows (feed.batches)
  (c) TFoS    tensorflowonspark 2.2.5 cluster.train() into a counting TFNode.DataFeed consumer
  by batch    at batch 64, 256 and 1024 on one tfos cluster: feed.batches(B) counted in Python,
              feed.dataset(B) counted in the graph (Dataset.reduce), --batch-rounds rounds
              alternating (medians), and TensorFlowOnSpark's next_batch(B) (one TFoS cluster per
              batch size, fewer rows)
  inference   tfos cluster.inference() vs a hand-written mapPartitions that loads the model once
              per partition and predicts in batches (--infer-runs times in a row; the minimum counts)
  dataframe   a Parquet-backed DataFrame (features array<float> of 784, or binary of 784 float32,
              + label): train(df) into the counting consumer vs a Spark job that only counts the
              same DataFrame's Arrow batches (mapInArrow), vs train(df.rdd.map(...)) of the same
              Parquet rows, and vs train(rdd) of rows generated in memory (no Parquet read);
              inference(df) vs a hand-written mapInArrow that calls the model on each batch

Prints rows/s, MB/s and the ratios b/c and b/a, and the peak RSS of the TF processes.
  limit       train() into dataset(256) and batches(256) against (a), alternating on one cluster
  chunk-size  train() into dataset(B) and batches(B) with chunks of each --chunk-mb size (train's
              chunk_rows), alternating on one cluster
  encryption  a clear (encrypt=False) and an encrypted cluster side by side: train() into
              dataset(256) and inference(), alternating, --rounds rounds
Run:  bash scripts/bench.sh feed [--only all|batch|inference|dataframe|gate|limit|chunk-size|encryption] [--rows N] ...
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time

import numpy as np

from machine import machine_cpu

ROW_BYTES = 784 * 4 + 8


def gen_partition(index, it):
    n = sum(1 for _ in it)
    rng = np.random.default_rng(index)
    block = rng.random((min(n, 1024), 784), dtype=np.float32)
    for i in range(n):
        yield (block[i % len(block)], int(i % 10))


def make_rdd(sc, rows, partitions):
    return sc.range(rows, numSlices=partitions).mapPartitionsWithIndex(gen_partition)


# ---------------------------------------------------------------- (a) the limit
def arrow_limit(sc, rows, partitions):
    from tfos.feed.executor.producer import rows_to_chunks

    def convert(index, it):
        n = 0
        for batch in rows_to_chunks(it, index, None):
            n += batch.num_rows
        yield n

    t0 = time.perf_counter()
    total = sum(make_rdd(sc, rows, partitions).mapPartitionsWithIndex(convert).collect())
    return total, time.perf_counter() - t0


# ---------------------------------------------------------------- (b) tfos
def tfos_counter(args, ctx):
    import resource

    feed = ctx.get_data_feed(train_mode=True)
    n = 0
    for _features, labels in feed.batches(1024):
        n += len(labels)
    ctx.report(rows=n, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               feed_wait_secs=feed.wait_secs)


def tfos_feed(sc, rows, partitions):
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(sc, tfos_counter, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            progress=False, preimport_tensorflow=False)  # the counter never imports TF
    rdd = make_rdd(sc, rows, partitions)
    t0 = time.perf_counter()
    total = cluster.train(rdd, num_epochs=1)
    secs = time.perf_counter() - t0
    cluster.shutdown(timeout=600)
    m = cluster.metrics()
    return total, secs, [m[i].get("peak_rss_mb") for i in sorted(m)], sum(m[i].get("rows", 0)
                                                                         + m[i].get("rows_dropped", 0) for i in m)


# ---------------------------------------------------------------- by batch size: batches() vs dataset()
def tfos_path_counter(plan, ctx):
    """One train() per (path, batch) in ``plan``, in order: count the rows of each feed (and the
    rows equal steps dropped)."""
    import tensorflow as tf

    for i, (path, batch) in enumerate(plan):
        feed = ctx.get_data_feed(train_mode=True)
        dropped = feed.hub.rows_dropped
        cpu0, faults0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if path == "warm-up" or path.startswith("batches"):
            n = sum(len(labels) for _x, labels in feed.batches(batch))
        else:
            ds = feed.dataset(batch)
            n = int(ds.reduce(tf.constant(0, tf.int64), lambda acc, b: acc + tf.shape(b[1], out_type=tf.int64)[0]))
        ctx.report(**{f"rows_{i}": n + feed.hub.rows_dropped - dropped, f"gate_{i}": (
            feed.hub.gate_requests, round(feed.hub.gate_wait_secs, 2), round(feed.wait_secs, 2)),
            f"cpu_{i}": round(time.process_time() - cpu0, 2),
            f"faults_{i}": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0})


def run_plan(sc, rows, partitions, plan, uneven=lambda key: "drop", before=None, chunk_rows=lambda key: None,
             shared_memory=lambda key: True):
    """One train() per (path, batch) of ``plan`` on one cluster (``uneven(key)``: the feed's policy;
    ``before(key)`` runs ahead of each feed while the cluster waits; ``chunk_rows(key)`` and
    ``shared_memory(key)``: train's).
    Returns, per feed, (key, rows/s, the machine's CPU-s, the driver process's CPU-s, the TF
    processes' CPU-s), and the nodes' metrics."""
    from tfos import InputMode, TFCluster
    from tfos.testing import wait_for

    cluster = TFCluster.run(sc, tfos_path_counter, plan, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            progress=False, report_interval=0.1)
    rdd = make_rdd(sc, rows, partitions)  # generated by each feed's tasks, as in (a) and (b)
    feeds = []
    try:
        for i, key in enumerate(plan):
            if before is not None:
                before(key)
            t0, m0, d0 = time.perf_counter(), machine_cpu(), time.process_time()
            n = cluster.train(rdd, num_epochs=1, uneven=uneven(key), chunk_rows=chunk_rows(key),
                              shared_memory=shared_memory(key))
            rate = n / (time.perf_counter() - t0)
            machine, driver = machine_cpu() - m0, time.process_time() - d0
            assert wait_for(lambda: sum(m.get(f"rows_{i}", 0) for m in cluster.metrics().values()) == rows, 30), \
                (key, cluster.metrics())
            feeds.append((key, rate, machine, driver, sum(m.get(f"cpu_{i}", 0) for m in cluster.metrics().values())))
        metrics = cluster.metrics()
    finally:
        cluster.shutdown(timeout=600)
    return feeds, metrics


def tfos_by_batch(sc, rows, partitions, sizes, plan=None, uneven=lambda key: "drop", rounds=1):
    """rows/s of one train() per (path, batch) of ``plan`` on one cluster (``uneven(key)``: the
    feed's policy), the median of a key's runs (by default ``rounds`` rounds of every batch size
    and path, alternating), and every run's rows/s by key, in order."""
    plan = plan or [("warm-up", sizes[-1])] + [(path, b) for _ in range(rounds) for b in sizes
                                               for path in ("batches", "dataset")]
    feeds, metrics = run_plan(sc, rows, partitions, plan, uneven)
    # per feed: the machine's and the driver process's CPU-s; per node: (gate requests so far,
    # seconds waited at the gate so far, queue wait so far) and the TF process's CPU-s in the feed
    rates = {}
    for i, (key, rate, machine, driver, _tf) in enumerate(feeds):
        rates.setdefault(key, []).append(rate)
        print(f"  {key}: {rate:,.0f} rows/s, machine {machine:.2f} CPU-s, driver {driver:.2f}; " + ", ".join(
            f"node {n}: {m.get(f'gate_{i}')} tf {m.get(f'cpu_{i}')} CPU-s {m.get(f'faults_{i}')} page faults"
            for n, m in metrics.items()))
    return {k: sorted(v)[len(v) // 2] for k, v in rates.items()}, rates


def chunk_size(sc, args) -> None:
    """rows/s of train() into dataset(B) and batches(B) with chunks of each of ``--chunk-mb`` MiB
    (rows per chunk as the producer sizes them: a multiple of 16), alternating on one cluster,
    3 rounds; medians, the machine's and the TF processes' CPU-s per feed."""
    rounds = 3
    mbs = args.chunk_mb.split(",")
    rows_of = {mb: int(float(mb) * (1 << 20)) // ROW_BYTES // 16 * 16 for mb in mbs}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    plan = [("warm-up", 256)] + [(f"{path} {mb}", b) for _ in range(rounds) for b in sizes
                                 for path in ("dataset", "batches") for mb in mbs]
    feeds, _ = run_plan(sc, args.batch_rows, args.partitions, plan,
                        chunk_rows=lambda key: rows_of.get(key[0].split(" ")[-1]))
    runs: dict = {}
    for key, rate, machine, _driver, tf_cpu in feeds[1:]:
        runs.setdefault(key, []).append((rate, machine, tf_cpu))
    med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    print(f"  {args.batch_rows:,d} rows per feed, {rounds} rounds alternating; rows/s per run, median, and the median "
          "run's CPU-s (machine, TF processes):")
    for (name, b), v in runs.items():
        print(f"  batch {b:>5} {name + ' MiB':<16} " + " ".join(f"{r:>9,.0f}" for r, _, _ in v)
              + f"   median {med[(name, b)][0]:>9,.0f}  CPU {med[(name, b)][1]:5.2f} / {med[(name, b)][2]:5.2f}")
    for b in sizes:
        print(f"  batch {b:>5} dataset/batches: " + ", ".join(
            f"{mb} MiB {med[(f'dataset {mb}', b)][0] / med[(f'batches {mb}', b)][0]:.2f}" for mb in mbs)
              + "  (target >= 0.9); " + ", ".join(
            f"{mb} MiB / {mbs[0]} MiB: dataset {med[(f'dataset {mb}', b)][0] / med[(f'dataset {mbs[0]}', b)][0]:.2f} "
            f"batches {med[(f'batches {mb}', b)][0] / med[(f'batches {mbs[0]}', b)][0]:.2f}" for mb in mbs[1:]))


def gate_cost(sc, args) -> None:
    """What equal steps cost the feed: train() into dataset(256) and batches(256) with the gate on
    (uneven='drop', the default) and off (uneven=None), alternating on one cluster, 3 runs each."""
    rounds = 3
    plan = [("warm-up", 256)] + [(f"{path}-{mode}", 256) for _ in range(rounds) for path in ("dataset", "batches")
                                 for mode in ("gate", "none")]
    rates, _runs = tfos_by_batch(sc, args.batch_rows, args.partitions, [256], plan,
                                 uneven=lambda key: None if key[0].endswith("-none") else "drop")
    print(f"  equal steps: train() into a counting consumer at batch 256, {args.batch_rows:,d} rows, median of "
          f"{rounds} runs, rows/s:")
    for path in ("dataset", "batches"):
        on, off = rates[(f"{path}-gate", 256)], rates[(f"{path}-none", 256)]
        print(f"  {path + '()':<10} gate on {on:>10,.0f}  gate off {off:>10,.0f}  ratio on/off {on / off:5.2f}  "
              "(target: cost under 5%, ratio >= 0.95)", flush=True)


def limit_ratio(sc, args) -> None:
    """The issue's target in one run: train() into dataset(256) and into batches(256) against (a),
    the Spark job that converts the same rows to Arrow and discards them; (a) runs on the same
    executors while the tfos cluster waits between feeds. "channel": dataset(256) with every chunk
    on the channel (``shared_memory=False``, as from another host), the path before the rings.
    3 rounds, alternating; medians."""
    rounds = 3
    paths = ("dataset", "channel", "batches")
    plan = [("warm-up", 256)] + [(path, 256) for _ in range(rounds) for path in paths]
    rates: dict = {}
    cpu: dict = {}  # per run: the machine's CPU-s, the driver process's, the TF processes'

    def limit_first(key):  # (a) before each round's pair
        if key[0] == "dataset":
            m0, d0 = machine_cpu(), time.process_time()
            n, secs = arrow_limit(sc, args.rows, args.partitions)
            rates.setdefault("(a) limit", []).append(n / secs)
            cpu.setdefault("(a) limit", []).append((machine_cpu() - m0, time.process_time() - d0, 0.0))

    feeds, _ = run_plan(sc, args.rows, args.partitions, plan, before=limit_first,
                        shared_memory=lambda key: key[0] != "channel")
    for (path, _batch), rate, machine, driver, tf_cpu in feeds:
        rates.setdefault(path, []).append(rate)
        cpu.setdefault(path, []).append((machine, driver, tf_cpu))
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    print(f"  {args.rows:,d} rows per run, {rounds} rounds alternating, rows/s per run and median:")
    for k in ("(a) limit",) + paths:
        print(f"  {k:<10} " + " ".join(f"{r:>9,.0f}" for r in rates[k]) + f"   median {med[k]:>9,.0f}")
    print("  CPU-s per run, the median over rounds: machine = TF processes + driver process + the rest (executors,")
    print("  their Python workers, JVMs):")
    tf_cpu = {}
    for k in ("(a) limit",) + paths:
        mach, drv, tfp = (sorted(c[j] for c in cpu[k])[len(cpu[k]) // 2] for j in range(3))
        tf_cpu[k] = tfp * 1e6 / args.rows
        print(f"  {k:<10} machine {mach:5.2f} = TF {tfp:5.2f} + driver {drv:5.2f} + rest {mach - tfp - drv:5.2f}")
    for k in paths:
        per_round = " ".join(f"{d / a:.2f}" for d, a in zip(rates[k], rates["(a) limit"]))
        print(f"  train() into {k if k != 'channel' else 'dataset'}(256){' on the channel' if k == 'channel' else ''} "
              f"/ (a): per round {per_round}, medians {med[k] / med['(a) limit']:.2f}"
              + ("   (target >= 0.6)" if k == "dataset" else ""))
    print(f"  the TF processes' CPU-s per 1M rows into dataset(256): rings {tf_cpu['dataset']:.2f}, channel "
          f"{tf_cpu['channel']:.2f}, ratio {tf_cpu['dataset'] / tf_cpu['channel']:.2f}   (target <= 0.5)")


def encryption(sc, args) -> None:
    """What encryption costs the feed and inference, in one run: a clear cluster (encrypt=False) and
    an encrypted one (the default) up side by side on the same executors (InputMode.SPARK frees the
    slots once the nodes started), fed alternately: train() into dataset(256), then inference(),
    ``--rounds`` rounds each (which cluster goes first alternates); per-round ratios and medians."""
    from tfos import InputMode, TFCluster
    from tfos.testing import wait_for

    rounds = args.rounds
    plan = [("dataset", 256)] * (rounds + 1)  # the first feed warms up
    clusters = {}
    try:
        for name in ("clear", "encrypted"):
            clusters[name] = TFCluster.run(sc, tfos_path_counter, plan, 2, 0, input_mode=InputMode.SPARK,
                                           master_node="chief", progress=False, report_interval=0.1,
                                           encrypt=name == "encrypted")
        rdd = make_rdd(sc, args.rows, args.partitions)
        rates: dict = {}
        for i in range(rounds + 1):
            for name in (("clear", "encrypted") if i % 2 else ("encrypted", "clear")):
                cluster = clusters[name]
                t0, m0 = time.perf_counter(), machine_cpu()
                n = cluster.train(rdd, num_epochs=1)
                rate, machine = n / (time.perf_counter() - t0), machine_cpu() - m0
                assert wait_for(lambda: sum(m.get(f"rows_{i}", 0) for m in cluster.metrics().values()) == args.rows, 30)
                if i:
                    rates.setdefault(name, []).append((rate, machine))
    finally:
        for cluster in clusters.values():
            cluster.shutdown(timeout=600)
    print(f"  train() into dataset(256), {args.rows:,d} rows per feed, {rounds} rounds alternating; rows/s (machine "
          "CPU-s per 1M rows):")
    for name, runs in rates.items():
        print(f"  {name:<10} " + " ".join(f"{r:>9,.0f} ({c * 1e6 / args.rows:4.2f})" for r, c in runs)
              + f"   median {sorted(r for r, _ in runs)[len(runs) // 2]:>9,.0f}")
    ratios = [e / c for (e, _), (c, _) in zip(rates["encrypted"], rates["clear"])]
    print("  encrypted / clear per round " + " ".join(f"{x:.2f}" for x in ratios)
          + f", median {sorted(ratios)[len(ratios) // 2]:.2f}   (target >= 0.8; >= 0.9 makes encryption the default)")
    with tempfile.TemporaryDirectory() as d:
        model_path = os.path.join(d, "model.keras")
        save_model(model_path)
        rdd = make_rdd(sc, args.infer_rows, args.partitions).cache()
        rdd.count()
        infer = {}
        for i in range(rounds):
            for name in (("clear", "encrypted") if i % 2 else ("encrypted", "clear")):
                n, secs = tfos_inference(sc, rdd, model_path, encrypt=name == "encrypted")
                assert n == args.infer_rows, n
                infer.setdefault(name, []).append(n / secs)
        rdd.unpersist()
    ratios = [e / c for e, c in zip(infer["encrypted"], infer["clear"])]
    print(f"  inference(), {args.infer_rows:,d} rows, rows/s per round: clear "
          + " ".join(f"{r:,.0f}" for r in infer["clear"]) + ", encrypted " + " ".join(f"{r:,.0f}" for r in infer["encrypted"]))
    print("  inference encrypted / clear per round " + " ".join(f"{x:.2f}" for x in ratios)
          + f", median {sorted(ratios)[len(ratios) // 2]:.2f}   (target >= 0.8)")


# ---------------------------------------------------------------- (c) TensorFlowOnSpark 2.2.5
def tfos_legacy_counter(args, ctx):
    from tensorflowonspark import TFNode

    out_dir, batch = args
    feed = TFNode.DataFeed(ctx.mgr, True)
    n = 0
    while not feed.should_stop():
        n += len(feed.next_batch(batch))
    with open(os.path.join(out_dir, f"tfos-legacy-{ctx.executor_id}.txt"), "w") as f:
        f.write(str(n))


def legacy_feed(sc, rows, partitions, out_dir, batch=1024):
    from tensorflowonspark import TFCluster

    cluster = TFCluster.run(sc, tfos_legacy_counter, (out_dir, batch), 2, 0, False, TFCluster.InputMode.SPARK)
    rdd = make_rdd(sc, rows, partitions)
    t0 = time.perf_counter()
    cluster.train(rdd, num_epochs=1)
    secs = time.perf_counter() - t0
    cluster.shutdown()
    got = 0
    for name in os.listdir(out_dir):
        if name.startswith("tfos-legacy-"):
            got += int(open(os.path.join(out_dir, name)).read())
    return got, secs


# ---------------------------------------------------------------- inference
def save_model(path):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    model.save(path)


def tfos_infer_fun(model_path, ctx):
    import keras
    import numpy as np

    model = keras.saving.load_model(model_path)
    feed = ctx.get_data_feed(train_mode=False)
    for features, _labels in feed.batches(1024):
        feed.batch_results(np.argmax(model.predict_on_batch(features), axis=1))


def reference_inference(sc, rdd, model_path):
    def predict(it):
        import itertools

        import keras
        import numpy as np

        model = keras.saving.load_model(model_path)
        while True:
            rows = list(itertools.islice(it, 1024))
            if not rows:
                return
            x = np.stack([r[0] for r in rows])
            yield from np.argmax(model.predict_on_batch(x), axis=1).tolist()

    t0 = time.perf_counter()
    n = rdd.mapPartitions(predict).count()
    return n, time.perf_counter() - t0


def tfos_inference(sc, rdd, model_path, encrypt=None):
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(sc, tfos_infer_fun, model_path, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            progress=False, encrypt=encrypt)
    try:
        cluster.inference(rdd).count()  # warm-up: TF graph tracing in the nodes
        t0 = time.perf_counter()
        n = cluster.inference(rdd).count()
        secs = time.perf_counter() - t0
    finally:
        cluster.shutdown(timeout=300)
    return n, secs


def inference_runs(sc, args) -> None:
    """cluster.inference() vs the hand-written mapPartitions, args.infer_runs times in a row."""
    with tempfile.TemporaryDirectory() as d:
        model_path = os.path.join(d, "model.keras")
        save_model(model_path)
        rdd = make_rdd(sc, args.infer_rows, args.partitions).cache()
        rdd.count()
        reference_inference(sc, rdd, model_path)  # warm-up: imports TF in the Python workers
        ratios = []
        for run in range(1, args.infer_runs + 1):
            n_r, secs_r = reference_inference(sc, rdd, model_path)
            r = line(f"inference run {run}: hand-written mapPartitions", n_r, secs_r)
            n_t, secs_t = tfos_inference(sc, rdd, model_path)
            t = line(f"inference run {run}: tfos cluster.inference()", n_t, secs_t)
            assert n_t == n_r == args.infer_rows, (n_t, n_r)
            ratios.append(t / r)
        rdd.unpersist()
    print("  ratio inference tfos / mapPartitions per run: " + ", ".join(f"{x:.2f}" for x in ratios)
          + f"; minimum {min(ratios):.2f}   (target >= 0.8 in every run)")


# ---------------------------------------------------------------- DataFrames from Parquet
def write_parquet(spark, path, rows, partitions, binary):
    """Parquet of rows x (784 float32 features, long label): features array<float>, or binary."""
    import pyarrow as pa

    def gen(batches):
        for b in batches:
            ids = b.column(0).to_numpy()
            if not len(ids):
                continue
            x = np.random.default_rng(int(ids[0])).random((len(ids), 784), dtype=np.float32)
            if binary:
                feats = pa.array(list(x.view(f"V{784 * 4}").reshape(-1).tolist()), pa.binary())
            else:
                feats = pa.ListArray.from_arrays(pa.array(np.arange(0, x.size + 1, 784, dtype=np.int32)),
                                                 pa.array(x.reshape(-1)))
            yield pa.RecordBatch.from_arrays([feats, pa.array(ids % 10)], ["features", "label"])

    schema = "features binary, label long" if binary else "features array<float>, label long"
    spark.range(0, rows, 1, partitions).mapInArrow(gen, schema).write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


def arrow_count(df) -> tuple[int, float, float]:
    """The reference: a Spark job that only counts the DataFrame's Arrow batches. Returns the rows,
    the seconds and the machine's CPU-s."""
    def count(batches):
        import pyarrow as pa

        n = 0
        for b in batches:
            n += b.num_rows
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], ["rows"])

    t0, m0 = time.perf_counter(), machine_cpu()
    n = sum(r[0] for r in df.mapInArrow(count, "rows long").collect())
    return n, time.perf_counter() - t0, machine_cpu() - m0


def infer_binary_or_list(model_path):
    """mapInArrow function: the model's argmax for each row's 784 features, appended as 'prediction'."""
    def predict(batches):
        import keras
        import pyarrow as pa

        model = keras.saving.load_model(model_path)
        for b in batches:
            col = b.column(0)
            if pa.types.is_binary(col.type):
                x = np.frombuffer(b"".join(col.to_pylist()), np.float32).reshape(-1, 784)
            else:
                x = col.flatten().to_numpy().reshape(-1, 784)
            pred = np.argmax(model.predict_on_batch(x), axis=1).astype(np.int64) if len(x) else np.zeros(0, np.int64)
            yield pa.RecordBatch.from_arrays(list(b.columns) + [pa.array(pred)], b.schema.names + ["prediction"])
    return predict


def tfos_infer_df_fun(model_path, ctx):
    import keras

    model = keras.saving.load_model(model_path)
    feed = ctx.get_data_feed(train_mode=False)
    for features, _labels in feed.batches(1024):
        if features.dtype == object:  # binary rows: 784 float32 each
            features = np.frombuffer(b"".join(features), np.float32).reshape(-1, 784)
        feed.batch_results(np.argmax(model.predict_on_batch(features), axis=1).astype(np.int64))


def counted_feed(sc, data) -> tuple[int, float, float]:
    """train(data) into a consumer counting batches(1024) on a new cluster, timed on the second of
    two feeds of the same data: the first warms up what the reference's warm-up run warms (the
    Python workers' imports, the Parquet files in the page cache) and the feed's connections.
    Returns the rows, the seconds and the machine's CPU-s of the timed feed."""
    from tfos import InputMode, TFCluster

    plan = [("warm-up", 1024), ("batches", 1024)]
    cluster = TFCluster.run(sc, tfos_path_counter, plan, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            progress=False)
    try:
        cluster.train(data, num_epochs=1)
        t0, m0 = time.perf_counter(), machine_cpu()
        n = cluster.train(data, num_epochs=1)
        return n, time.perf_counter() - t0, machine_cpu() - m0
    finally:
        cluster.shutdown(timeout=600)


def dataframes(spark, args) -> None:
    from tfos import InputMode, TFCluster

    sc = spark.sparkContext
    print(f"  DataFrame feeds from Parquet ({args.df_rows:,d} rows, {args.partitions} files), rows/s (MB/s):")
    with tempfile.TemporaryDirectory() as d:
        model_path = os.path.join(d, "model.keras")
        save_model(model_path)
        for binary in (False, True):
            kind = "binary" if binary else "array<float>"
            df = write_parquet(spark, os.path.join(d, kind.replace("<", "_").replace(">", "")), args.df_rows,
                               args.partitions, binary)
            arrow_count(df)  # warm-up: the Python workers, the Parquet files in the page cache
            n_a, secs_a, cpu_a = arrow_count(df)
            a = line(f"{kind}: mapInArrow counting job", n_a, secs_a, cpu_a)
            n_b, secs_b, cpu_b = counted_feed(sc, df)
            b = line(f"{kind}: tfos train(df)", n_b, secs_b, cpu_b)
            if not binary:
                rows_rdd = df.rdd.map(lambda r: (np.asarray(r.features, np.float32), r.label))
                n_p, secs_p, cpu_p = counted_feed(sc, rows_rdd)
                p = line("tfos train(rdd) of the same Parquet rows", n_p, secs_p, cpu_p)
                n_r, secs_r, cpu_r = counted_feed(sc, make_rdd(sc, args.df_rows, args.partitions))
                r = line("tfos train(rdd) of as many generated rows", n_r, secs_r, cpu_r)
            assert n_a == n_b == args.df_rows, (n_a, n_b)
            print(f"    ratio train(df) / mapInArrow count: {b / a:5.2f}   (target >= 0.8)")
            if not binary:
                print(f"    ratio train(df) / train(df.rdd):    {b / p:5.2f}   "
                      "(target >= 0.8: the RDD path, same Parquet)")
                print(f"    ratio train(df) / train(generated rdd): {b / r:5.2f}   (no Parquet read in the RDD)")
            ref = df.mapInArrow(infer_binary_or_list(model_path), df.schema.simpleString()[:-1] + ",prediction:bigint>")
            ref.count()  # warm-up: TF in the Python workers
            t0 = time.perf_counter()
            n_h = ref.count()
            h = line(f"{kind}: inference, hand-written mapInArrow", n_h, time.perf_counter() - t0)
            cluster = TFCluster.run(sc, tfos_infer_df_fun, model_path, 2, 0, input_mode=InputMode.SPARK,
                                    master_node="chief", progress=False)
            try:
                cluster.inference(df, output_type="long").count()  # warm-up
                t0 = time.perf_counter()
                n_t = cluster.inference(df, output_type="long").count()
                t = line(f"{kind}: tfos inference(df)", n_t, time.perf_counter() - t0)
            finally:
                cluster.shutdown(timeout=300)
            assert n_h == n_t == args.df_rows, (n_h, n_t)
            print(f"    ratio inference(df) / mapInArrow model call: {t / h:5.2f}   (target >= 0.8)")


def by_batch(sc, args):
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rates, runs = tfos_by_batch(sc, args.batch_rows, args.partitions, sizes, rounds=args.batch_rounds)
    legacy = {}
    if not args.skip_legacy:
        for b in sizes:
            with tempfile.TemporaryDirectory() as d:
                n, secs = legacy_feed(sc, args.legacy_rows, args.partitions, d, batch=b)
            legacy[b] = n / secs
    print(f"  feed into main_fun by batch size ({args.batch_rows:,d} rows per tfos feed, the median of "
          f"{args.batch_rounds} alternating rounds; {args.legacy_rows:,d} for TFoS), rows/s (MB/s):")
    print(f"  {'batch':>6} {'batches()':>18} {'dataset()':>18} {'TFoS next_batch':>18} {'dataset/batches':>16} "
          f"{'dataset/TFoS':>13}")
    for b in sizes:
        bt, ds, lg = rates[("batches", b)], rates[("dataset", b)], legacy.get(b)

        def cell(r):
            return f"{r:>9,.0f} ({r * ROW_BYTES / 1e6:5.0f})" if r else f"{'-':>17}"
        print(f"  {b:>6} {cell(bt):>18} {cell(ds):>18} {cell(lg):>18} {ds / bt:>16.2f} "
              + (f"{ds / lg:>13.0f}" if lg else f"{'-':>13}"), flush=True)
    # each round's dataset() feed ran right after its batches() feed: their ratio, round by round,
    # is the least touched by the machine's drift (the medians above may come from different rounds)
    for b in sizes:
        pairs = [d / t for t, d in zip(runs[("batches", b)], runs[("dataset", b)])]
        print(f"  {b:>6} dataset/batches by round: " + " ".join(f"{r:.2f}" for r in pairs)
              + f"   median {sorted(pairs)[len(pairs) // 2]:.2f}")
    print("  targets: dataset/batches >= 0.9, dataset/TFoS >= 100")


def line(name, rows, secs, machine_cpu_s=None):
    rate = rows / secs
    cpu = f" machine {machine_cpu_s:6.2f} CPU-s ({machine_cpu_s / secs:.2f} cores)" if machine_cpu_s is not None else ""
    print(f"  {name:<44} {rows:>9,d} rows {secs:7.2f} s {rate:>10,.0f} rows/s {rate * ROW_BYTES / 1e6:8.1f} MB/s"
          + cpu, flush=True)
    return rate


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows for (a) and (b)")
    p.add_argument("--legacy-rows", type=int, default=30_000, help="rows for (c), the slow reference")
    p.add_argument("--infer-rows", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--memory-mb", type=int, default=2048)
    p.add_argument("--skip-legacy", action="store_true")
    p.add_argument("--batch-rows", type=int, default=500_000, help="rows per feed of the by-batch-size table")
    p.add_argument("--batch-sizes", default="64,256,1024")
    p.add_argument("--batch-rounds", type=int, default=3, help="rounds of the by-batch-size table (medians)")
    p.add_argument("--chunk-mb", default="4,16", help="chunk sizes of --only chunk-size, in MiB")
    p.add_argument("--rounds", type=int, default=3, help="rounds of --only encryption")
    p.add_argument("--only", choices=("all", "batch", "inference", "dataframe", "gate", "limit", "chunk-size",
                                      "encryption"),
                   default="all",
                   help="only one part: the by-batch-size table, the inference runs, the DataFrame feeds, "
                        "the equal-steps gate, train() into dataset(256) against (a), or chunk sizes")
    p.add_argument("--infer-runs", type=int, default=3, help="inference runs in a row")
    p.add_argument("--df-rows", type=int, default=100_000, help="rows of the Parquet DataFrames")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tfos.testing import local_cluster_session

    spark = local_cluster_session(2, 1, args.memory_mb, app_name="tfos-bench-feed")
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    print(f"feed benchmark: local-cluster[2,1,{args.memory_mb}], rows of 784 float32 + int label "
          f"({ROW_BYTES} bytes), {args.partitions} partitions, {os.cpu_count()} cores")
    make_rdd(sc, 1000, 2).count()  # warm the Python workers
    if args.only in ("gate", "limit", "chunk-size", "encryption"):
        {"gate": gate_cost, "limit": limit_ratio, "chunk-size": chunk_size, "encryption": encryption}[args.only](sc, args)
        spark.stop()
        return
    if args.only in ("inference", "dataframe"):
        (inference_runs(sc, args) if args.only == "inference" else dataframes(spark, args))
        spark.stop()
        return
    by_batch(sc, args)
    if args.only == "batch":
        spark.stop()
        return

    n, secs = arrow_limit(sc, args.rows, args.partitions)
    a = line("(a) limit: Spark job -> Arrow, discarded", n, secs)
    n, secs, rss, counted = tfos_feed(sc, args.rows, args.partitions)
    assert counted == n == args.rows, (counted, n)
    b = line("(b) tfos train() -> counting consumer", n, secs)
    c = None
    if not args.skip_legacy:
        with tempfile.TemporaryDirectory() as d:
            n_c, secs = legacy_feed(sc, args.legacy_rows, args.partitions, d)
        c = line("(c) tensorflowonspark 2.2.5 -> counting", n_c, secs)
    print(f"  ratio b/a (tfos / limit):      {b / a:6.2f}   (target >= 0.5)")
    if c:
        print(f"  ratio b/c (tfos / TFoS 2.2.5): {b / c:6.1f}   (target >= 50)")
    print(f"  peak RSS of the TF processes after {args.rows:,d} rows: "
          + ", ".join(f"{r:.0f} MB" for r in rss if r is not None))

    inference_runs(sc, args)
    dataframes(spark, args)
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
