"""A tfos job for the outsider test (client mode on the test Kubernetes): 2 workers start MWMS
(TF servers up, the tunnels serving), write where everything listens, and hold until told to end.

    spark-submit ... hold_job.py OUT_DIR
"""

import json
import os
import sys
import time


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


def main_fun(out_dir, ctx):
    import tensorflow as tf

    strategy = ctx.strategy()  # the TF server and the collectives' group
    with strategy.scope():
        v = tf.Variable(1.0)
    total = strategy.reduce("SUM", strategy.run(lambda: v * 1.0), axis=None)  # traffic through the tunnels
    me = {"rank": ctx.rank, "nodes": ctx.nodes, "spec": [n.address for n in ctx.spec_nodes],
          "listeners": listeners(), "sum": float(total), "pod_ip": os.environ.get("SPARK_EXECUTOR_POD_IP")}
    with open(os.path.join(out_dir, f"node-{ctx.rank}.json"), "w") as f:
        json.dump(me, f)
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(out_dir, "done")) and time.monotonic() < deadline:
        time.sleep(0.5)
    ctx.all_gather("end", 0)


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    from tfos import InputMode, TFCluster

    out = sys.argv[1]
    spark = SparkSession.builder.appName("tfos-hold").getOrCreate()
    cluster = TFCluster.run(spark.sparkContext, main_fun, out, 2, 0, input_mode=InputMode.TENSORFLOW,
                            master_node=None)
    cluster.shutdown()
    spark.stop()
