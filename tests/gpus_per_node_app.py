"""A Spark application of its own for tests/e2e/test_distributor_gpus.py (one process holds one
SparkContext): local-cluster[2,1,1024] whose executors announce 4 fake GPUs each, 2 per task, and
narrow their devices with CUDA_VISIBLE_DEVICES=10,11,12,13 (spark.executorEnv). Prints one JSON
line with what MirroredStrategyRunner and TFDistributor decided and what each node saw."""

import json
import os
import sys


def seen(out_dir):
    cfg = json.loads(os.environ["TF_CONFIG"])
    with open(os.path.join(out_dir, f"{cfg['task']['index']}.json"), "w") as f:
        json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "workers": len(cfg["cluster"]["worker"])}, f)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def collect(out_dir):
    return sorted((json.load(open(os.path.join(out_dir, f))) for f in os.listdir(out_dir)), key=lambda d: d["cuda"])


def main(out_dir):
    from tfos import TFDistributor
    from tfos.compat import MirroredStrategyRunner
    from tfos.testing import local_cluster_session

    spark = local_cluster_session(2, 1, 1024, fake_gpus_per_executor=4, app_name="tfos-gpus-per-node",
                                  conf={"spark.task.resource.gpu.amount": "2",
                                        "spark.executorEnv.CUDA_VISIBLE_DEVICES": "10,11,12,13"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = {"runner_tasks": {s: MirroredStrategyRunner(num_slots=s).num_tasks for s in (2, 3, 4, 6, 8)}}
        runner_dir, dist_dir = os.path.join(out_dir, "runner"), os.path.join(out_dir, "distributor")
        os.makedirs(runner_dir)
        os.makedirs(dist_dir)
        # 3 slots on tasks of 2 GPUs: 2 tasks, using 2 and 1 of their GPUs
        result["runner_rank0"] = MirroredStrategyRunner(num_slots=3, use_custom_strategy=True).run(seen,
                                                                                                   out_dir=runner_dir)
        result["runner"] = collect(runner_dir)
        result["distributor_rank0"] = TFDistributor(num_processes=4, use_gpu=True).run(seen, dist_dir)
        result["distributor"] = collect(dist_dir)
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
