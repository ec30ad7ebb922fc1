"""BarrierTaskContext inside a TFDistributor function (tfos.cluster.node.barrier), against a node
context whose all-gathers answer from a table: pyspark's get() returns the node's context only
inside the block, and its methods map onto the node's."""

import pytest

from tfos.cluster.driver.registry import GATHER_TEXT_MAX
from tfos.cluster.node.barrier import installed, task_infos


class Node:
    """The parts of NodeContext the barrier context reads; all-gathers answered as 2 ranks would."""

    node_index, attempt, gpus = 1, 0, ["3"]
    nodes = [{"node_index": 1, "host": "h1", "tf_port": 11}, {"node_index": 0, "host": "h0", "tf_port": 10}]

    def __init__(self):
        self.calls = []

    def all_gather_text(self, key, text, timeout):
        self.calls.append((key, text))
        return ["other", text]

    def all_gather(self, key, value, timeout):
        self.calls.append((key, value))
        return [value, value]


def test_task_infos_are_by_node_index():
    assert task_infos(Node.nodes) == ["h0:10", "h1:11"]


def test_pyspark_answers_for_the_node_only_inside_the_block():
    from pyspark import BarrierTaskContext, TaskContext
    from pyspark.errors import PySparkRuntimeError

    node = Node()
    with installed(node) as ctx:
        assert BarrierTaskContext.get() is ctx and TaskContext.get() is ctx
        assert ctx.partitionId() == 1 and ctx.attemptNumber() == 0
        assert ctx.allGather("mine") == ["other", "mine"]
        ctx.barrier()
        assert [i.address for i in ctx.getTaskInfos()] == ["h0:10", "h1:11"]
        assert ctx.resources()["gpu"].addresses == ["3"]
        with pytest.raises(TypeError):
            ctx.allGather(3)
    # one key per call, in call order: every rank calls them in the same order
    assert node.calls == [("tfos.barrier.0", "mine"), ("tfos.barrier.1", 0)]
    assert TaskContext.get() is None
    with pytest.raises(PySparkRuntimeError, match="NOT_IN_BARRIER_STAGE"):
        BarrierTaskContext.get()


def test_the_driver_bounds_a_text_before_it_keeps_it():
    from tfos.cluster.driver.registry import NodeRegistry
    from tfos.wire import messages as M

    reg = NodeRegistry.__new__(NodeRegistry)
    reg.roles = [("worker", 0)]
    reply = NodeRegistry.on_gather(reg, M.Gather("c", 0, "k", 0, 0.0, "x" * (GATHER_TEXT_MAX + 1)))
    assert isinstance(reply, M.ErrorReply) and "at most" in reply.message
