"""The Spark task of :func:`tfos.cluster.driver.tfparallel.run` (TensorFlowOnSpark's ``TFParallel``).

Each task runs the user's function once, in the executor's Python worker, as an independent
single-node TensorFlow instance: no TF cluster, no node agent. The task pins its GPUs (Spark's
task resources, else ``num_gpus`` free GPUs from nvidia-smi when ``tf_args.num_gpus`` asks for
them, else none) before calling the function, and reports an exception as a result record rather
than raising, so the driver can name the instance, host and traceback of every failure.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import traceback

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ParallelContext:
    """The ``ctx`` of a TFParallel instance (TensorFlowOnSpark's TFNodeContext fields that apply)."""

    executor_id: int
    worker_num: int
    num_workers: int
    defaultFS: str  # noqa: N815 (TensorFlowOnSpark's name)
    working_dir: str
    nodes: list
    gpus: list
    job_name: str = "worker"

    @property
    def task_index(self) -> int:
        return self.worker_num

    def absolute_path(self, path: str) -> str:
        import getpass

        from tfos.data.paths import absolute_path

        return absolute_path(path, self.defaultFS, self.working_dir, getpass.getuser())


@dataclasses.dataclass
class InstanceResult:
    """What one task reports to the driver: ``error`` is empty when map_fun returned."""

    index: int
    host: str
    error: str = ""
    traceback: str = ""


def requested_gpus(tf_args, gpus_present: bool) -> int:
    """Pure: GPUs for a single-node instance, as TensorFlowOnSpark decided: ``tf_args.num_gpus``
    (or ``tf_args['num_gpus']``) when given, else one if the host has GPUs, else none."""
    value = tf_args.get("num_gpus") if isinstance(tf_args, dict) else getattr(tf_args, "num_gpus", None)
    if value is None:
        return 1 if gpus_present else 0
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def make_task(map_fun, tf_args, num_executors: int, default_fs: str, use_barrier: bool):
    def task(index, _iterator):
        from pyspark import BarrierTaskContext, TaskContext

        from tfos.host.gpus import gpu_environment, gpus_present, pick_gpus, release_gpus
        from tfos.data.paths import context_default_fs

        if use_barrier:
            bctx = BarrierTaskContext.get()
            nodes = [t.address for t in bctx.getTaskInfos()]
            host = nodes[index].rsplit(":", 1)[0]
        else:
            nodes, host = [], socket.gethostname()
        saved = {k: os.environ.get(k) for k in gpu_environment([])}
        try:
            res = TaskContext.get().resources()
            spark_gpus = tuple(res["gpu"].addresses) if "gpu" in res else ()
            gpus = pick_gpus(0 if spark_gpus else requested_gpus(tf_args, gpus_present()), spark_gpus)
            env = gpu_environment(gpus)
            if "tensorflow" in sys.modules and os.environ.get("CUDA_VISIBLE_DEVICES") != env["CUDA_VISIBLE_DEVICES"]:
                logger.warning("TensorFlow is already loaded in this Python worker: its GPUs cannot change to %s", gpus)
            os.environ.update(env)
            ctx = ParallelContext(executor_id=index, worker_num=index, num_workers=len(nodes) or num_executors,
                                  defaultFS=context_default_fs(default_fs), working_dir=os.getcwd(),
                                  nodes=nodes, gpus=gpus)
            map_fun(tf_args, ctx)
            return [InstanceResult(index, host)]
        except Exception as e:  # reported to the driver with this instance's index and host
            return [InstanceResult(index, host, f"{type(e).__name__}: {e}", traceback.format_exc())]
        finally:  # the Python worker may run other tasks next: leave its environment and claims as they were
            release_gpus()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return task
