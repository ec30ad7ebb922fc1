"""``TFCluster.reserve()``'s settings as grouped objects, and the one table that checks them
(driver; pure, tested from tables).

``reserve()`` takes its 39 settings as keywords (TensorFlowOnSpark's way, kept) or in five frozen
groups, in the shape of Ray Train's ScalingConfig/RunConfig::

    TFCluster.reserve(sc, scaling=ScalingConfig(num_executors=4, min_executors=2),
                      failures=FailureConfig(max_restarts=3, checkpoint_dir="hdfs:///ckpt"),
                      run=RunConfig(log_dir="hdfs:///logs", mlflow=True))

Every field of a group is the reserve() keyword of the same name, with the same default
(:func:`keywords` is the one mapping; a test holds the defaults equal). A setting given both ways
must agree. :data:`CHECKS` checks each value on its own, before any Spark job starts, with a
message that names the setting; checks that need several settings (a size range, roles, GPU lists)
stay in :mod:`tfos.cluster.driver.settings`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tfos import topology
from tfos.errors import ConfigError
from tfos.topology import InputMode


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """How many nodes, of which roles, on which slots (docs/elastic.md for the range)."""

    num_executors: Any = None  # an int, or (min_executors, num_executors)
    num_ps: int = 0
    min_executors: int | None = None
    master_node: str | None = "chief"
    eval_node: bool = False
    num_reducers: int = 0
    num_gpus: int = 0
    gpus_per_node: Any = None
    size_wait: float = 15.0
    grow_interval: float | None = 60.0
    reservation_timeout: float = 600


@dataclasses.dataclass(frozen=True)
class FailureConfig:
    """What a failure, a silence, a stall or an eviction does (docs/design.md §5)."""

    max_restarts: int = 0
    restart_backoff: float = 5.0
    checkpoint_dir: str | None = None
    eviction_grace: float = 30.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 30.0
    stop_grace_secs: float = 5.0
    stall_timeout: float | None = 300


@dataclasses.dataclass(frozen=True)
class SecurityConfig:
    """Encryption of every channel (docs/security.md)."""

    encrypt: bool | None = None
    allow_unprotected: bool = False


@dataclasses.dataclass(frozen=True)
class DistributionConfig:
    """How the nodes train together and get their data."""

    backend: Any = None
    transport: str = "grpc"
    backend_options: dict | None = None
    input_mode: Any = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The TF processes' environment, logs and what the driver shows and records."""

    log_dir: str | None = None
    env: dict | None = None
    release_port: bool = True
    preimport_tensorflow: bool = True
    node_output: str | None = "chief"
    progress: bool = True
    timeline: str | None = None
    report_interval: float = 1.0
    tensorboard: bool = False
    tensorboard_host: str | None = None
    tensorboard_port: int = 0
    mlflow: bool = False
    mlflow_run: Any = None
    mlflow_experiment: str | None = None


#: reserve()'s group keywords and their types
GROUPS: dict[str, type] = {"scaling": ScalingConfig, "failures": FailureConfig, "security": SecurityConfig,
                           "distribution": DistributionConfig, "run": RunConfig}


def keywords(groups: dict[str, Any], given: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Pure: reserve()'s keywords from ``groups`` (group keyword -> its object or None) over
    ``given`` (the keywords as passed, every one of them) whose ``defaults`` are reserve()'s.
    A field of a group replaces the keyword's default; a keyword also set to another value is a
    ConfigError naming both."""
    out = dict(given)
    for group, value in groups.items():
        if value is None:
            continue
        kind = GROUPS[group]
        if not isinstance(value, kind):
            raise ConfigError(f"{group} must be a tfos.{kind.__name__}, got {type(value).__name__}")
        for field in dataclasses.fields(kind):
            mine = getattr(value, field.name)
            if mine == field.default:
                continue  # left as it is: a keyword may set it
            if given[field.name] != defaults[field.name] and given[field.name] != mine:
                raise ConfigError(f"{field.name} is given twice, as {field.name}={given[field.name]!r} and in "
                                  f"{group}={kind.__name__}(..., {field.name}={mine!r}): give it once")
            out[field.name] = mine
    return out


# ----------------------------------------------------------------------------- the checks, one table
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(least: int, what: str) -> Callable[[str, Any], None]:
    def check(name: str, value) -> None:
        if not _is_int(value) or value < least:
            raise ConfigError(f"{name} must be {what}, got {value!r}")
    return check


def _secs(allow_zero: bool = False, optional: bool = False, none_means: str = "") -> Callable[[str, Any], None]:
    def check(name: str, value) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number of seconds"
                              f"{none_means}, got {value!r}")
    return check


def _one_of(choices: tuple, said: str) -> Callable[[str, Any], None]:
    def check(name: str, value) -> None:
        if not any(value is c if c is None or isinstance(c, bool) else (isinstance(value, str) and value == c)
                   for c in choices):
            raise ConfigError(f"{name} must be {said}, got {value!r}")
    return check


def _input_mode(name: str, value) -> None:
    if value is None:  # reserve(): the default, InputMode.TENSORFLOW
        return
    try:
        InputMode(value)
    except ValueError:
        raise ConfigError(f"{name} must be InputMode.TENSORFLOW or InputMode.SPARK, got {value!r}") from None


#: reserve(node_output=...): whose printed lines reach the driver's console
NODE_OUTPUT = ("chief", "all", "none")

#: every setting checked on its own: name -> check(name, value) (ConfigError naming the setting)
CHECKS: dict[str, Callable[[str, Any], None]] = {
    "num_ps": _count(0, "an int >= 0"),
    "num_reducers": _count(0, "an int >= 0"),
    "num_gpus": _count(0, "an int >= 0"),
    "max_restarts": _count(0, "an int >= 0 (0: a node failure ends the run)"),
    "tensorboard_port": _count(0, "an int >= 0 (0: any free port)"),
    "master_node": _one_of(topology.CHIEF_JOBS + (None,), "'chief', 'master' or None"),
    "node_output": _one_of(NODE_OUTPUT + (None,), "'chief' (rank 0's lines), 'all' or None"),
    "encrypt": _one_of((True, False, None), "True, False or None (the default: on)"),
    "input_mode": _input_mode,
    "reservation_timeout": _secs(),
    "heartbeat_interval": _secs(),
    "heartbeat_timeout": _secs(),
    "report_interval": _secs(),
    "stop_grace_secs": _secs(allow_zero=True),
    "eviction_grace": _secs(allow_zero=True),
    "restart_backoff": _secs(allow_zero=True),
    "size_wait": _secs(allow_zero=True),
    "grow_interval": _secs(optional=True, none_means=" (or None: never)"),
    "stall_timeout": _secs(optional=True, none_means=" (or None: off)"),
}


def seconds(name: str, value, allow_zero: bool = False) -> float:
    """Pure: a duration setting as float seconds, or ConfigError naming it."""
    _secs(allow_zero)(name, value)
    return float(value)


def check(values: dict[str, Any]) -> None:
    """Pure: ConfigError for the first setting of ``values`` (name -> value) that :data:`CHECKS`
    refuses; names it has no check for pass."""
    for name, value in values.items():
        rule = CHECKS.get(name)
        if rule is not None:
            rule(name, value)
