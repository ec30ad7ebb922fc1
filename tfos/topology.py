"""The shape of a tfos cluster: input modes, roles, ranks and TF_CONFIG. Pure functions.

Shared by every process that reasons about the cluster (the driver assigns roles; the TF
process builds its ``TF_CONFIG`` and rank; backends and ``tfos.keras_dist`` order ranks).
Nothing here performs I/O; every function is tested from tables (tests/unit/test_topology.py).
"""

from __future__ import annotations

import enum
from typing import Iterable, Sequence


class InputMode(enum.IntEnum):
    """How data reaches the TF processes (values match TensorFlowOnSpark's)."""

    TENSORFLOW = 0  #: each node reads its own files (e.g. from HDFS); Spark is not in the data path
    SPARK = 1  #: Spark partitions are streamed into the nodes by ``cluster.train`` / ``inference``


#: Roles that train (take part in all-reduce, get a rank), in rank order: the chief ('chief' or
#: its TF 1.x name 'master') is rank 0, then the workers. The one list every module uses.
TRAINING_JOBS = ("chief", "master", "worker")
CHIEF_JOBS = ("chief", "master")


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


def _rank_key(role: tuple[str, int]) -> tuple[int, int]:
    job, index = role
    return (0 if job in CHIEF_JOBS else 1, index)


def training_rank(job_name: str, task_index: int, roles: Iterable[tuple[str, int]]) -> int | None:
    """Rank among the training nodes (chief first, then workers); None for ps/evaluator."""
    trainers = sorted((tuple(r) for r in roles if r[0] in TRAINING_JOBS), key=_rank_key)
    try:
        return trainers.index((job_name, task_index))
    except ValueError:
        return None


def num_training_nodes(roles: Iterable[tuple[str, int]]) -> int:
    return sum(1 for job, _ in roles if job in TRAINING_JOBS)


def rank_order(nodes: Iterable, job=lambda n: n.job_name, index=lambda n: n.task_index) -> list:
    """The training nodes among ``nodes`` in rank order (chief first, then workers by index)."""
    return sorted((n for n in nodes if job(n) in TRAINING_JOBS), key=lambda n: _rank_key((job(n), index(n))))


def cluster_spec(nodes: Sequence) -> dict[str, list[str]]:
    """TF cluster spec (job -> "host:port" ordered by task index) of registered nodes (objects
    with ``job_name``, ``task_index`` and ``address``). The evaluator is not a member."""
    spec: dict[str, list[tuple[int, str]]] = {}
    for n in nodes:
        if n.job_name == "evaluator":
            continue
        spec.setdefault(n.job_name, []).append((n.task_index, n.address))
    return {job: [addr for _, addr in sorted(tasks)] for job, tasks in spec.items()}


def tf_config(nodes: Sequence, node_index: int) -> dict:
    """The TF_CONFIG of one node."""
    me = next(n for n in nodes if n.node_index == node_index)
    return {"cluster": cluster_spec(nodes), "task": {"type": me.job_name, "index": me.task_index}}


def rank_and_size(task_type: str, task_index: int, cluster: dict) -> tuple[int, int]:
    """Rank and world size of a task from a TF_CONFIG ``cluster`` dict (chief/master first)."""
    roles = [(job, i) for job, addrs in cluster.items() for i in range(len(addrs))]
    rank = training_rank(task_type, task_index, roles)
    if rank is None:
        raise ValueError(f"only {'/'.join(TRAINING_JOBS)} tasks have a rank, not {task_type!r}")
    return rank, num_training_nodes(roles)
