"""reserve()'s settings in groups (tfos.cluster.driver.options): one mapping onto the keywords,
one table of checks. The keyword and positional ways are tested everywhere else."""

import dataclasses

import pytest

from tfos import (DistributionConfig, FailureConfig, InputMode, RunConfig, ScalingConfig, SecurityConfig,
                  TFCluster)
from tfos.api import _RESERVE_DEFAULTS
from tfos.cluster.driver import options
from tfos.errors import ConfigError
from tfos.testing.fake_spark import FakeSpark


def test_every_keyword_of_reserve_is_the_field_of_one_group_with_the_same_default():
    fields = [(f.name, f.default) for group in options.GROUPS.values() for f in dataclasses.fields(group)]
    names = [name for name, _ in fields]
    assert len(names) == len(set(names)) == len(_RESERVE_DEFAULTS) == 39
    assert dict(fields) == _RESERVE_DEFAULTS


def _keywords(**groups_and_given):
    groups = {g: groups_and_given.pop(g, None) for g in options.GROUPS}
    given = dict(_RESERVE_DEFAULTS, **groups_and_given)
    return options.keywords(groups, given, _RESERVE_DEFAULTS)


@pytest.mark.parametrize("call,expected", [
    (dict(scaling=ScalingConfig(num_executors=4, min_executors=2)), dict(num_executors=4, min_executors=2)),
    (dict(failures=FailureConfig(max_restarts=3, stall_timeout=None)), dict(max_restarts=3, stall_timeout=None)),
    (dict(security=SecurityConfig(encrypt=False)), dict(encrypt=False)),
    (dict(distribution=DistributionConfig(backend="ps", input_mode=InputMode.SPARK)),
     dict(backend="ps", input_mode=InputMode.SPARK)),
    (dict(run=RunConfig(log_dir="/logs", progress=False)), dict(log_dir="/logs", progress=False)),
    # a keyword beside a group: both count; the same value given both ways is fine
    (dict(scaling=ScalingConfig(num_executors=3), num_executors=3, max_restarts=2),
     dict(num_executors=3, max_restarts=2)),
    # a group's field left at its default does not undo a keyword
    (dict(failures=FailureConfig(restart_backoff=1), max_restarts=2), dict(max_restarts=2, restart_backoff=1)),
])
def test_groups_become_keywords(call, expected):
    assert _keywords(**call) == dict(_RESERVE_DEFAULTS, **expected)


@pytest.mark.parametrize("call,match", [
    (dict(scaling=ScalingConfig(num_executors=4), num_executors=2),
     r"num_executors is given twice, as num_executors=2 and in scaling=ScalingConfig\(..., num_executors=4\)"),
    (dict(failures=ScalingConfig(num_executors=4)), "failures must be a tfos.FailureConfig, got ScalingConfig"),
    (dict(run={"log_dir": "/logs"}), "run must be a tfos.RunConfig, got dict"),
])
def test_a_setting_given_two_ways_or_a_wrong_group_is_refused(call, match):
    with pytest.raises(ConfigError, match=match):
        _keywords(**call)


@pytest.mark.parametrize("name,bad,said", [
    ("num_ps", -1, "an int >= 0"), ("num_ps", 1.0, "an int >= 0"), ("num_ps", True, "an int >= 0"),
    ("num_reducers", -2, "an int >= 0"), ("num_gpus", 1.5, "an int >= 0"),
    ("max_restarts", -1, "0: a node failure ends the run"), ("tensorboard_port", "80", "0: any free port"),
    ("master_node", "boss", "'chief', 'master' or None"), ("master_node", True, "'chief', 'master' or None"),
    ("node_output", "some", "'chief' .rank 0's lines., 'all' or None"),
    ("encrypt", 1, "True, False or None"), ("encrypt", "yes", "True, False or None"),
    ("input_mode", 7, "InputMode.TENSORFLOW or InputMode.SPARK"),
    ("reservation_timeout", 0, "a positive number of seconds"), ("heartbeat_interval", -1, "positive"),
    ("heartbeat_timeout", "30", "positive"), ("report_interval", True, "positive"),
    ("stop_grace_secs", -0.5, "a non-negative number of seconds"), ("eviction_grace", None, "non-negative"),
    ("restart_backoff", -1, "non-negative"), ("size_wait", "15s", "non-negative"),
    ("grow_interval", 0, r"positive number of seconds \(or None: never\)"),
    ("stall_timeout", -5, r"positive number of seconds \(or None: off\)"),
])
def test_each_setting_is_refused_naming_it(name, bad, said):
    with pytest.raises(ConfigError, match=f"^{name} must be .*{said}") as e:
        options.check({name: bad})
    assert str(e.value).endswith(f"got {bad!r}")


@pytest.mark.parametrize("name,good", [
    ("num_ps", 0), ("num_reducers", 2), ("max_restarts", 3), ("master_node", None), ("master_node", "master"),
    ("node_output", None), ("node_output", "all"), ("encrypt", None), ("encrypt", False), ("input_mode", 1),
    ("reservation_timeout", 0.5), ("stop_grace_secs", 0), ("grow_interval", None), ("stall_timeout", None),
    ("log_dir", object()),  # no check of its own: passes
])
def test_each_good_setting_passes(name, good):
    options.check({name: good})


def test_seconds_returns_a_float():
    assert options.seconds("size_wait", 0, allow_zero=True) == 0.0 and isinstance(options.seconds("x", 2), float)


def test_reserve_takes_the_groups_on_a_fake_spark():
    cluster = TFCluster.reserve(FakeSpark(3), scaling=ScalingConfig(num_executors=3, num_ps=1),
                                failures=FailureConfig(max_restarts=2, restart_backoff=0, heartbeat_interval=0.1,
                                                       stop_grace_secs=0),
                                distribution=DistributionConfig(backend="ps"), run=RunConfig(progress=False))
    try:
        assert cluster.roles == [("ps", 0), ("chief", 0), ("worker", 0)]
        assert cluster.supervisor.settings.max_restarts == 2 and cluster.supervisor.settings.backoff == 0.0
        assert cluster.config.heartbeat_interval == 0.1 and cluster.backend.name == "ps"
    finally:
        cluster.shutdown()


def test_reserve_refuses_a_bad_group_value_before_anything_starts():
    spark = FakeSpark(2)
    with pytest.raises(ConfigError, match="^max_restarts must be an int >= 0"):
        TFCluster.reserve(spark, scaling=ScalingConfig(num_executors=2), failures=FailureConfig(max_restarts=-1))
    with pytest.raises(ConfigError, match="num_executors must be a positive int, got None"):
        TFCluster.reserve(spark, run=RunConfig(progress=False))
    assert spark.started == []
