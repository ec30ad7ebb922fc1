"""The driver's open-file limit, from tables (tfos.host.limits)."""

import resource

import pytest

from tfos.errors import ConfigError
from tfos.host import limits
from tfos.host.limits import UNLIMITED_TARGET, files_needed, plan_open_files

INF = -1


@pytest.mark.parametrize("soft,hard,needed,expect", [
    (1024, 4096, 500, (None, False)),  # enough already: untouched
    (INF, INF, 10_000, (None, False)),  # unlimited soft limit
    (1024, 524288, 8448, (524288, False)),  # raised to the hard limit
    (1024, INF, 8448, (UNLIMITED_TARGET, False)),  # unlimited hard limit: a large finite soft one
    (1024, 4096, 8448, (4096, True)),  # raised as far as it goes, and an error naming ulimit
    (4096, 4096, 8448, (None, True)),  # nothing to raise: the error alone
    (8448, 8448, 8448, (None, False)),
])
def test_plan_open_files(soft, hard, needed, expect):
    target, error = plan_open_files(soft, hard, needed, INF)
    assert (target, error is not None) == expect
    if error:
        assert "ulimit -Hn" in error and str(needed) in error and str(hard) in error


def test_files_needed_grows_with_the_nodes():
    assert files_needed(0) == limits.BASE_FILES
    assert files_needed(2048) == limits.BASE_FILES + 2048 * limits.FILES_PER_NODE


def test_ensure_open_files_raises_the_soft_limit_and_names_ulimit_when_it_cannot():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        low = min(512, hard if hard != resource.RLIM_INFINITY else 512)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        limits.ensure_open_files((low - limits.BASE_FILES) // limits.FILES_PER_NODE + 10)  # needs more than low
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > low
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(ConfigError, match="ulimit -Hn"):
                limits.ensure_open_files(hard)  # 4 per node: more than the hard limit allows
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("nodes,expected", [(2, (4096, 64, 10.02)), (512, (4096, 512, 15.12)),
                                            (2048, (8448, 2048, 30.48)), (100_000, (400_256, 65535, 1010.0))])
def test_listener_sizes_follow_the_nodes(nodes, expected):
    assert limits.listener_sizes(nodes) == expected
