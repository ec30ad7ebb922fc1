"""Pure decision functions: roles, TF_CONFIG, GPU choice, paths, command lines.

Nothing here performs I/O; every function is tested from tables in tests/test_decisions.py.
"""

from __future__ import annotations

import enum
import posixpath
from typing import Iterable, Sequence

from tfos.errors import ConfigError


class InputMode(enum.IntEnum):
    """How data reaches the TF processes (values match TensorFlowOnSpark's)."""

    TENSORFLOW = 0  #: each node reads its own files (e.g. from HDFS); Spark is not in the data path
    SPARK = 1  #: Spark partitions are streamed into the nodes by ``cluster.train`` / ``inference``


TRAINING_JOBS = ("chief", "master", "worker")


def validate_reserve(num_executors, num_ps, master_node, eval_node, reservation_timeout,
                     input_mode) -> None:
    """Reject bad arguments before any Spark job starts. Messages say what to change."""
    if not isinstance(num_executors, int) or isinstance(num_executors, bool) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive int, got {num_executors!r}")
    if not isinstance(num_ps, int) or isinstance(num_ps, bool) or num_ps < 0:
        raise ConfigError(f"num_ps must be an int >= 0, got {num_ps!r}")
    training = num_executors - num_ps - (1 if eval_node else 0)
    if training < 1:
        raise ConfigError(
            f"num_executors={num_executors} leaves no node to train after {num_ps} ps node(s)"
            f"{' and 1 evaluator' if eval_node else ''}; raise num_executors or lower num_ps")
    if master_node is not None and master_node not in ("chief", "master"):
        raise ConfigError(f"master_node must be 'chief', 'master' or None, got {master_node!r}")
    if not (isinstance(reservation_timeout, (int, float)) and reservation_timeout > 0):
        raise ConfigError(f"reservation_timeout must be a positive number of seconds, got {reservation_timeout!r}")
    try:
        InputMode(input_mode)
    except ValueError:
        raise ConfigError(f"input_mode must be InputMode.TENSORFLOW or InputMode.SPARK, got {input_mode!r}") from None


def assign_roles(num_executors: int, num_ps: int = 0, master_node: str | None = "chief",
                 eval_node: bool = False) -> list[tuple[str, int]]:
    """Role of each node, by node index: ps nodes, then the chief, the evaluator, then workers."""
    roles = [("ps", i) for i in range(num_ps)]
    rest = num_executors - num_ps
    if master_node:
        roles.append((master_node, 0))
        rest -= 1
    if eval_node:
        roles.append(("evaluator", 0))
        rest -= 1
    roles.extend(("worker", i) for i in range(rest))
    return roles


def cluster_spec(nodes: Sequence[dict]) -> dict[str, list[str]]:
    """TF cluster spec (job -> addresses ordered by task index). The evaluator is not a member."""
    spec: dict[str, list[tuple[int, str]]] = {}
    for n in nodes:
        if n["job_name"] == "evaluator":
            continue
        spec.setdefault(n["job_name"], []).append((n["task_index"], f"{n['host']}:{n['tf_port']}"))
    return {job: [addr for _, addr in sorted(tasks)] for job, tasks in spec.items()}


def tf_config(nodes: Sequence[dict], node_index: int) -> dict:
    """The TF_CONFIG of one node."""
    me = next(n for n in nodes if n["node_index"] == node_index)
    return {"cluster": cluster_spec(nodes), "task": {"type": me["job_name"], "index": me["task_index"]}}


def training_rank(job_name: str, task_index: int, roles: Sequence[tuple[str, int]]) -> int | None:
    """Rank among the training nodes (chief first, then workers); None for ps/evaluator."""
    trainers = [r for r in roles if r[0] in TRAINING_JOBS]
    trainers.sort(key=lambda r: (TRAINING_JOBS.index(r[0]) if r[0] != "master" else 0, r[1]))
    try:
        return trainers.index((job_name, task_index))
    except ValueError:
        return None


def num_training_nodes(roles: Iterable[tuple[str, int]]) -> int:
    return sum(1 for job, _ in roles if job in TRAINING_JOBS)


