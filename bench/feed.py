"""Feed and inference throughput of tfos vs. its references, in ONE run on local-cluster[2,1,MEM].

Rows: 784 float32 features + an int label (MNIST-shaped), generated on the executors.

  (a) limit   the same Spark job converting the same partitions to Arrow and discarding them
  (b) tfos    cluster.train() into a main_fun that only counts rows (feed.batches)
  (c) TFoS    tensorflowonspark 2.2.5 cluster.train() into a counting TFNode.DataFeed consumer
  inference   tfos cluster.inference() vs a hand-written mapPartitions that loads the model once
              per partition and predicts in batches

Prints rows/s, MB/s and the ratios b/c and b/a, and the peak RSS of the TF processes.
Run:  bash scripts/bench.sh feed [--rows N] [--tfos-rows N] [--infer-rows N]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np

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
    from tfos.executor.feeding import rows_to_chunks

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
                            progress=False)
    rdd = make_rdd(sc, rows, partitions)
    t0 = time.perf_counter()
    total = cluster.train(rdd, num_epochs=1)
    secs = time.perf_counter() - t0
    cluster.shutdown(timeout=600)
    m = cluster.metrics()
    return total, secs, [m[i].get("peak_rss_mb") for i in sorted(m)], sum(m[i].get("rows", 0) for i in m)


# ---------------------------------------------------------------- (c) TensorFlowOnSpark 2.2.5
def tfos_legacy_counter(args, ctx):
    from tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, True)
    n = 0
    while not feed.should_stop():
        n += len(feed.next_batch(1024))
    with open(os.path.join(args, f"tfos-legacy-{ctx.executor_id}.txt"), "w") as f:
        f.write(str(n))


def legacy_feed(sc, rows, partitions, out_dir):
    from tensorflowonspark import TFCluster

    cluster = TFCluster.run(sc, tfos_legacy_counter, out_dir, 2, 0, False, TFCluster.InputMode.SPARK)
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


def tfos_inference(sc, rdd, model_path):
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(sc, tfos_infer_fun, model_path, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            progress=False)
    try:
        cluster.inference(rdd).count()  # warm-up: TF graph tracing in the nodes
        t0 = time.perf_counter()
        n = cluster.inference(rdd).count()
        secs = time.perf_counter() - t0
    finally:
        cluster.shutdown(timeout=300)
    return n, secs


def line(name, rows, secs):
    rate = rows / secs
    print(f"  {name:<44} {rows:>9,d} rows {secs:7.2f} s {rate:>10,.0f} rows/s {rate * ROW_BYTES / 1e6:8.1f} MB/s",
          flush=True)
    return rate


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows for (a) and (b)")
    p.add_argument("--legacy-rows", type=int, default=30_000, help="rows for (c), the slow reference")
    p.add_argument("--infer-rows", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--memory-mb", type=int, default=2048)
    p.add_argument("--skip-legacy", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from tfos.testing import local_cluster_session

    spark = local_cluster_session(2, 1, args.memory_mb, app_name="tfos-bench-feed")
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    print(f"feed benchmark: local-cluster[2,1,{args.memory_mb}], rows of 784 float32 + int label "
          f"({ROW_BYTES} bytes), {args.partitions} partitions, {os.cpu_count()} cores")
    make_rdd(sc, 1000, 2).count()  # warm the Python workers

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

    with tempfile.TemporaryDirectory() as d:
        model_path = os.path.join(d, "model.keras")
        save_model(model_path)
        rdd = make_rdd(sc, args.infer_rows, args.partitions).cache()
        rdd.count()
        reference_inference(sc, rdd, model_path)  # warm-up: imports TF in the Python workers
        n_r, secs_r = reference_inference(sc, rdd, model_path)
        r = line("inference: hand-written mapPartitions", n_r, secs_r)
        n_t, secs_t = tfos_inference(sc, rdd, model_path)
        t = line("inference: tfos cluster.inference()", n_t, secs_t)
        print(f"  ratio inference tfos / mapPartitions: {t / r:5.2f}   (target >= 0.8)")
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
