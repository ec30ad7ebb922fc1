"""TFDistributor and MirroredStrategyRunner on the shared real local-cluster[2,1,1024] (2 fake GPUs
per executor, 1 per task): functions and scripts, on executors and in local mode, rank 0's return
value, a failing rank's error, GPUs from Spark's task resources, and a real MWMS training through
the runner on CPU."""

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from tfos import TFDistributor
from tfos.compat import MirroredStrategyRunner
from tfos.errors import ConfigError, NodeFailedError


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def describe(out_dir, scale):
    """Runs on every rank: what it sees, written to a file; returns a value of every kind that travels."""
    cfg = json.loads(os.environ["TF_CONFIG"])
    rank = cfg["task"]["index"]
    chain = ancestors(os.getpid())
    mine = {"tf_config": cfg, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(), "ancestors": chain,
            "under_executor": any(b"CoarseGrainedExecutorBackend" in open(f"/proc/{p}/cmdline", "rb").read()
                                  for p in chain)}
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(mine, f)
    return {"rank": rank, "weights": np.arange(6, dtype=np.float32).reshape(2, 3) * scale, "tag": b"\x00ok",
            "shape": (2, 3)}


def read_ranks(out_dir, n):
    return [json.loads(open(os.path.join(out_dir, f"rank-{r}.json")).read()) for r in range(n)]


@pytest.mark.slow
def test_function_on_executors_returns_rank_0s_value_and_tasks_get_their_gpu(spark, tmp_path):
    value = TFDistributor(num_processes=2, use_gpu=True).run(describe, str(tmp_path), 2.0)
    assert value["rank"] == 0 and value["tag"] == b"\x00ok" and value["shape"] == (2, 3)
    np.testing.assert_array_equal(value["weights"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    ranks = read_ranks(tmp_path, 2)
    assert [r["tf_config"]["task"] for r in ranks] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert list(ranks[0]["tf_config"]["cluster"]) == ["worker"] and len(ranks[0]["tf_config"]["cluster"]["worker"]) == 2
    assert all(r["cuda"] in ("0", "1") for r in ranks)  # one of its executor's 2 GPUs, from Spark's task resources
    assert all(r["under_executor"] for r in ranks)  # started by executor tasks (local-cluster's JVMs)


@pytest.mark.slow
def test_local_mode_runs_the_processes_here_without_gpus(spark, tmp_path):
    value = TFDistributor(num_processes=2, local_mode=True).run(describe, str(tmp_path), 1.0)
    assert value["rank"] == 0
    ranks = read_ranks(tmp_path, 2)
    assert all(os.getpid() in r["ancestors"] and not r["under_executor"] for r in ranks)  # children of this driver
    assert all(r["cuda"] == "" for r in ranks)  # use_gpu=False hides every GPU
    with pytest.raises(ConfigError, match="no GPU was found on the driver"):
        TFDistributor(num_processes=1, local_mode=True, use_gpu=True).run(describe, str(tmp_path), 1.0)


def fail_on_rank_1():
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        raise RuntimeError("rank 1 gives up")
    import time

    time.sleep(600)  # rank 0 would wait for its peer: tfos stops it


def returns_something_unsendable():
    return {"fine": 1, "lock": __import__("threading").Lock()}


@pytest.mark.slow
def test_a_failing_rank_and_an_unsendable_value_are_errors_naming_them(spark):
    with pytest.raises(NodeFailedError, match="rank 1 gives up") as info:
        TFDistributor(num_processes=2, stop_grace_secs=1).run(fail_on_rank_1)
    assert "node 1" in str(info.value)
    with pytest.raises(NodeFailedError, match=r"the result of rank 0\['lock'\] is a _thread.lock.*no pickle"):
        TFDistributor(num_processes=1).run(returns_something_unsendable)


SCRIPT = textwrap.dedent("""
    import json, os, sys
    cfg = json.loads(os.environ["TF_CONFIG"])
    with open(os.path.join(sys.argv[1], f"script-{cfg['task']['index']}.json"), "w") as f:
        json.dump({"argv": sys.argv[2:], "task": cfg["task"], "workers": len(cfg["cluster"]["worker"])}, f)
""")


@pytest.mark.slow
@pytest.mark.parametrize("local_mode", [False, True])
def test_script_runs_on_every_process_with_its_argv(spark, tmp_path, local_mode):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    assert TFDistributor(num_processes=2, local_mode=local_mode).run(str(script), str(out), "--epochs", 3) is None
    for r in range(2):
        seen = json.loads((out / f"script-{r}.json").read_text())
        assert seen == {"argv": ["--epochs", "3"], "task": {"type": "worker", "index": r}, "workers": 2}


def see_devices():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_runner_allocation_and_refusals(spark):
    assert MirroredStrategyRunner(num_slots=2).num_tasks == 2  # tasks of 1 GPU (spark.task.resource.gpu.amount=1)
    # the original's surface: sc and get_num_tasks(), in local mode too
    runner = MirroredStrategyRunner(num_slots=2)
    assert runner.sc is spark.sparkContext and runner.get_num_tasks() == 2
    assert MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False).get_num_tasks() == 1
    assert MirroredStrategyRunner(num_slots=3, use_gpu=False).num_tasks == 3
    with pytest.raises(ValueError, match="num_slots"):
        MirroredStrategyRunner(num_slots=0)
    with pytest.raises(ConfigError, match="spark.task.resource.fpga.amount is unset"):
        MirroredStrategyRunner(num_slots=2, gpu_resource_name="fpga")
    # local mode: train_fn runs here; the caller's CUDA_VISIBLE_DEVICES is set for it, then restored
    os.environ["CUDA_VISIBLE_DEVICES"] = "10,11"
    try:
        assert MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False,
                                      use_custom_strategy=True).run(see_devices) == ""
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "10,11"
        with pytest.raises(ValueError, match="num_slots=2 CPU slots in local mode"):
            MirroredStrategyRunner(num_slots=2, local_mode=True, use_gpu=False).run(see_devices)
        with pytest.raises(ConfigError, match="no GPU was found on the driver"):
            MirroredStrategyRunner(num_slots=1, local_mode=True).run(see_devices)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "10,11"
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]


