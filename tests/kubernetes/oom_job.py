"""A tfos job for the OOM test (client mode on the test Kubernetes): node 0's TF process touches
more memory than its executor pod's limit (spark.executor.memory + spark.executor.memoryOverhead),
so the kernel's OOM killer ends it. The driver writes the error it raised to OUT/error.txt.

    spark-submit ... oom_job.py OUT
"""

import os
import sys


def grow(_args, ctx):
    import time

    import numpy as np

    if ctx.node_index == 0:
        blocks = []
        for _ in range(64):  # 64 x 64 MiB, touched: past a 2 GiB limit
            blocks.append(np.ones(64 << 20, dtype=np.uint8))
    time.sleep(120)  # the other node waits; the driver ends it when node 0 fails


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    from tfos import InputMode, TFCluster

    out = sys.argv[1]
    spark = SparkSession.builder.appName("tfos-oom").getOrCreate()
    try:
        TFCluster.run(spark.sparkContext, grow, None, 2, 0, input_mode=InputMode.TENSORFLOW,
                      master_node=None).shutdown(timeout=300)
        message = "no error"
    except Exception as e:  # noqa: BLE001 (the test reads what the user would see)
        message = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, "error.txt"), "w") as f:
        f.write(message)
    spark.stop()
