"""Fixtures of the multi-host suite (``pytest --multihost``): one Spark standalone cluster of three
hosts, each a network namespace on a bridge (tests/multihost/hosts.py), shared by the session."""

import pytest

from hosts import Hosts, can_run, wait_executors

NUM_HOSTS = 3


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.multihost)


@pytest.fixture(scope="session")
def hosts():
    why = can_run()
    if why:
        pytest.skip(f"multi-host tests need network namespaces: {why}")
    with Hosts(NUM_HOSTS) as h:
        yield h


@pytest.fixture(scope="session")
def mh_spark(hosts):
    """The driver (this process) on the bridge address; one 1-core executor per host."""
    spark = hosts.spark_session("tfos-multihost")
    yield spark
    spark.stop()


@pytest.fixture
def mh_sc(mh_spark, hosts):
    sc = mh_spark.sparkContext
    wait_executors(sc, NUM_HOSTS)  # a fault test may have replaced a host
    return sc


_MEASURED: list = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.user_properties:
        _MEASURED.append((report.nodeid.split("::")[-1], report.outcome, dict(report.user_properties)))


def pytest_terminal_summary(terminalreporter):
    """The fault matrix's measurements (time to the driver's error, to no process left)."""
    if _MEASURED:
        terminalreporter.section("fault matrix: measured")
        for name, outcome, props in _MEASURED:
            terminalreporter.write_line(f"{name} [{outcome}]: " + ", ".join(f"{k}={v}" for k, v in props.items()))
