"""Shared fixtures. Tests are split by kind: ``unit/`` (pure functions, single processes),
``integration/`` (the shared local-cluster, real TF worker processes), ``e2e/`` (the bundled
examples end to end). Tests that use the Spark fixtures get the ``spark`` marker automatically."""

import logging
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "examples", "digits"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

logging.getLogger("py4j").setLevel(logging.WARNING)
# Every process this session starts inherits the marker: the leftover check below judges (and kills)
# only this session's processes, never another test run's on the same host.
os.environ.setdefault("TFOS_TEST_SESSION", __import__("uuid").uuid4().hex)

SPARK_FIXTURES = {"spark", "sc", "tfos_cluster", "connect_spark", "connect_cluster", "wide_spark", "wide_cluster"}
# Suites that need a pytest session of their own (one process holds one Spark driver): option -> folder.
SEPARATE = {"--multihost": os.path.join(ROOT, "tests", "multihost"), "--connect": os.path.join(ROOT, "tests", "connect"),
            "--hadoop": os.path.join(ROOT, "tests", "hadoop"),
            "--reduction": os.path.join(ROOT, "tests", "reduction"),
            "--upstream-std": os.path.join(ROOT, "tests", "upstream_std"),
            "--kubernetes": os.path.join(ROOT, "tests", "kubernetes")}


#: each separate suite's option and what it runs (each needs its own pytest session: one process holds one
#: SparkContext, or the suite starts daemons of its own)
SEPARATE_HELP = {
    "--multihost": "the multi-host tests (tests/multihost: a Spark standalone cluster of several hosts in network "
                   "namespaces; needs root)",
    "--hadoop": "the Hadoop tests (tests/hadoop: real HDFS and YARN daemons started by python -m "
                "tfos.testing.hadoop; needs Java 17 and Maven, and the first run fetches Hadoop's jars from Maven "
                "Central into ~/.cache/tfos)",
    "--reduction": "the reduction-server tests on the embedded Spark (tests/reduction: a local-cluster[2,2,1024] of "
                   "4 task slots, for 2 workers and 2 reducers; the shared local-cluster has 2)",
    "--kubernetes": "the Kubernetes tests (tests/kubernetes: a real Kubernetes started by python -m "
                    "tfos.testing.kubernetes, root only; spark-submit --master k8s://...)",
    "--upstream-std": "spark-tensorflow-distributor's own integration tests on tfos.compat (tests/upstream_std: a "
                      "local-cluster per Spark configuration they ask for)",
    "--connect": "the Spark Connect tests (tests/connect: a Connect session on an embedded local-cluster[2,1,1024] "
                 "server)",
}


def pytest_addoption(parser):
    for option, what in SEPARATE_HELP.items():
        parser.addoption(option, action="store_true", help=f"run only {what}, in a pytest session of their own")


def pytest_ignore_collect(collection_path, config):
    path = str(collection_path)
    chosen = [folder for option, folder in SEPARATE.items() if config.getoption(option)]
    if chosen:
        folder = chosen[0]
        inside = path == folder or path.startswith(folder + os.sep)
        if not inside and collection_path.is_dir() and not folder.startswith(path):
            return True
        if not inside and collection_path.suffix == ".py":
            return True
        return None
    inside_any = any(path == f or path.startswith(f + os.sep) for f in SEPARATE.values())
    return True if inside_any else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """One real local-cluster[2,1,1024] for the whole session; every executor announces 2 fake GPUs
    (discovery script) and each task gets one, so GPU scheduling is exercised without GPUs."""
    from tfos.testing import local_cluster_session

    session = local_cluster_session(2, 1, 1024, fake_gpus_per_executor=2, app_name="tfos-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def tensorflow_imported_only_when_main_fun_does():
    """reserve()'s default pre-imports TensorFlow in every TF process during the rendezvous (for a
    real job, main_fun then starts with TF loaded). Most tests' main_funs never touch TF, and the
    import costs each node seconds of these 2 cores: here the default is off, so a TF process
    imports TF when main_fun does. Tests of the pre-import pass preimport_tensorflow themselves."""
    from tfos.api import TFCluster

    defaults = TFCluster.reserve.__func__.__kwdefaults__
    before = defaults["preimport_tensorflow"]
    defaults["preimport_tensorflow"] = False
    yield
    defaults["preimport_tensorflow"] = before


@pytest.fixture
def sc(spark):
    return spark.sparkContext


@pytest.fixture
def tfos_cluster(sc):
    """``tfos_cluster(num_executors, num_ps=0, **reserve_kwargs)`` reserves a cluster on the shared
    Spark session; whatever the test does, every cluster it made is shut down (or aborted) after it."""
    yield from _clusters_on(sc)


@pytest.fixture(scope="session")
def connect_spark():
    """The Spark Connect suite's session (``pytest --connect``): a Connect session on an embedded
    ``local-cluster[2,1,1024]`` server, as ``SparkSession.builder.remote("local-cluster[2,1,1024]")``
    gives it, with the same 2 fake GPUs per executor as :func:`spark`."""
    from tfos.testing import local_connect_session

    session = local_connect_session(2, 1, 1024, fake_gpus_per_executor=2, app_name="tfos-connect-tests")
    yield session
    session.stop()


@pytest.fixture
def connect_cluster(connect_spark):
    """:func:`tfos_cluster` on the Spark Connect session."""
    yield from _clusters_on(connect_spark)


@pytest.fixture(scope="session")
def wide_spark():
    """The reduction-server suite's session (``pytest --reduction``): a local-cluster[2,2,1024],
    2 executors of 2 cores, so 4 task slots: 2 workers and 2 reducers."""
    from tfos.testing import local_cluster_session

    session = local_cluster_session(2, 2, 1024, app_name="tfos-reduction-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def wide_cluster(wide_spark):
    """:func:`tfos_cluster` on the 4-slot session."""
    yield from _clusters_on(wide_spark.sparkContext)


def _clusters_on(spark):
    from tfos import TFCluster
    from tfos.errors import TFOSError

    made = []

    def reserve(num_executors, num_ps=0, **kwargs):
        cluster = TFCluster.reserve(spark, num_executors, num_ps, **kwargs)
        made.append(cluster)
        return cluster

    yield reserve
    for cluster in made:
        if not cluster.lifecycle.ended:
            try:
                cluster._abort(TFOSError("the test ended"))
            except Exception as e:  # report, but let the leftover-process check judge the outcome
                logging.getLogger(__name__).warning("could not abort cluster %s: %s", cluster.cluster_id, e)


@pytest.fixture(autouse=True)
def no_leftover_tfos_processes(request):
    """After every test, no tfos agent or TF process of this session may be left running."""
    yield
    from tfos.testing import SESSION_VARIABLE, wait_no_tfos_processes

    left = wait_no_tfos_processes(timeout=30, session=os.environ[SESSION_VARIABLE])
    if left:
        desc = [(p.pid, " ".join(p.cmdline()[-3:])) for p in left]
        for p in left:
            try:
                p.kill()
            except Exception:
                pass
        pytest.fail(f"tfos processes left running after {request.node.name}: {desc}")
