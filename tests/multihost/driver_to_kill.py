"""A tfos driver program that feeds a slow reader forever; the fault test SIGKILLs it.

    python driver_to_kill.py spark://198.51.100.1:PORT
Prints ``FEEDING`` once both nodes read fed rows."""

import sys
import threading
import time

from hosts import DRIVER_ADDRESS


def slow_reader(args, ctx):
    import time

    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(50)
        ctx.report(rows=feed.rows_read)
        time.sleep(0.02)


def main(master: str) -> None:
    import os

    from pyspark.sql import SparkSession

    from tfos import InputMode, TFCluster

    spark = (SparkSession.builder.master(master).appName("tfos-driver-to-kill")
             .config("spark.driver.host", DRIVER_ADDRESS).config("spark.driver.bindAddress", DRIVER_ADDRESS)
             .config("spark.executor.cores", "1").config("spark.executor.memory", "1g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)).getOrCreate())
    sc = spark.sparkContext
    tracker = sc._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) - 1 < 2:
        time.sleep(0.2)
    cluster = TFCluster.run(sc, slow_reader, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            heartbeat_interval=1.0, heartbeat_timeout=10.0, stop_grace_secs=2.0)
    threading.Thread(target=cluster.train, args=(sc.parallelize(range(10_000_000), 4),), daemon=True).start()
    while not (len(cluster.metrics()) == 2 and all(m.get("rows", 0) >= 200 for m in cluster.metrics().values())):
        time.sleep(0.2)
    print("FEEDING", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
