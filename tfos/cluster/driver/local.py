"""``local_mode``: a tfos cluster whose nodes run on the driver's own host, without Spark tasks
(TFDistributor and MirroredStrategyRunner with ``local_mode=True``: a notebook whose driver has the
GPUs). Runs on the driver.

:class:`LocalHost` is a Spark entry point (as :mod:`tfos.cluster.driver.spark` defines them) whose
barrier stage starts each node's agent here, exactly as a barrier task starts it on an executor
(:func:`tfos.cluster.executor.bootstrap.start_node`): the same agent, TF process, channels,
watchdogs and failure reports. The Spark session it wraps answers for the configuration (its
encryption settings, the default filesystem). Cancelling the stage terminates the agents, which
stop their TF processes and everything those started.
"""

from __future__ import annotations

import logging
import threading

from tfos.errors import TFOSError
from tfos.host import processes

logger = logging.getLogger(__name__)


class LocalHost:
    """Nodes as children of this process; ``gpus[i]`` the GPU addresses node ``i`` gets (as Spark's
    task resources would be), ``()`` for none."""

    connect = False
    master = "local"

    def __init__(self, spark, gpus: list[tuple[str, ...]] | None = None):
        from tfos.cluster.driver.spark import spark_entry

        self.spark = spark_entry(spark)
        self.gpus = gpus or []
        self._lock = threading.Lock()
        self._agents: dict[str, list] = {}  # job group -> the agents its stage started
        self._cancelled: set[str] = set()
        self._groups: dict[int, str] = {}  # thread id -> job group

    def conf(self) -> dict:
        return self.spark.conf()

    def wait_for_slots(self, num_executors: int, timeout: float) -> int:
        return num_executors  # no Spark slot is taken

    def slots_offered(self) -> int | None:
        return None  # no Spark slot is taken: every node starts here

    def default_fs(self) -> str:
        return self.spark.default_fs()

    def control_address(self, environ: dict):
        from tfos.cluster.driver.spark import ControlAddress

        return ControlAddress("127.0.0.1", "127.0.0.1", 0, "local_mode")

    def enter_job(self, group: str, description: str) -> None:
        with self._lock:
            self._groups[threading.get_ident()] = group

    def lend_secret(self, secret: str) -> None:
        self.spark.lend_secret(secret)  # the feeding jobs are the real Spark's

    def cancel_job(self, group: str) -> None:
        with self._lock:
            self._cancelled.add(group)
            agents = list(self._agents.get(group, ()))
        for proc in agents:
            processes.terminate(proc, 10.0, "node agent")

    def quiet_console(self) -> None:
        pass

    def removed_executors(self) -> list:
        return []

    def repeat(self, rdd, times: int):
        return self.spark.repeat(rdd, times)

    def parse_type(self, ddl: str):
        return self.spark.parse_type(ddl)

    def barrier_stage(self, n: int, bootstrap):
        from tfos.cluster.executor.bootstrap import start_node

        cluster, program = bootstrap.keyed(), bootstrap.program
        host = "127.0.0.1"  # the nodes reach each other and the driver on this host's loopback

        def action():
            with self._lock:
                group = self._groups.get(threading.get_ident(), "")
                self._agents[group] = []
            lines: list = [None] * n
            errors: list = []

            def started(proc):
                with self._lock:
                    self._agents[group].append(proc)
                    stopped = group in self._cancelled or bool(errors)
                if stopped:
                    processes.terminate(proc, 10.0, "node agent")

            def task(i):
                try:
                    gpus = self.gpus[i] if i < len(self.gpus) else ()
                    lines[i] = next(start_node(cluster, program, i, host, gpus, None, started))
                except BaseException as e:  # the stage fails at once with this error, as Spark's barrier stage does
                    with self._lock:
                        errors.append(e)
                        agents = list(self._agents.get(group, ()))
                    for proc in agents:  # the other tasks' agents end, so their threads return now
                        processes.terminate(proc, 10.0, "node agent")

            threads = [threading.Thread(target=task, args=(i,), name=f"tfos-local-node-{i}", daemon=True)
                       for i in range(n)]
            for t in threads:
                t.start()
            ok = False
            try:
                for t in threads:
                    t.join()
                ok = not errors
            finally:
                if not ok:  # the stage failed or was interrupted: no agent outlives it
                    with self._lock:
                        agents = list(self._agents.get(group, ()))
                    for proc in agents:
                        processes.terminate(proc, 10.0, "node agent")
            with self._lock:
                cancelled = group in self._cancelled
            if cancelled:
                raise TFOSError("the local nodes were stopped (the cluster was cancelled)")
            if errors:
                raise errors[0]
            return lines

        return action
