"""Upstream's fixtures for spark-tensorflow-distributor's integration tests, on a local-cluster
(see SOURCE.md): a session per (num_workers, num_gpus_per_worker, extra_spark_configs), with
upstream's spark-base.conf and its fake GPU discovery script."""

import pytest

from tfos.testing import gpu_discovery_script, local_cluster_session

#: upstream's tests/integration/spark_conf/spark-base.conf, less its master and discovery paths
BASE_CONF = {
    "spark.cores.max": "2", "spark.executor.cores": "1", "spark.task.cpus": "1",
    "spark.driver.resource.gpu.amount": "4", "spark.executor.resource.gpu.amount": "4",
    "spark.task.resource.gpu.amount": "4", "spark.worker.resource.gpu.amount": "4",
    "spark.driver.memory": "512m", "spark.executor.memory": "512m",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
    "spark.python.worker.reuse": "false",
}
#: cores of each local-cluster worker: enough for upstream's largest spark.executor.cores (4)
WORKER_CORES = 4
#: tfos runs a spark.ssl.enabled cluster encrypted instead of refusing it (docs/migration.md §6)
DIFFERS_BY_DESIGN = {"test_run_on_ssl_cluster": "tfos runs a spark.ssl.enabled cluster with its own encryption "
                                                "instead of refusing it (docs/migration.md section 6)"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = DIFFERS_BY_DESIGN.get(item.originalname)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="session")
def max_num_workers():
    return 2


@pytest.fixture(scope="session")
def extra_spark_configs(request):
    return dict(getattr(request, "param", {}))


@pytest.fixture(scope="session", autouse=True)
def num_workers(request, max_num_workers):
    if not hasattr(request, "param"):
        raise Exception(f"num_workers is a required fixture, but test {request.node.name} does not use it")
    assert request.param <= max_num_workers
    return request.param


@pytest.fixture(scope="session", autouse=True)
def num_gpus_per_worker(request):
    if not hasattr(request, "param"):
        raise Exception(f"num_gpus_per_worker is a required fixture, but test {request.node.name} does not use it")
    return request.param


@pytest.fixture(scope="session", autouse=True)
def spark_session(num_workers, num_gpus_per_worker, extra_spark_configs):
    script = gpu_discovery_script(range(num_gpus_per_worker))
    conf = {**BASE_CONF, **{k: str(v) for k, v in extra_spark_configs.items()}}
    for who in ("driver", "worker", "executor"):
        conf[f"spark.{who}.resource.gpu.discoveryScript"] = script
    conf["spark.worker.resource.gpu.amount"] = str(num_gpus_per_worker)
    # upstream waits up to 180 s for spark.cores.max worth of executors, which one worker of 4 GPUs
    # never reaches (each executor takes all 4); the session below waits for its executors itself
    conf["spark.scheduler.maxRegisteredResourcesWaitingTime"] = "10s"
    # one executor per worker in every case upstream runs (each takes all of its worker's GPUs)
    session = local_cluster_session(num_workers, WORKER_CORES, 1024, app_name="Spark TensorFlow Distributor Tests",
                                    conf=conf, wait_secs=180)
    yield session
    session.stop()
