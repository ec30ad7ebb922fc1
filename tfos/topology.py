"""The shape of a tfos cluster: input modes, roles, ranks and TF_CONFIG. Pure functions.

Shared by every process that reasons about the cluster (the driver assigns roles; the TF
process builds its ``TF_CONFIG`` and rank; backends and ``tfos.keras_dist`` order ranks).
Nothing here performs I/O; every function is tested from tables (tests/unit/test_topology.py).
"""

from __future__ import annotations

import enum
import json
from typing import Iterable, Sequence


class InputMode(enum.IntEnum):
    """How data reaches the TF processes (values match TensorFlowOnSpark's)."""

    TENSORFLOW = 0  #: each node reads its own files (e.g. from HDFS); Spark is not in the data path
    SPARK = 1  #: Spark partitions are streamed into the nodes by ``cluster.train`` / ``inference``


#: Roles that train (take part in all-reduce, get a rank), in rank order: the chief ('chief' or
#: its TF 1.x name 'master') is rank 0, then the workers. The one list every module uses.
TRAINING_JOBS = ("chief", "master", "worker")
CHIEF_JOBS = ("chief", "master")


#: The role of the reduction server's reducers (tfos.tf.reduction): no main_fun, no TF server.
REDUCER_JOB = "reducer"

#: Roles outside TensorFlow's cluster spec: the evaluator, and the reduction server's reducers
#: (:mod:`tfos.tf.reduction`), which run no TF server.
NON_MEMBERS = ("evaluator", REDUCER_JOB)

#: Roles that get no GPU, whatever the cluster's num_gpus: the reducers sum on the CPU.
CPU_ONLY_JOBS = (REDUCER_JOB,)


def assign_roles(num_executors: int, num_ps: int = 0, master_node: str | None = "chief",
                 eval_node: bool = False, num_reducers: int = 0) -> list[tuple[str, int]]:
    """Role of each of ``num_executors`` nodes, by node index: ps nodes, reducers, then the chief,
    the evaluator, then workers."""
    roles = [("ps", i) for i in range(num_ps)] + [(REDUCER_JOB, i) for i in range(num_reducers)]
    rest = num_executors - num_ps - num_reducers
    if master_node:
        roles.append((master_node, 0))
        rest -= 1
    if eval_node:
        roles.append(("evaluator", 0))
        rest -= 1
    roles.extend(("worker", i) for i in range(rest))
    return roles


def place_nodes(task_hosts: Sequence[str], roles: Sequence[tuple[str, int]]) -> list[int]:
    """Pure: the node index each barrier task runs (``task_hosts[p]``: task p's host), so that the
    reducers sit on hosts of their own where the tasks allow it.

    Reducers take whole hosts first, hosts with the fewest tasks first (ties by name), while the
    reducers left fill a host; the reducers still left share the host with the most tasks left.
    Every other node keeps its order over the tasks that remain. Without reducers task p runs
    node p."""
    reducers = [i for i, (job, _) in enumerate(roles) if job == REDUCER_JOB]
    if not reducers or len(task_hosts) != len(roles):
        return list(range(len(task_hosts)))
    by_host: dict[str, list[int]] = {}
    for p, h in enumerate(task_hosts):
        by_host.setdefault(h, []).append(p)
    chosen: list[int] = []
    left = len(reducers)
    for host in sorted(by_host, key=lambda h: (len(by_host[h]), h)):
        if 0 < len(by_host[host]) <= left:
            chosen.extend(by_host[host])
            left -= len(by_host[host])
            by_host[host] = []
    for host in sorted(by_host, key=lambda h: (-len(by_host[h]), h)):
        take = by_host[host][len(by_host[host]) - min(left, len(by_host[host])):]
        chosen.extend(take)
        left -= len(take)
    chosen_set = set(chosen)
    others = iter(i for i in range(len(roles)) if roles[i][0] != REDUCER_JOB)
    places = iter(reducers)
    return [next(places) if p in chosen_set else next(others) for p in range(len(task_hosts))]


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


#: How a TF process learns of the reducers: their number (outside a tfos cluster, set it on the
#: workers), and in a tfos node their names in errors (a JSON list: "reducer 0 (node 3 on host-b)").
ENV_REDUCERS = "TFOS_REDUCERS"
ENV_REDUCER_NAMES = "TFOS_REDUCER_NAMES"


def reducers_environment(nodes: Iterable) -> dict[str, str]:
    """Pure: the environment that tells every TF process of the cluster's reducers (registered
    NodeInfos), each named by role, node and host; nothing when there are none."""
    found = sorted((n.task_index, n.node_index, n.host) for n in nodes if n.job_name == REDUCER_JOB)
    if not found:
        return {}
    names = [f"reducer {t} (node {i} on {h})" for t, i, h in found]
    return {ENV_REDUCERS: str(len(names)), ENV_REDUCER_NAMES: json.dumps(names)}


def cluster_spec(nodes: Sequence) -> dict[str, list[str]]:
    """TF cluster spec (job -> "host:port" ordered by task index) of registered nodes (objects
    with ``job_name``, ``task_index`` and ``address``). The evaluator and reducers are not members."""
    spec: dict[str, list[tuple[int, str]]] = {}
    for n in nodes:
        if n.job_name in NON_MEMBERS:
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
