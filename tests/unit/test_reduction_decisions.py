"""The reduction server's decisions, from tables: how a buffer is cut into pieces and shards (the
C++ op cuts alike), bytes per worker, where the reducers go among Spark's tasks, their roles, what a
TF process learns of them, and the arguments reserve() takes."""

import json
from types import SimpleNamespace

import pytest

from tfos import topology
from tfos.cluster.driver.settings import ClusterShape, validate_reserve
from tfos.errors import CollectiveError, ConfigError
from tfos.tf import reduction
from tfos.topology import InputMode


@pytest.mark.parametrize("count,reducers,piece,itemsize,expected", [
    (0, 2, 1024, 4, []),
    (1, 2, 1024, 4, [[1, 0]]),                   # fewer elements than reducers: reducer 1 gets nothing
    (5, 2, 1024, 4, [[3, 2]]),                   # not divisible: the first shards are one longer
    (7, 3, 1024, 4, [[3, 2, 2]]),
    (600, 2, 1024, 4, [[128, 128], [128, 128], [44, 44]]),  # pieces of 256 float32, then the rest
    (601, 2, 1024, 4, [[128, 128], [128, 128], [45, 44]]),
    (600, 2, 1024, 2, [[256, 256], [44, 44]]),   # float16: twice the elements per piece
    (10, 4, 4, 4, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]),  # a piece is never below one element per reducer
    (10, 3, 0, 4, [[4, 3, 3]]),                  # no piece size: one piece
])
def test_a_buffer_is_cut_in_pieces_of_r_shards(count, reducers, piece, itemsize, expected):
    cut = reduction.shard_counts(count, reducers, piece, itemsize)
    assert cut == expected
    assert sum(map(sum, cut)) == count


def test_a_piece_is_r_shards():
    assert reduction.piece_bytes(4) == 4 * reduction.SHARD_BYTES
    assert reduction.piece_bytes(0) == reduction.SHARD_BYTES


@pytest.mark.parametrize("nbytes,workers,reducers,expected", [
    (64, 4, 4, 64),      # through reducers: K each way, whatever N
    (64, 16, 2, 64),
    (64, 4, 0, 96),      # a ring: 2(N-1)/N K = 1.5 K at N = 4
    (64, 2, 0, 64),
    (64, 8, 0, 112),
    (64, 1, 4, 0),       # one worker: nothing to send
])
def test_bytes_a_worker_sends(nbytes, workers, reducers, expected):
    assert reduction.bytes_per_worker(nbytes, workers, reducers) == expected


R, C, W = ("reducer", "chief", "worker")


@pytest.mark.parametrize("hosts,roles,expected", [
    # no reducers: task p runs node p
    (["a", "b"], [(C, 0), (W, 0)], [0, 1]),
    # one task per host: the reducers take the tasks in order, the others keep their order
    (["a", "b", "c", "d"], [(R, 0), (R, 1), (C, 0), (W, 0)], [0, 1, 2, 3]),
    # two hosts of two tasks: the reducers fill one host, the training nodes the other
    (["a", "a", "b", "b"], [(R, 0), (R, 1), (C, 0), (W, 0)], [0, 1, 2, 3]),
    (["a", "b", "a", "b"], [(R, 0), (R, 1), (C, 0), (W, 0)], [0, 2, 1, 3]),
    (["b", "a", "b", "a"], [(R, 0), (R, 1), (C, 0), (W, 0)], [2, 0, 3, 1]),  # a tie: by host name
    # a host of one task goes to a reducer first (the fewest tasks first), then whole hosts that fit
    (["a", "a", "a", "b"], [(R, 0), (C, 0), (W, 0), (W, 1)], [1, 2, 3, 0]),
    # no host is free of trainers: the reducers left share the host with the most tasks
    (["a", "a", "a", "b"], [(R, 0), (R, 1), (C, 0), (W, 0)], [2, 3, 0, 1]),
    # one host (local-cluster): the last tasks
    (["h"] * 4, [(R, 0), (R, 1), (C, 0), (W, 0)], [2, 3, 0, 1]),
    # ps nodes and workers keep their order around the reducers
    (["a", "b", "c", "c", "d"], [("ps", 0), (R, 0), (C, 0), (W, 0), (W, 1)], [1, 0, 2, 3, 4]),
    # a stage of another size than the roles (never made by tfos): unchanged
    (["a", "b"], [(R, 0), (C, 0), (W, 0)], [0, 1]),
])
def test_reducers_get_hosts_of_their_own_where_the_tasks_allow(hosts, roles, expected):
    placed = topology.place_nodes(hosts, roles)
    assert placed == expected
    assert sorted(placed) == list(range(len(hosts)))


