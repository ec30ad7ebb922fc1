"""Table-driven tests of the pure decision functions."""

import pytest

from tfos.cluster import decisions as D
from tfos.errors import ConfigError


@pytest.mark.parametrize("n,ps,master,ev,expected", [
    (1, 0, "chief", False, [("chief", 0)]),
    (2, 0, "chief", False, [("chief", 0), ("worker", 0)]),
    (2, 0, None, False, [("worker", 0), ("worker", 1)]),
    (4, 1, "chief", False, [("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1)]),
    (5, 2, "chief", True, [("ps", 0), ("ps", 1), ("chief", 0), ("evaluator", 0), ("worker", 0)]),
    (3, 0, "master", True, [("master", 0), ("evaluator", 0), ("worker", 0)]),
])
def test_assign_roles(n, ps, master, ev, expected):
    assert D.assign_roles(n, ps, master, ev) == expected


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_executors=0), "num_executors"),
    (dict(num_executors=2, num_ps=2), "leaves no node to train"),
    (dict(num_executors=2, num_ps=1, eval_node=True), "leaves no node to train"),
    (dict(num_executors=2, num_ps=-1), "num_ps"),
    (dict(num_executors=True), "num_executors"),
    (dict(num_executors=2, master_node="boss"), "master_node"),
    (dict(num_executors=2, reservation_timeout=0), "reservation_timeout"),
    (dict(num_executors=2, input_mode=7), "input_mode"),
])
def test_validate_reserve_rejects(kwargs, match):
    args = dict(num_executors=2, num_ps=0, master_node="chief", eval_node=False, reservation_timeout=60,
                input_mode=0)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        D.validate_reserve(**args)


def _nodes(roles):
    return [dict(node_index=i, job_name=j, task_index=t, host=f"h{i}", tf_port=2000 + i)
            for i, (j, t) in enumerate(roles)]


@pytest.mark.parametrize("roles,spec", [
    ([("chief", 0), ("worker", 0)], {"chief": ["h0:2000"], "worker": ["h1:2001"]}),
    ([("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0), ("worker", 1)],
     {"ps": ["h0:2000"], "chief": ["h1:2001"], "worker": ["h3:2003", "h4:2004"]}),
    ([("worker", 1), ("worker", 0)], {"worker": ["h1:2001", "h0:2000"]}),
])
def test_cluster_spec_orders_by_task_and_excludes_evaluator(roles, spec):
    assert D.cluster_spec(_nodes(roles)) == spec


def test_tf_config_per_node():
    nodes = _nodes([("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0)])
    assert D.tf_config(nodes, 3) == {"cluster": {"ps": ["h0:2000"], "chief": ["h1:2001"], "worker": ["h3:2003"]},
                                     "task": {"type": "worker", "index": 0}}
    assert D.tf_config(nodes, 2)["task"] == {"type": "evaluator", "index": 0}


@pytest.mark.parametrize("job,idx,rank", [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("ps", 0, None),
                                          ("evaluator", 0, None)])
def test_training_rank(job, idx, rank):
    roles = [("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0), ("worker", 1)]
    assert D.training_rank(job, idx, roles) == rank
    assert D.num_training_nodes(roles) == 3


SMI = "0, 10, 0\n1, 9000, 95\n2, 0, 0\n3, 100, 5\n"


@pytest.mark.parametrize("num,spark,claimed,expected", [
    (1, ["5"], [], ["5"]),            # Spark resource scheduling wins
    (0, None, [], []),                # CPU only
    (1, None, [], ["2"]),             # least used first
    (2, None, [], ["0", "2"]),
    (2, None, ["2"], ["0", "3"]),     # another node on this host holds GPU 2
    (3, None, ["1"], ["0", "2", "3"]),
])
def test_choose_gpus(num, spark, claimed, expected):
    assert D.choose_gpus(num, spark, D.parse_nvidia_smi(SMI), claimed) == expected


@pytest.mark.parametrize("num,smi,claimed,match", [
    (1, "", [], "no GPU was found"),
    (4, SMI, [], "only 3 of 4 are free"),
    (2, SMI, ["0", "2"], "only 1 of 4"),
])
def test_choose_gpus_errors(num, smi, claimed, match):
    with pytest.raises(ConfigError, match=match):
        D.choose_gpus(num, None, D.parse_nvidia_smi(smi), claimed)


def test_parse_nvidia_smi_skips_garbage():
    assert D.parse_nvidia_smi("0, 1, 2\nbad line\n1, N/A, 3\n") == [("0", 1, 2)]


def test_gpu_environment():
    assert D.gpu_environment(["1", "3"])["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert D.gpu_environment([])["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("eph,taken", [((32768, 60999), []), ((32768, 60999), [20000, 20001]),
                                       ((1024, 60000), []), ((10000, 65535), [])])
def test_port_candidates_avoid_ephemeral_range_and_taken(eph, taken):
    ports = D.port_candidates(eph, taken, count=50, seed=3)
    assert len(ports) == len(set(ports)) == 50
    for p in ports:
        assert not (eph[0] <= p <= eph[1]) or eph == (10000, 65535)
        assert p not in taken and 1024 <= p <= 65535


@pytest.mark.parametrize("path,fs,wd,user,expected", [
    ("hdfs://nn:8020/data", "hdfs://nn:8020", "/w", "u", "hdfs://nn:8020/data"),
    ("file:///tmp/x", "hdfs://nn:8020", "/w", "u", "file:///tmp/x"),
    ("/data/x", "hdfs://nn:8020", "/w", "u", "hdfs://nn:8020/data/x"),
    ("data/x", "hdfs://nn:8020/", "/w", "u", "hdfs://nn:8020/user/u/data/x"),
    ("data/x", "file:///", "/work/dir", "u", "file:///work/dir/data/x"),
    ("/abs/x", "file:///", "/work/dir", "u", "file:///abs/x"),
    ("../x", "", "/work/dir", "u", "file:///work/x"),
    ("x", "viewfs://cluster", "/w", "bob", "viewfs://cluster/user/bob/x"),
])
def test_absolute_path(path, fs, wd, user, expected):
    assert D.absolute_path(path, fs, wd, user) == expected


def test_command_lines():
    assert D.tf_process_command("/py") == ["/py", "-u", "-m", "tfos.cluster.tf_node"]
    assert D.agent_command("/py") == ["/py", "-u", "-m", "tfos.cluster.agent"]


def test_import_of_tfos_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, tfos; from tfos import TFCluster, InputMode; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
