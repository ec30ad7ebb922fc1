import logging
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "examples", "digits"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark():
    """One real local-cluster[2,1,1024] for the whole session; every executor announces 2 fake GPUs
    (discovery script) and each task gets one, so GPU scheduling is exercised without GPUs."""
    from tfos.testing import local_cluster_session

    session = local_cluster_session(2, 1, 1024, fake_gpus_per_executor=2, app_name="tfos-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def sc(spark):
    return spark.sparkContext


@pytest.fixture(autouse=True)
def no_leftover_tfos_processes(request):
    """After every test, no tfos agent or TF process may be left running."""
    yield
    from tfos.testing import wait_no_tfos_processes

    left = wait_no_tfos_processes(timeout=30)
    if left:
        desc = [(p.pid, " ".join(p.cmdline()[-3:])) for p in left]
        for p in left:
            try:
                p.kill()
            except Exception:
                pass
        pytest.fail(f"tfos processes left running after {request.node.name}: {desc}")
