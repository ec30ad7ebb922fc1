"""A tfos job the YARN tests submit with spark-submit (not a test module itself).

    yarn_job.py PHASES OUT    runs each phase of PHASES (comma-separated, in order) in this one
                              application, phase P under OUT/P: one submit pays for the
                              ApplicationMaster's and the executors' start-up once.

    digits    examples/digits/digits_tf.py's main() (InputMode.TENSORFLOW): Spark writes the
              TFRecords to OUT/digits/data, checkpoints and TensorBoard logs go to
              OUT/digits/logs, the export to OUT/digits/export; it prints the test accuracy
              (submit with --py-files examples/digits/digits_tf.py).
    restart   InputMode.SPARK: 2 nodes read row ids from the feed, slowly, and checkpoint a counter
              to OUT/restart/ckpt (HDFS) every 10 batches; with max_restarts=1 the job must survive
              one lost container. At the end the driver prints which ids the final attempt's
              nodes read (RESULT ...).
    memory    InputMode.TENSORFLOW: node 1's TF process grows past its container's memory limit, so
              YARN's NodeManager kills the container; the driver prints the error the cluster
              raised between MEMORY-FAILURE-BEGIN and MEMORY-FAILURE-END, and goes on.
    forever   InputMode.TENSORFLOW: 2 nodes that run until the application is killed.

Each node writes OUT/P/started-<attempt>-<rank> once it runs, which the tests wait for.
"""

import json
import logging
import sys
import tempfile
import time
import traceback

ROWS = 6000
BATCH = 50


def _write(uri_dir, name, payload: bytes):
    from tfos import data

    fs, path = data.filesystem(uri_dir)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{name}") as f:
        f.write(payload)


def main_fun(args, ctx):
    mode, out = args
    if mode == "forever":
        _write(out, f"started-{ctx.attempt}-{ctx.rank}", b"")
        while True:
            time.sleep(1)
    if mode == "memory":
        _write(out, f"started-{ctx.attempt}-{ctx.rank}", b"")
        if ctx.rank == 1:
            import numpy as np

            hog = []
            for _ in range(64):  # 64 x 64 MiB, touched: far over the container's limit
                hog.append(np.ones(8 << 20))
                time.sleep(0.05)
        time.sleep(300)
        return
    import tensorflow as tf

    counter = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(counter=counter)
    save_dir = ctx.checkpoint_dir if ctx.is_chief else tempfile.mkdtemp(prefix="yarn-job-ckpt-")
    manager = tf.train.CheckpointManager(ckpt, save_dir, max_to_keep=2)
    if tf.train.latest_checkpoint(ctx.checkpoint_dir):
        ckpt.restore(tf.train.latest_checkpoint(ctx.checkpoint_dir))
    restored = int(counter.numpy())
    print(f"rank {ctx.rank} attempt {ctx.attempt}: restored counter {restored}", flush=True)
    _write(out, f"started-{ctx.attempt}-{ctx.rank}", b"")
    feed = ctx.get_data_feed(train_mode=True)
    ids = []
    for (batch,) in feed.batches(BATCH):
        ids.extend(int(i) for i in batch)
        counter.assign_add(len(batch))
        if len(ids) % (10 * BATCH) == 0:  # every 3 s: the staging mirror uploads files quiet for 1 s
            manager.save()
        time.sleep(0.3)  # slow enough (~20 s per node) that the test's kill lands mid-feed
    _write(out, f"ids-{ctx.attempt}-{ctx.rank}.json",
           json.dumps({"restored": restored, "ids": ids}).encode())


def digits(spark, out):
    """The example's own main() on this application's session, which it leaves running for the
    later phases."""
    import digits_tf

    digits_tf.main(["--epochs", "3", "--data-dir", f"{out}/data", "--output-dir", out,
                    "--export-dir", f"{out}/export"], spark=spark)


def restart(spark, out):
    from tfos import InputMode, TFCluster, data

    cluster = TFCluster.run(spark, main_fun, ("restart", out), 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            max_restarts=1, checkpoint_dir=f"{out}/ckpt", log_dir=f"{out}/logs")
    # small chunks: the nodes' feed queues (4 chunks each) hold 200 rows, so the feed lasts as long
    # as the nodes read, and a container lost mid-read is lost mid-feed
    cluster.train(spark.range(ROWS, numPartitions=6).rdd.map(lambda r: (r.id,)), num_epochs=1, chunk_rows=BATCH,
                  uneven=None)  # every row read: no equal-steps drop (no collective per batch here)
    cluster.shutdown(timeout=300)
    fs, path = data.filesystem(out)
    final = max(int(f.base_name.split("-")[1]) for f in fs.get_file_info(data_selector(path))
                if f.base_name.startswith("ids-"))
    ids, restored = [], []
    for rank in (0, 1):
        with fs.open_input_stream(f"{path}/ids-{final}-{rank}.json") as f:
            got = json.loads(f.read())
        ids += got["ids"]
        restored.append(got["restored"])
    print(f"RESULT attempt={final} restored={restored} rows={len(ids)} distinct={len(set(ids))} "
          f"complete={sorted(set(ids)) == list(range(ROWS))}", flush=True)


def _tensorflow_mode(spark, mode, out):
    """2 nodes running main_fun's ``mode``, which never uses TensorFlow: preimport_tensorflow=False
    spares the 2 cores two TensorFlow imports."""
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(spark, main_fun, (mode, out), 2, 0, input_mode=InputMode.TENSORFLOW,
                            master_node="chief", heartbeat_timeout=20, preimport_tensorflow=False)
    cluster.shutdown(timeout=600)


def memory(spark, out):
    try:
        _tensorflow_mode(spark, "memory", out)
    except Exception:  # what the application would die of: printed, and the next phase goes on
        print(f"MEMORY-FAILURE-BEGIN\n{traceback.format_exc()}MEMORY-FAILURE-END", flush=True)
    else:
        print("MEMORY-FAILURE-BEGIN\nno error: the cluster ended normally\nMEMORY-FAILURE-END", flush=True)


def forever(spark, out):
    _tensorflow_mode(spark, "forever", out)


PHASES = {"digits": digits, "restart": restart, "memory": memory, "forever": forever}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    phases, out = sys.argv[1].split(","), sys.argv[2]
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"tfos-yarn-{'-'.join(phases)}").getOrCreate()
    for phase in phases:
        PHASES[phase](spark, f"{out}/{phase}")
    spark.stop()


def data_selector(path):
    from pyarrow import fs as pafs

    return pafs.FileSelector(path)


if __name__ == "__main__":
    main()
