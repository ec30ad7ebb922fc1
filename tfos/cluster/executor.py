"""Code that runs inside the Spark barrier task on each executor (the Python worker).

It prepares the node directory, hands the user's function to the node by a private local
file, and launches the node agent (tfos.cluster.agent) as a detached process. In
InputMode.TENSORFLOW the task then holds its slot until the agent exits; in InputMode.SPARK it
returns at once so the executor's slot is free for the tasks that feed data.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time

from tfos.cluster import decisions, host
from tfos.errors import TFOSError

logger = logging.getLogger(__name__)


def node_dir(cluster_id: str, node_index: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"tfos-{cluster_id}", f"node-{node_index}")


def make_bootstrap(cfg: dict, main_fun, tf_args):
    """Return the mapPartitions function of the reservation barrier stage."""

    def bootstrap(_iterator):
        from pyspark import BarrierTaskContext
        from pyspark import cloudpickle

        ctx = BarrierTaskContext.get()
        i = ctx.partitionId()
        address = ctx.getTaskInfos()[i].address
        node_host = address.rsplit(":", 1)[0] if ":" in address else address
        res = ctx.resources()
        spark_gpus = list(res["gpu"].addresses) if "gpu" in res else []
        ndir = node_dir(cfg["cluster_id"], i)
        os.makedirs(ndir, mode=0o700, exist_ok=True)
        fn_path = os.path.join(ndir, "main_fun.pkl")
        fd = os.open(fn_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            cloudpickle.dump((main_fun, tf_args), f)
        job, task_index = cfg["roles"][i]
        agent_cfg = dict(cfg, node_index=i, job_name=job, task_index=task_index, host=node_host,
                         spark_gpus=spark_gpus, node_dir=ndir, fn_path=fn_path,
                         working_dir=os.getcwd(), jvm_pid=host.jvm_ancestor(),
                         python=sys.executable, sys_path=[p for p in sys.path if p])
        proc = launch_agent(agent_cfg)
        status = wait_started(proc, timeout=cfg["reservation_timeout"], ndir=ndir)
        if cfg["input_mode"] == decisions.InputMode.TENSORFLOW:
            proc.wait()  # the agent's own watchdogs bound its life (driver heartbeat, executor JVM)
        yield json.dumps({"node_index": i, "host": node_host, "agent_pid": proc.pid, "status": status})

    return bootstrap


def launch_agent(agent_cfg: dict) -> subprocess.Popen:
    ndir = agent_cfg["node_dir"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(agent_cfg["sys_path"])
    err = open(os.path.join(ndir, "agent.err"), "ab")
    try:
        proc = subprocess.Popen(decisions.agent_command(agent_cfg["python"]), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, cwd=agent_cfg["working_dir"], env=env,
                                start_new_session=True, close_fds=True)
    finally:
        err.close()
    proc.stdin.write((json.dumps(agent_cfg) + "\n").encode())
    proc.stdin.close()
    return proc


def wait_started(proc: subprocess.Popen, timeout: float, ndir: str) -> str:
    """Read the agent's first line: ``STARTED`` or ``FAILED <reason>``."""
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            host.terminate(proc, 1.0, "node agent")
            raise TFOSError(f"node agent did not start within {timeout:.0f}s (raise reservation_timeout); "
                            f"see {ndir}/agent.log")
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    line = buf.decode("utf-8", "replace").strip()
    proc.stdout.close()
    if not line.startswith("STARTED"):
        detail = host.tail(os.path.join(ndir, "agent.err"), 20) or host.tail(os.path.join(ndir, "agent.log"), 20)
        raise TFOSError(f"node agent failed to start: {line or 'no output'}\n{detail}")
    return line