# --------------------------------------------------------------------------- GPUs

def parse_nvidia_smi(output: str) -> list[tuple[str, int, int]]:
    """Parse ``nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits``.

    Returns ``[(index, memory_used_mib, utilization_pct)]``; unparsable lines are skipped.
    """
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            gpus.append((parts[0], int(float(parts[1])), int(float(parts[2]))))
        except ValueError:
            continue
    return gpus


def choose_gpus(num_gpus: int, spark_addresses: Sequence[str] | None,
                smi: Sequence[tuple[str, int, int]], claimed: Iterable[str],
                busy_memory_mib: int = 512) -> list[str]:
    """Pick GPU ids for one node.

    Spark's resource scheduling wins when it assigned GPUs to the task. Otherwise take the
    ``num_gpus`` least-used GPUs reported by nvidia-smi that no other tfos node on this host
    has claimed and that are not visibly busy. Raises ConfigError when too few are free.
    """
    if spark_addresses:
        return list(spark_addresses)
    if num_gpus <= 0:
        return []
    if not smi:
        raise ConfigError(f"{num_gpus} GPU(s) requested but no GPU was found on this host "
                          "(nvidia-smi missing or reported none); set num_gpus=0 or run on GPU executors")
    claimed = set(claimed)
    free = [g for g in smi if g[0] not in claimed and g[1] < busy_memory_mib]
    free.sort(key=lambda g: (g[1], g[2], int(g[0]) if g[0].isdigit() else 0))
    if len(free) < num_gpus:
        raise ConfigError(f"{num_gpus} GPU(s) requested but only {len(free)} of {len(smi)} are free on this host "
                          f"(claimed by other tfos nodes: {sorted(claimed) or 'none'}); lower num_gpus or "
                          "give Spark GPU resources (spark.executor.resource.gpu.amount)")
    return sorted((g[0] for g in free[:num_gpus]), key=lambda s: (len(s), s))


def gpu_environment(gpus: Sequence[str]) -> dict[str, str]:
    """Environment pinning the TF process to ``gpus`` (empty list: hide all GPUs)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


# --------------------------------------------------------------------------- ports

def port_candidates(ephemeral: tuple[int, int], taken: Iterable[int], count: int = 64,
                    seed: int = 0) -> list[int]:
    """Ports for TF servers: outside the kernel's ephemeral range (so no outgoing connection is
    ever auto-assigned one) and not reserved by another tfos node on this host."""
    lo, hi = ephemeral
    taken = set(taken)
    if lo > 20000:
        pool_lo, pool_hi = 20000, lo - 1
    elif hi < 65000:
        pool_lo, pool_hi = hi + 1, 65535
    else:
        pool_lo, pool_hi = 1024, max(1024, lo - 1)
    size = pool_hi - pool_lo + 1
    out = []
    i = 0
    while len(out) < count and i < size:
        port = pool_lo + (seed + i * 7919) % size
        if port not in taken and port not in out:
            out.append(port)
        i += 1
    return out


# --------------------------------------------------------------------------- paths

def absolute_path(path: str, default_fs: str, working_dir: str, user: str = "") -> str:
    """Resolve ``path`` as TensorFlowOnSpark did: URIs stay as they are; on a local default
    filesystem relative paths are relative to ``working_dir``; on a distributed one (hdfs://,
    viewfs://, ...) absolute paths go on it and relative ones under ``/user/<user>``."""
    if "://" in path:
        return path
    fs = (default_fs or "file:///").rstrip("/")
    if fs.startswith("file:"):
        full = path if path.startswith("/") else posixpath.join(working_dir, path)
        return "file://" + posixpath.normpath(full)
    if path.startswith("/"):
        return fs + posixpath.normpath(path)
    return fs + posixpath.normpath(posixpath.join("/user", user or "", path))


# --------------------------------------------------------------------------- processes

def tf_process_command(python: str) -> list[str]:
    return [python, "-u", "-m", "tfos.cluster.tf_node"]


def agent_command(python: str) -> list[str]:
    return [python, "-u", "-m", "tfos.cluster.agent"]
