"""TFDistributor's and MirroredStrategyRunner's decisions, from tables (pure; no Spark): nodes per
process count and GPUs, the runner's task shares (spark-tensorflow-distributor's integration cases),
the driver's GPUs in local mode, Spark's GPU addresses through an executor's CUDA_VISIBLE_DEVICES,
reserve()'s gpus_per_node."""

import pytest

from tfos.distributor import distributor_nodes, local_gpus, runner_tasks, task_gpu_amount
from tfos.cluster.driver.settings import gpus_per_node_setting
from tfos.errors import ConfigError
from tfos.host.gpus import visible_devices


@pytest.mark.parametrize("n,use_gpu,per_task,nodes", [(1, False, None, 1), (4, False, 2.0, 4), (4, True, 1.0, 4),
                                                      (4, True, 2.0, 2), (8, True, 4.0, 2)])
def test_distributor_nodes(n, use_gpu, per_task, nodes):
    assert distributor_nodes(n, use_gpu, per_task) == nodes


@pytest.mark.parametrize("n,use_gpu,per_task,match", [(0, False, None, "positive"), (True, False, None, "positive"),
                                                      (2, True, None, "spark.task.resource.gpu.amount"),
                                                      (2, True, 0.5, "unset"), (3, True, 2.0, "multiple of 2")])
def test_distributor_refusals_name_the_setting(n, use_gpu, per_task, match):
    with pytest.raises(ConfigError, match=match):
        distributor_nodes(n, use_gpu, per_task)


# spark-tensorflow-distributor's test_equal_gpu_allocation: workers of 4 GPUs, tasks of 1, 2 or 4
@pytest.mark.parametrize("per_task,slots,shares", [
    (1, 2, [1, 1]), (1, 4, [1] * 4), (1, 6, [1] * 6), (1, 8, [1] * 8),
    (2, 2, [2]), (2, 4, [2, 2]), (2, 6, [2, 2, 2]), (2, 8, [2] * 4),
    (4, 2, [2]), (4, 4, [4]), (4, 6, [3, 3]), (4, 8, [4, 4]), (4, 5, [3, 2])])
def test_runner_shares_slots_over_tasks(per_task, slots, shares):
    assert runner_tasks(slots, True, float(per_task)) == shares


def test_runner_cpu_slots_and_refusals():
    assert runner_tasks(2, False, 4.0) == [0, 0]  # use_gpu=False on GPU workers: CPU tasks, GPUs hidden
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="num_slots"):
            runner_tasks(bad, True, 4.0)
    with pytest.raises(ConfigError, match="spark.task.resource.gpu.amount is unset"):
        runner_tasks(2, True, None)
    with pytest.raises(ConfigError, match="whole GPU"):
        runner_tasks(2, True, 0.5)


def test_task_gpu_amount_reads_the_resource():
    assert task_gpu_amount({"spark.task.resource.gpu.amount": "2"}) == 2.0
    assert task_gpu_amount({}) is None and task_gpu_amount({"spark.task.resource.fpga.amount": "1"}, "fpga") == 1.0
    with pytest.raises(ConfigError, match="not a number"):
        task_gpu_amount({"spark.task.resource.gpu.amount": "two"})


@pytest.mark.parametrize("addresses,count,per,inherited,want", [
    (["0", "1", "2", "3"], 2, 1, None, [("0",), ("1",)]),
    (["0", "1", "2", "3"], 1, 3, None, [("0", "1", "2")]),
    (["0", "1", "2", "3"], 1, 2, "10,11,12,13", [("10", "11")]),
    (["2", "3"], 2, 1, "10,11,12,13", [("12",), ("13",)])])
def test_local_gpus(addresses, count, per, inherited, want):
    assert local_gpus(addresses, count, per, inherited) == want


def test_local_gpus_too_few():
    with pytest.raises(ConfigError, match="needs 4 GPU"):
        local_gpus(["0", "1"], 2, 2, None)


@pytest.mark.parametrize("addresses,limit,inherited,want", [
    (["0", "1"], None, None, ["0", "1"]), (["0", "1"], -1, "", ["0", "1"]), (["0", "1"], 1, None, ["0"]),
    (["0", "1"], 0, None, []), (["1", "3"], None, "10,11,12,13", ["11", "13"]), (["2"], None, " 4, 5,6 ", ["6"])])
def test_visible_devices(addresses, limit, inherited, want):
    assert visible_devices(addresses, limit, inherited) == want


@pytest.mark.parametrize("addresses,inherited", [(["4"], "10,11"), (["gpu0"], "10")])
def test_visible_devices_refuses_addresses_outside_the_executors_list(addresses, inherited):
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES"):
        visible_devices(addresses, None, inherited)


def test_gpus_per_node_setting():
    assert gpus_per_node_setting(None, 3) == ()
    assert gpus_per_node_setting(0, 2) == (0, 0)
    assert gpus_per_node_setting([2, -1], 2) == (2, -1)
    for bad in ([1], [1, "2"], -2, True, [True, 1], "2"):
        with pytest.raises(ConfigError, match="gpus_per_node"):
            gpus_per_node_setting(bad, 2)


def test_a_connect_session_is_asked_for_the_task_resource_by_key():
    from tfos.distributor import _task_conf, conf_of

    class Connectish:  # ConnectSpark answers single keys; its conf() holds a few
        def get(self, key):
            return {"spark.task.resource.gpu.amount": "2"}.get(key)

        def conf(self):
            return {}

    class Classicish:
        def conf(self):
            return {"spark.task.resource.gpu.amount": "1"}

    assert conf_of(Connectish(), "spark.task.resource.gpu.amount") == "2"
    assert task_gpu_amount(_task_conf(Connectish(), "gpu")) == 2.0
    assert task_gpu_amount(_task_conf(Classicish(), "gpu")) == 1.0 and _task_conf(Classicish(), "fpga") == {}
