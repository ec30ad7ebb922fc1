"""The checks of ``TFCluster.reserve()``'s arguments (driver; pure, tested from tables).

Every bad argument is refused here, before any Spark job starts, with a message saying what to
change.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import uuid

from tfos import topology
from tfos.cluster.driver.options import check, seconds
from tfos.errors import ConfigError
from tfos.host.versions import local_versions
from tfos.topology import InputMode
from tfos.wire import messages as M
from tfos.wire.channel import new_secret


def validate_reserve(num_executors, num_ps, master_node, eval_node, reservation_timeout, input_mode,
                     num_gpus, max_restarts=0, num_reducers=0) -> None:
    """Pure: reject bad arguments before any Spark job starts. Messages say what to change. Each
    value on its own: :data:`tfos.cluster.driver.options.CHECKS`; here what needs several."""
    check(dict(num_reducers=num_reducers, num_ps=num_ps, master_node=master_node,
               reservation_timeout=reservation_timeout, input_mode=input_mode, num_gpus=num_gpus,
               max_restarts=max_restarts))
    if not isinstance(num_executors, int) or isinstance(num_executors, bool) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive int, got {num_executors!r}")
    if num_executors - num_ps - (1 if eval_node else 0) < 1:
        raise ConfigError(
            f"num_executors={num_executors} leaves no node to train after {num_ps} ps node(s)"
            f"{' and 1 evaluator' if eval_node else ''}; raise num_executors or lower num_ps")


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """The roles a cluster has at each size: ``num_ps`` ps nodes, ``num_reducers`` reducers, the
    ``master_node``, an evaluator if ``eval_node``, then workers (:func:`tfos.topology.assign_roles`).
    The roles at size k are the first k of those at any larger size, so a node keeps its role (and
    rank) when the cluster shrinks or grows: only the last workers come and go."""

    num_ps: int = 0
    master_node: str | None = "chief"
    eval_node: bool = False
    num_reducers: int = 0  # the reduction server's reducers, after the ps nodes

    def roles(self, size: int) -> list[tuple[str, int]]:
        return topology.assign_roles(size, self.num_ps, self.master_node, self.eval_node, self.num_reducers)

    @property
    def smallest(self) -> int:
        """The fewest nodes that leave one to train."""
        return self.num_ps + self.num_reducers + (1 if self.eval_node else 0) + 1


@dataclasses.dataclass(frozen=True)
class RestartSettings:
    """What the supervisor may do after a failure: restart up to ``max_restarts`` times,
    ``backoff`` seconds after it, with between ``min_nodes`` and ``max_nodes`` nodes
    (reserve()'s ``min_executors`` and ``num_executors``: what Spark offers then). ``size_wait``:
    how long reserve() waits for more than ``min_nodes`` slots before starting smaller;
    ``grow_interval``: how often a cluster running fewer than ``max_nodes`` asks Spark for more
    slots, to grow at rank 0's next ``ctx.checkpoint_saved()`` (None: never)."""

    max_restarts: int = 0
    backoff: float = 5.0
    min_nodes: int = 1
    max_nodes: int = 1
    size_wait: float = 15.0
    grow_interval: float | None = 60.0  # how often a smaller cluster looks for more slots (None: never)

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes


@dataclasses.dataclass(frozen=True)
class Supervision:
    """The watchdog's settings: ``stall_timeout`` (None: off) and whether hosts without private
    network namespaces are accepted without a warning (``allow_unprotected``)."""

    stall_timeout: float | None = 300.0
    allow_unprotected: bool = False


def size_range(num_executors, min_executors) -> tuple[int, int]:
    """Pure: reserve()'s size as ``(min, max)``: ``num_executors`` may be an int or a ``(min, max)``
    tuple, ``min_executors`` (None: the same as the max) the least the cluster runs with;
    ConfigError naming the argument otherwise."""
    if isinstance(num_executors, (tuple, list)):
        if len(num_executors) != 2 or min_executors is not None:
            raise ConfigError(f"num_executors as a range is (min_executors, num_executors), without min_executors=; "
                              f"got {num_executors!r}" + (f" and min_executors={min_executors!r}"
                                                          if min_executors is not None else ""))
        min_executors, num_executors = num_executors
    if not isinstance(num_executors, int) or isinstance(num_executors, bool) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive int, got {num_executors!r}")
    lo = num_executors if min_executors is None else min_executors
    if not isinstance(lo, int) or isinstance(lo, bool) or not 1 <= lo <= num_executors:
        raise ConfigError(f"min_executors must be an int from 1 to num_executors={num_executors}, got {lo!r}")
    return lo, num_executors


def size_to_start(offered: int | None, lo: int, hi: int, waited: float, size_wait: float) -> int | None:
    """Pure: how many nodes to start when Spark offers ``offered`` task slots after ``waited``
    seconds: ``hi`` as soon as it offers that many (or cannot say: None), what it offers (>= ``lo``)
    once ``size_wait`` passed, else None (wait on)."""
    if offered is None or offered >= hi:
        return hi
    if offered >= lo and waited >= size_wait:
        return offered
    return None


def cluster_config(address, roles, *, reservation_timeout, log_dir, default_fs, num_gpus=0, env=None,
                   release_port=True, preimport_tensorflow=True, heartbeat_interval=1.0, heartbeat_timeout=30.0,
                   stop_grace_secs=5.0, timeline=False, report_interval=1.0, metric_history=False,
                   checkpoint_dir=None, node_output="chief", encrypt: bool = False,
                   gpus_per_node=None, eviction_grace=30.0) -> M.ClusterConfig:
    """The new cluster's configuration from reserve()'s arguments (by keyword): a fresh id and
    secret (its channels encrypted when ``encrypt``), durations checked (:func:`seconds`),
    ``checkpoint_dir`` defaulting to ``<log_dir>/checkpoint``."""
    return M.ClusterConfig(
        cluster_id=uuid.uuid4().hex[:12], key=M.ChannelKey(new_secret(), bool(encrypt)),
        driver_host=address.advertise, driver_port=address.port,
        roles=tuple(roles), input_mode=int(InputMode.TENSORFLOW), reservation_timeout=float(reservation_timeout),
        log_dir=log_dir, default_fs=default_fs, num_gpus=num_gpus,
        env={k: str(v) for k, v in (env or {}).items()}, release_port=bool(release_port),
        preimport_tensorflow=bool(preimport_tensorflow),
        heartbeat_interval=seconds("heartbeat_interval", heartbeat_interval),
        heartbeat_timeout=seconds("heartbeat_timeout", heartbeat_timeout),
        stop_grace_secs=seconds("stop_grace_secs", stop_grace_secs, allow_zero=True),
        timeline=bool(timeline), report_interval=seconds("report_interval", report_interval),
        metric_history=bool(metric_history),
        checkpoint_dir=checkpoint_dir or log_dir.rstrip("/") + "/checkpoint", node_output=output_setting(node_output),
        versions=local_versions(), gpus_per_node=gpus_per_node_setting(gpus_per_node, len(roles)),
        eviction_grace=seconds("eviction_grace", eviction_grace, allow_zero=True))


def gpus_per_node_setting(value, num_nodes: int) -> tuple[int, ...]:
    """reserve()'s ``gpus_per_node`` (None, a count for every node, or one count per node) as the
    nodes get it: -1 for "every GPU Spark assigned", else how many of them; ConfigError otherwise."""
    if value is None:
        return ()
    counts = [value] * num_nodes if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        counts = list(counts)
    except TypeError:
        counts = None
    if (counts is None or len(counts) != num_nodes
            or any(isinstance(c, bool) or not isinstance(c, int) or c < -1 for c in counts)):
        raise ConfigError(f"gpus_per_node must be a count >= 0 (or -1: all) for every node, or a list of "
                          f"{num_nodes} such counts, got {value!r}")
    return tuple(counts)


def gpus_with_reducers(value, num_ps: int, num_reducers: int):
    """Pure: reserve()'s per-node ``gpus_per_node`` list given for the nodes other than the reducers,
    with a 0 in each reducer's place (the reducers come after the ps nodes and use no GPU); any other
    value as it is."""
    if num_reducers and isinstance(value, (list, tuple)):
        value = list(value)
        return value[:num_ps] + [0] * num_reducers + value[num_ps:]
    return value


def output_setting(value) -> str:
    """reserve()'s ``node_output`` as the nodes get it, or ConfigError naming the choices."""
    check({"node_output": value})
    return "none" if value is None else value


def check_picklable(main_fun, tf_args) -> None:
    """ConfigError, on the driver and before any Spark job, if ``main_fun`` or ``tf_args`` cannot be
    pickled to go to the executors (a SparkContext, a lock, an open file ...), naming the part that
    cannot: e.g. "args.spark (pyspark.sql.session.SparkSession)"."""
    from pyspark import cloudpickle

    for name, obj in (("main_fun", main_fun), ("args", tf_args)):
        try:
            cloudpickle.dumps(obj)
        except Exception as e:
            part = _unpicklable_part(obj, name, cloudpickle.dumps) or name
            raise ConfigError(f"{part} cannot be pickled to send it to the executors "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Pass "
                              "what it needs to build it on the executor instead (a path, a config dict), "
                              "and create SparkContexts, sessions, locks or open files inside main_fun") from None


def _unpicklable_part(obj, name: str, dumps, depth: int = 3) -> str | None:
    """The deepest named part of ``obj`` that ``dumps`` refuses (pure given ``dumps``): a function's
    closure variables and the globals it uses, a mapping's values, an object's attributes, a
    sequence's items; None if every part pickles on its own."""
    def fails(x) -> bool:
        try:
            dumps(x)
            return False
        except Exception:
            return True

    if depth == 0 or not fails(obj):
        return None
    parts: list[tuple[str, object]] = []
    code = getattr(obj, "__code__", None)
    if code is not None:
        cells = getattr(obj, "__closure__", None) or ()
        for var, cell in zip(code.co_freevars, cells):
            try:
                parts.append((f"{name}'s closure variable {var!r}", cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        module_globals = getattr(obj, "__globals__", {})
        parts += [(f"{name}'s global {g!r}", module_globals[g]) for g in code.co_names if g in module_globals]
    elif isinstance(obj, dict):
        parts = [(f"{name}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        parts = [(f"{name}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        parts = [(f"{name}.{k}", v) for k, v in vars(obj).items()]
    for part_name, part in parts:
        if fails(part):
            deeper = _unpicklable_part(part, part_name, dumps, depth - 1)
            return deeper or f"{part_name} ({type(part).__module__}.{type(part).__qualname__})"
    return f"{name} ({type(obj).__module__}.{type(obj).__qualname__})"


def require_mlflow() -> None:
    """ConfigError unless the mlflow package is installed on the driver (mlflow=True / mlflow_run=)."""
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError("mlflow=True / mlflow_run= need the mlflow package on the driver: pip install "
                          "tfos[mlflow] (or mlflow), or leave them out")
