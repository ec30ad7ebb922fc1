"""The Spark barrier task on each executor (runs in the executor's Python worker).

It creates the node directory fresh in this user's private directory (``tfos.host.private``),
hands the user's function (with the backend's node hooks) to the node by a 0600 file there, and launches the node agent (``python -m tfos.cluster.agent``) as a
detached process with its :class:`~tfos.wire.messages.NodeConfig` on stdin. In
InputMode.TENSORFLOW the task then holds its slot until the agent exits; in InputMode.SPARK it
returns at once so the executor's slot is free for the tasks that feed data.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
import tempfile

from tfos.errors import ConfigError, TFOSError
from tfos.host import private, processes
from tfos.host.deadline import Deadline
from tfos.host.versions import local_versions, version_mismatch
from tfos.topology import InputMode, place_nodes
from tfos.wire import messages as M

#: How the node agent is started: ``python -u -m tfos.cluster.agent`` (pure, tested).
AGENT_MODULE = "tfos.cluster.agent"


def agent_command(python: str) -> list[str]:
    return [python, "-u", "-m", AGENT_MODULE]


def node_dir_hint(cluster_id: str) -> str:
    """Where the nodes' directories are, for error messages (``<tmp>/tfos-<uid>/<cluster_id>/node-<i>``)."""
    return os.path.join(tempfile.gettempdir(), "tfos-<uid>", cluster_id, "node-<i>")


class Bootstrap:
    """The mapPartitions function of the reservation barrier stage.

    What Spark ships of it (the pickled closure, a broadcast block that any process reaching an
    executor's or the driver's block manager can fetch while ``spark.authenticate`` is off) holds
    no secret: the cluster's secret travels as the one value of each task's partition
    (:meth:`rows`), which reaches the executor inside the task launch message only
    (docs/security.md). ``cluster`` is the cluster's config without the secret; ``program`` is
    ``(main_fun, tf_args, node_hooks)``."""

    def __init__(self, cluster: M.ClusterConfig, program):
        self.cluster = dataclasses.replace(cluster, key=cluster.key.without_secret())
        self.program = tuple(program)
        self._secret = cluster.key.secret  # on the driver only: never pickled (__getstate__)

    def __getstate__(self):
        return {"cluster": self.cluster, "program": self.program}

    def __setstate__(self, state):
        self.__dict__.update(state, _secret="")

    def rows(self, n: int) -> list[str]:
        """The barrier stage's data: the secret, once per task (driver side)."""
        return [self._secret] * n

    def keyed(self) -> M.ClusterConfig:
        """The cluster config with its secret, for stages that never leave this process (tests, local mode)."""
        return dataclasses.replace(self.cluster, key=self.cluster.key.with_secret(self._secret))

    def __call__(self, iterator):
        from pyspark import BarrierTaskContext

        secrets = [s for s in iterator if s]
        if not secrets:
            raise ConfigError("the barrier task got no cluster secret in its partition (tfos's barrier stage "
                              "runs over one row per task)")
        cluster = dataclasses.replace(self.cluster, key=self.cluster.key.with_secret(secrets[0]))
        ctx = BarrierTaskContext.get()
        p = ctx.partitionId()
        hosts = [t.address.rsplit(":", 1)[0] if ":" in t.address else t.address for t in ctx.getTaskInfos()]
        node_host = hosts[p]
        i = place_nodes(hosts, cluster.roles)[p]  # reducers on hosts of their own where Spark allows it
        mismatch = version_mismatch(cluster.versions, local_versions(), node_host, sys.executable)
        if mismatch:  # before any node starts: a wire or import error later would say something else
            raise ConfigError(mismatch)
        res = ctx.resources()
        spark_gpus = tuple(res["gpu"].addresses) if "gpu" in res else ()
        yield from start_node(cluster, self.program, i, node_host, spark_gpus, processes.jvm_ancestor())


def make_bootstrap(cluster: M.ClusterConfig, main_fun, tf_args, node_hooks) -> Bootstrap:
    """The barrier stage's function for ``cluster`` (see :class:`Bootstrap`)."""
    return Bootstrap(cluster, (main_fun, tf_args, node_hooks))


