"""Fixtures of the multi-host suite (``pytest --multihost``): one Spark standalone cluster of three
hosts, each a network namespace on a bridge (tests/multihost/hosts.py), shared by the session."""

import os
import sys
import time

import pytest

from hosts import DRIVER_ADDRESS, Hosts, can_run

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


def wait_executors(sc, n: int, timeout: float = 120.0) -> None:
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while len(tracker.getExecutorInfos()) - 1 < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(tracker.getExecutorInfos()) - 1} of {n} executors within {timeout:.0f}s")
        time.sleep(0.25)


@pytest.fixture(scope="session")
def mh_spark(hosts):
    """The driver (this process) on the bridge address; one 1-core executor per host."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(hosts.master_url).appName("tfos-multihost")
             .config("spark.driver.host", DRIVER_ADDRESS)
             .config("spark.driver.bindAddress", DRIVER_ADDRESS)
             .config("spark.executor.cores", "1")
             .config("spark.executor.memory", "1g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.task.maxFailures", "2")  # Spark may retry a task (as on YARN, 4 by default)
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    wait_executors(spark.sparkContext, NUM_HOSTS)
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
