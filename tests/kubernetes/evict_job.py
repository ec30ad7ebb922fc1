"""A tfos job for the pod-deletion test (client mode on the test Kubernetes): 2 MWMS nodes run
tests/restart_programs.evictable_steps (ctx.should_checkpoint after each step, a checkpoint every
``every`` steps) with min_executors=1, so that a deleted executor pod's node is evicted through its
preStop hook and the cluster goes on, then grows back when Spark replaces the pod. The driver
writes what happened to OUT/driver.json.

    spark-submit ... evict_job.py OUT STEPS
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import restart_programs
    from tfos import InputMode, TFCluster

    cloudpickle.register_pickle_by_value(restart_programs)  # the image has tfos, not tfos's tests
    out, steps = sys.argv[1], int(sys.argv[2])
    spark = SparkSession.builder.appName("tfos-evict").getOrCreate()
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
        spark.stop()