def start_node(cluster: M.ClusterConfig, program, i: int, node_host: str, spark_gpus=(), jvm_pid=None,
               started=None):
    """Start node ``i``'s agent on this host and yield its status line: in InputMode.TENSORFLOW
    once the agent exited (the caller's slot is held meanwhile), else once it started. ``program``
    is ``(main_fun, tf_args, node_hooks)``; ``started(proc)`` is told the agent's process."""
    from pyspark import cloudpickle

    ndir = private.fresh_dir(private.private_dir(cluster.cluster_id), f"node-{i}")
    private.store_cluster_secret(cluster.cluster_id, cluster.key.secret)  # for this host's feeding tasks
    fn_path = os.path.join(ndir, "main_fun.pkl")
    private.write_private_file(fn_path, cloudpickle.dumps(tuple(program)))
    job, task_index = cluster.roles[i]
    node_cluster = cluster
    if not cluster.default_fs:  # a Spark Connect client could not ask the driver: this host's Hadoop config
        from tfos.data.fs import hadoop_default_fs

        node_cluster = dataclasses.replace(cluster, default_fs=hadoop_default_fs())
    cfg = M.NodeConfig(cluster=node_cluster, node_index=i, job_name=job, task_index=task_index, host=node_host,
                       node_dir=ndir, fn_path=fn_path, working_dir=os.getcwd(), python=sys.executable,
                       sys_path=tuple(p for p in sys.path if p), spark_gpus=tuple(spark_gpus), jvm_pid=jvm_pid)
    proc = launch_agent(cfg)
    if started is not None:
        started(proc)
    status = wait_started(proc, timeout=cluster.reservation_timeout, ndir=ndir)
    if cluster.input_mode == InputMode.TENSORFLOW:
        proc.wait()  # the agent's own watchdogs bound its life (driver heartbeat, executor JVM)
    yield f"node {i} on {node_host}: {status}"


def arrow_bootstrap(bootstrap):
    """``bootstrap`` as the function of ``mapInArrow(..., barrier=True)`` (Spark Connect, where no
    RDD exists) over a DataFrame of :meth:`Bootstrap.rows` (column ``secret``): it runs once per
    task and yields its status line."""

    def run(batches):
        import pyarrow as pa

        secrets = [s for b in batches for s in b.column("secret").to_pylist()]
        for line in bootstrap(iter(secrets)):
            yield pa.RecordBatch.from_pydict({"status": [line]}, schema=pa.schema([("status", pa.string())]))

    return run


def launch_agent(cfg: M.NodeConfig) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(cfg.sys_path)
    with open(os.path.join(cfg.node_dir, "agent.err"), "ab") as err:
        proc = subprocess.Popen(agent_command(cfg.python), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, cwd=cfg.working_dir, env=env, start_new_session=True, close_fds=True)
    proc.stdin.write(M.encode(cfg) + b"\n")
    proc.stdin.close()
    return proc


def wait_started(proc: subprocess.Popen, timeout: float, ndir: str) -> str:
    """Read the agent's first line: ``STARTED`` or ``FAILED <reason>``."""
    deadline = Deadline(timeout)
    buf = b""
    while b"\n" not in buf:
        if deadline.expired():
            processes.terminate(proc, 1.0, "node agent")
            raise TFOSError(f"node agent did not start within {timeout:.0f}s (raise reservation_timeout); "
                            f"see {ndir}/agent.log")
        ready, _, _ = select.select([proc.stdout], [], [], deadline.slice(1.0))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    line = buf.decode("utf-8", "replace").strip()
    proc.stdout.close()
    if not line.startswith("STARTED"):
        detail = processes.tail(os.path.join(ndir, "agent.err"), 20) or processes.tail(
            os.path.join(ndir, "agent.log"), 20)
        raise TFOSError(f"node agent failed to start: {line or 'no output'}\n{detail}")
    return line
