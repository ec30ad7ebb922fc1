"""Helpers for testing tfos programs: an embedded multi-executor Spark cluster, optionally with
fake GPUs served by a discovery script, and a check for leftover tfos processes."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time

from tfos.cluster.agent.reaper import REAPER_MODULE
from tfos.cluster.agent.node_agent import TF_PROCESS_MODULE
from tfos.cluster.executor.bootstrap import AGENT_MODULE
from tfos.host.deadline import Deadline


def gpu_discovery_script(addresses, directory: str | None = None) -> str:
    """Write a Spark resource discovery script announcing ``addresses`` as GPUs; return its path."""
    directory = directory or tempfile.mkdtemp(prefix="tfos-gpus-")
    path = os.path.join(directory, "discover_gpus.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho '%s'\n" % json.dumps({"name": "gpu", "addresses": [str(a) for a in addresses]}))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


QUIET_LOG4J = """\
# Spark's driver logs only errors on the console (tfos.testing sessions: examples and tests)
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def quiet_log4j_config() -> str:
    """A log4j2 configuration (in this user's private directory) that keeps the embedded cluster's
    INFO/WARN lines ("Using Spark's default log4j profile", "Your hostname resolves to a loopback
    address") off the console."""
    from tfos.host import private

    path = os.path.join(private.private_dir("spark"), "log4j2-quiet.properties")
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            if f.read() == QUIET_LOG4J:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}"
    private.write_private_file(tmp, QUIET_LOG4J.encode())
    os.replace(tmp, path)
    return path


def local_cluster_session(num_executors: int = 2, cores: int = 1, memory_mb: int = 1024,
                          fake_gpus_per_executor: int = 0, app_name: str = "tfos", conf: dict | None = None,
                          wait_secs: float = 120.0):
    """A SparkSession on ``local-cluster[num_executors,cores,memory_mb]``: separate executor JVMs
    on this host, the closest local stand-in for a real cluster. Executors run this Python.

    With ``fake_gpus_per_executor``, each executor announces that many GPUs through a discovery
    script and every task gets one, so GPU scheduling is exercised without GPUs.
    Waits until all executors have registered.
    """
    from pyspark.sql import SparkSession

    b = _configure(SparkSession.builder.master(f"local-cluster[{num_executors},{cores},{memory_mb}]"), app_name,
                   fake_gpus_per_executor, conf)
    spark = b.getOrCreate()
    _wait_executors(spark.sparkContext, num_executors, wait_secs)
    return spark


def local_connect_session(num_executors: int = 2, cores: int = 1, memory_mb: int = 1024,
                          fake_gpus_per_executor: int = 0, app_name: str = "tfos", conf: dict | None = None,
                          wait_secs: float = 120.0):
    """A Spark Connect SparkSession on ``local-cluster[num_executors,cores,memory_mb]``, as
    ``SparkSession.builder.remote("local-cluster[...]")`` gives it: pyspark starts a Connect server
    in a local Spark driver and this process talks to it over gRPC, with no SparkContext of its
    own to use. Same executors and settings as :func:`local_cluster_session`."""
    import warnings

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    b = _configure(SparkSession.builder.remote(f"local-cluster[{num_executors},{cores},{memory_mb}]"), app_name,
                   fake_gpus_per_executor, conf)
    with warnings.catch_warnings():  # the client re-sets the server's static settings and warns that it cannot
        warnings.simplefilter("ignore", UserWarning)
        spark = b.getOrCreate()
    # The embedded server's driver lives in this process: only this helper looks at it, to wait for executors.
    _wait_executors(SparkContext._active_spark_context, num_executors, wait_secs)
    return spark


def _configure(b, app_name: str, fake_gpus_per_executor: int, conf: dict | None):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = (b.appName(app_name)
         .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{quiet_log4j_config()}")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.task.maxFailures", "1")
         .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)))
    if fake_gpus_per_executor:
        script = gpu_discovery_script(range(fake_gpus_per_executor))
        b = (b.config("spark.worker.resource.gpu.amount", str(fake_gpus_per_executor))
             .config("spark.worker.resource.gpu.discoveryScript", script)
             .config("spark.executor.resource.gpu.amount", str(fake_gpus_per_executor))
             .config("spark.executor.resource.gpu.discoveryScript", script)
             .config("spark.task.resource.gpu.amount", "1"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    return b


def _wait_executors(sc, num_executors: int, wait_secs: float) -> None:
    jsc = sc._jsc.sc()
    deadline = Deadline(wait_secs)
    while jsc.statusTracker().getExecutorInfos().__len__() - 1 < num_executors:
        if deadline.expired():
            raise TimeoutError(f"only {jsc.statusTracker().getExecutorInfos().__len__() - 1} of {num_executors} "
                               f"executors registered within {wait_secs:.0f}s")
        time.sleep(0.25)


def example_session(num_executors: int = 2, app_name: str = "tfos-example", remote: str | None = None):
    """The SparkSession an example should use: the one spark-submit (or a notebook) already set up,
    with its --master; else an embedded local-cluster with ``num_executors`` executors.

    ``remote``: a Spark Connect session instead: ``sc://host:15002`` connects to that server,
    ``local-cluster`` starts an embedded Connect server on ``local-cluster[num_executors,1,1024]``."""
    from pyspark.sql import SparkSession

    if remote == "local-cluster":
        return local_connect_session(num_executors, app_name=app_name)
    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit: honour its --master
        return SparkSession.builder.appName(app_name).getOrCreate()
    return local_cluster_session(num_executors, app_name=app_name)


#: An environment variable a test session sets to a value of its own: the processes it starts
#: (Spark's executors, their agents and TF processes) inherit it, so the session can tell its own
#: leftovers from another session's processes on the same host.
SESSION_VARIABLE = "TFOS_TEST_SESSION"


def tfos_processes(session: str | None = None):
    """psutil.Process objects of tfos agents, reapers and TF processes running on this host; with
    ``session``, only those whose environment has SESSION_VARIABLE set to it."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if any(m in cmd for m in (AGENT_MODULE, REAPER_MODULE, TF_PROCESS_MODULE)):
            if session is not None:
                try:
                    if p.environ().get(SESSION_VARIABLE) != session:
                        continue
                except (psutil.Error, OSError):
                    continue
            found.append(p)
    return found


def wait_no_tfos_processes(timeout: float = 30.0, session: str | None = None):
    """Wait until no tfos agent, reaper or TF process is left (of ``session`` only, when given);
    return the leftovers (empty list if none)."""
    deadline = Deadline(timeout)
    while True:
        left = tfos_processes(session)
        if not left or deadline.expired():
            return left
        time.sleep(0.2)


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed; return its last value."""
    deadline = Deadline(timeout)
    while not deadline.expired():
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