def test_reducers_come_after_the_ps_nodes_and_before_the_trainers():
    assert topology.assign_roles(5, 1, "chief", False, 2) == [("ps", 0), (R, 0), (R, 1), (C, 0), (W, 0)]
    shape = ClusterShape(0, "chief", False, 2)
    assert shape.roles(4) == [(R, 0), (R, 1), (C, 0), (W, 0)]
    assert shape.roles(3) == shape.roles(4)[:3]  # a smaller cluster loses workers only
    assert shape.smallest == 3
    assert topology.training_rank(R, 0, shape.roles(4)) is None
    assert topology.num_training_nodes(shape.roles(4)) == 2


def _node(i, job, task, host):
    return SimpleNamespace(node_index=i, job_name=job, task_index=task, host=host, address=f"{host}:{1000 + i}")


def test_reducers_are_not_in_tfs_cluster_spec_and_every_node_learns_their_names():
    nodes = [_node(0, R, 0, "h0"), _node(1, R, 1, "h1"), _node(2, C, 0, "h2"), _node(3, W, 0, "h3")]
    assert topology.cluster_spec(nodes) == {"chief": ["h2:1002"], "worker": ["h3:1003"]}
    env = topology.reducers_environment(reversed(nodes))
    assert env[topology.ENV_REDUCERS] == "2"
    assert json.loads(env[topology.ENV_REDUCER_NAMES]) == ["reducer 0 (node 0 on h0)", "reducer 1 (node 1 on h1)"]
    assert topology.reducers_environment(nodes[2:]) == {}
    assert topology.CPU_ONLY_JOBS == (R,)


@pytest.mark.parametrize("env,expected", [
    ({}, (0, [])),
    ({"TFOS_REDUCERS": "2"}, (2, ["reducer 0", "reducer 1"])),  # outside a tfos node: numbered
    ({"TFOS_REDUCERS": "1", "TFOS_REDUCER_NAMES": '["reducer 0 (node 0 on h)"]'}, (1, ["reducer 0 (node 0 on h)"])),
    ({"TFOS_REDUCERS": "x"}, ConfigError),
])
def test_what_a_worker_learns_of_the_reducers(monkeypatch, env, expected):
    for k in ("TFOS_REDUCERS", "TFOS_REDUCER_NAMES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if expected is ConfigError:
        with pytest.raises(ConfigError, match="TFOS_REDUCERS"):
            reduction.reducers_here()
    else:
        assert reduction.reducers_here() == expected


@pytest.mark.parametrize("value,num_ps,num_reducers,expected", [
    ([1, 2], 0, 2, [0, 0, 1, 2]),          # one count per node but the reducers: theirs is 0
    ([1, 1, 2], 1, 1, [1, 0, 1, 2]),       # after the ps nodes
    (1, 0, 2, 1),                          # a count for all: as it is (the agent gives a reducer none)
    (None, 0, 2, None),
    ([1, 2], 0, 0, [1, 2]),
])
def test_a_per_node_gpu_list_skips_the_reducers(value, num_ps, num_reducers, expected):
    from tfos.cluster.driver.settings import gpus_with_reducers

    assert gpus_with_reducers(value, num_ps, num_reducers) == expected


@pytest.mark.parametrize("num_reducers", [-1, 1.5, True, "2"])
def test_reserve_refuses_a_bad_number_of_reducers(num_reducers):
    with pytest.raises(ConfigError, match="num_reducers"):
        validate_reserve(2, 0, "chief", False, 60, InputMode.TENSORFLOW, 0, 0, num_reducers)


def test_a_worker_group_needs_reducers(monkeypatch):
    monkeypatch.delenv("TFOS_REDUCERS", raising=False)
    monkeypatch.setattr(reduction, "_group", None)
    with pytest.raises(ConfigError, match="num_reducers"):
        reduction.worker_group(0, 2, "127.0.0.1", 5.0, store_address=("127.0.0.1", 1))


class _Hooks:
    def __init__(self, error):
        self.error = error

    def run(self, main_fun, args, ctx):
        raise self.error


class _OpError(Exception):  # what TF raises from a tf.function: the op's text inside its message
    def __init__(self, message):
        super().__init__(message)
        self.message = message


def test_a_collective_ops_error_reaches_the_driver_as_collective_error():
    from tfos.cluster.node.runtime import run_main

    text = "{{function_node f}} CollectiveError: reduction-server all-reduce failed on worker 0 of 2: reducer 1 died"
    with pytest.raises(CollectiveError, match=r"^reduction-server all-reduce failed on worker 0 of 2: reducer 1") as e:
        run_main(_Hooks(_OpError(text)), None, None, None)
    assert isinstance(e.value.__cause__, _OpError)
    with pytest.raises(_OpError):  # any other error is raised as it is
        run_main(_Hooks(_OpError("something else")), None, None, None)
    with pytest.raises(ValueError):
        run_main(_Hooks(ValueError("CollectiveError: not a TF error (no .message)")), None, None, None)