def digits_fit(epochs, batch_size):
    """spark-tensorflow-distributor style: build and fit inside the runner's MWMS scope, with Keras 2
    (tf_keras, TF_USE_LEGACY_KERAS=1), what its programs were written for: Keras 3's model.fit has
    no multi-worker support."""
    import tensorflow as tf
    import tf_keras as keras
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.get_strategy()
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy), type(strategy)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = tf.data.Dataset.from_tensor_slices((x[:1400], y[:1400])).shuffle(1400, seed=1).batch(
        batch_size * strategy.num_replicas_in_sync).with_options(options)
    model.fit(ds, epochs=epochs, verbose=0)
    accuracy = float(np.mean(np.argmax(model.predict(x[1400:], verbose=0), axis=1) == y[1400:]))
    return {"rank": rank, "accuracy": accuracy, "replicas": strategy.num_replicas_in_sync,
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


@pytest.mark.slow
def test_runner_trains_digits_under_mwms_on_cpu_tasks(spark):
    result = MirroredStrategyRunner(num_slots=2, use_gpu=False, env={"TF_USE_LEGACY_KERAS": "1"}).run(
        digits_fit, epochs=8, batch_size=32)
    assert result["rank"] == 0 and result["replicas"] == 2 and result["cuda"] == ""
    assert result["accuracy"] >= 0.9, result


def barrier_view(tag):
    """Runs on every rank: what pyspark's BarrierTaskContext says inside a TFDistributor function."""
    from pyspark import BarrierTaskContext, TaskContext

    ctx = BarrierTaskContext.get()
    assert TaskContext.get() is ctx
    ctx.barrier()
    gathered = ctx.allGather(f"{tag}-{ctx.partitionId()}")
    again = ctx.allGather(str(len(ctx.getTaskInfos())))
    return {"gathered": gathered, "again": again, "infos": [i.address for i in ctx.getTaskInfos()],
            "gpus": [a for r in ctx.resources().values() for a in r.addresses], "partition": ctx.partitionId()}


@pytest.mark.slow
def test_barrier_task_context_in_the_function_and_a_run_from_another_thread(spark):
    """spark-tensorflow-distributor's programs call BarrierTaskContext.get() in train_fn: each rank
    gets a working one (allGather and barrier over tfos's control channel, its partition, every
    node's address, its GPUs); a run started from a thread that never made the session (a notebook's
    background cell) finds the session and returns rank 0's value; outside, pyspark is untouched."""
    import threading

    from pyspark import TaskContext

    out = {}

    def in_thread():
        try:
            out["value"] = TFDistributor(num_processes=2).run(barrier_view, "r")
        except BaseException as e:  # noqa: BLE001 (reported below)
            out["error"] = e

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(300)
    assert not t.is_alive() and "error" not in out, out.get("error")
    value = out["value"]
    assert value["gathered"] == ["r-0", "r-1"] and value["again"] == ["2", "2"]
    assert value["partition"] == 0 and len(value["infos"]) == 2 and all(":" in a for a in value["infos"])
    assert value["gpus"] == []  # use_gpu=False: the node has none
    assert TaskContext.get() is None  # the driver's pyspark was never touched
