"""Table-driven tests of the pure decision functions of every process: roles, ranks and
TF_CONFIG (topology), argument checks and lifecycle transitions (driver), feed assignment
(driver), GPU choice (agent), ports (TF process), paths (TF process), command lines."""

import subprocess
import sys
from types import SimpleNamespace

import re

import pytest

from tfos import topology as T
from tfos.host import gpus as G
from tfos.cluster.agent.node_agent import tf_process_command
from tfos.cluster.driver.settings import seconds as _seconds, validate_reserve
from tfos.feed.driver.scheduler import plan_chunk
from tfos.cluster.driver.lifecycle import Lifecycle, Phase, allowed
from tfos.errors import ClusterStateError, ConfigError, TFOSError
from tfos.cluster.executor.bootstrap import agent_command
from tfos.host.claims import port_candidates
from tfos.data.paths import absolute_path
from tfos.wire.messages import Column
from tfos.wire.schema import column_drift


@pytest.mark.parametrize("n,ps,master,ev,expected", [
    (1, 0, "chief", False, [("chief", 0)]),
    (2, 0, "chief", False, [("chief", 0), ("worker", 0)]),
    (2, 0, None, False, [("worker", 0), ("worker", 1)]),
    (4, 1, "chief", False, [("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1)]),
    (5, 2, "chief", True, [("ps", 0), ("ps", 1), ("chief", 0), ("evaluator", 0), ("worker", 0)]),
    (3, 0, "master", True, [("master", 0), ("evaluator", 0), ("worker", 0)]),
])
def test_assign_roles(n, ps, master, ev, expected):
    assert T.assign_roles(n, ps, master, ev) == expected


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_executors=0), "num_executors"),
    (dict(num_executors=2, num_ps=2), "leaves no node to train"),
    (dict(num_executors=2, num_ps=1, eval_node=True), "leaves no node to train"),
    (dict(num_executors=2, num_ps=-1), "num_ps"),
    (dict(num_executors=True), "num_executors"),
    (dict(num_executors=2, master_node="boss"), "master_node"),
    (dict(num_executors=2, reservation_timeout=0), "reservation_timeout"),
    (dict(num_executors=2, input_mode=7), "input_mode"),
    (dict(num_executors=2, num_gpus=-1), "num_gpus"),
    (dict(num_executors=2, num_gpus=1.5), "num_gpus"),
])
def test_validate_reserve_rejects(kwargs, match):
    args = dict(num_executors=2, num_ps=0, master_node="chief", eval_node=False, reservation_timeout=60,
                input_mode=0, num_gpus=0)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        validate_reserve(**args)


def _nodes(roles):
    return [SimpleNamespace(node_index=i, job_name=j, task_index=t, host=f"h{i}", address=f"h{i}:{2000 + i}")
            for i, (j, t) in enumerate(roles)]


@pytest.mark.parametrize("roles,spec", [
    ([("chief", 0), ("worker", 0)], {"chief": ["h0:2000"], "worker": ["h1:2001"]}),
    ([("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0), ("worker", 1)],
     {"ps": ["h0:2000"], "chief": ["h1:2001"], "worker": ["h3:2003", "h4:2004"]}),
    ([("worker", 1), ("worker", 0)], {"worker": ["h1:2001", "h0:2000"]}),
])
def test_cluster_spec_orders_by_task_and_excludes_evaluator(roles, spec):
    assert T.cluster_spec(_nodes(roles)) == spec


def test_tf_config_per_node():
    nodes = _nodes([("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0)])
    assert T.tf_config(nodes, 3) == {"cluster": {"ps": ["h0:2000"], "chief": ["h1:2001"], "worker": ["h3:2003"]},
                                     "task": {"type": "worker", "index": 0}}
    assert T.tf_config(nodes, 2)["task"] == {"type": "evaluator", "index": 0}


@pytest.mark.parametrize("job,idx,rank", [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("ps", 0, None),
                                          ("evaluator", 0, None)])
def test_training_rank(job, idx, rank):
    roles = [("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0), ("worker", 1)]
    assert T.training_rank(job, idx, roles) == rank
    assert T.num_training_nodes(roles) == 3


@pytest.mark.parametrize("cluster,task,expected", [
    ({"chief": ["a"], "worker": ["b", "c"]}, ("worker", 1), (2, 3)),
    ({"master": ["a"], "worker": ["b"], "ps": ["p"]}, ("master", 0), (0, 2)),
    ({"worker": ["a", "b"]}, ("worker", 0), (0, 2)),
])
def test_rank_and_size_from_tf_config(cluster, task, expected):
    assert T.rank_and_size(*task, cluster) == expected


def test_rank_order_puts_the_chief_first():
    nodes = _nodes([("worker", 1), ("ps", 0), ("worker", 0), ("master", 0)])
    assert [(n.job_name, n.task_index) for n in T.rank_order(nodes)] == [("master", 0), ("worker", 0), ("worker", 1)]


@pytest.mark.parametrize("current,target,ok", [
    (Phase.RESERVED, Phase.STARTING, True), (Phase.RESERVED, Phase.SHUT_DOWN, True),
    (Phase.RESERVED, Phase.RUNNING, False), (Phase.STARTING, Phase.RUNNING, True),
    (Phase.STARTING, Phase.SHUT_DOWN, False), (Phase.RUNNING, Phase.SHUTTING_DOWN, True),
    (Phase.RUNNING, Phase.STARTING, False), (Phase.SHUTTING_DOWN, Phase.SHUT_DOWN, True),
    (Phase.SHUT_DOWN, Phase.FAILED, False), (Phase.FAILED, Phase.SHUT_DOWN, False),
    (Phase.RUNNING, Phase.FAILED, True), (Phase.FAILED, Phase.RUNNING, False),
])
def test_lifecycle_transitions(current, target, ok):
    assert allowed(current, target) is ok


def test_lifecycle_records_the_first_error_once_and_rejects_illegal_moves():
    life = Lifecycle()
    with pytest.raises(ClusterStateError, match="from reserved to running"):
        life.to(Phase.RUNNING)
    life.to(Phase.STARTING)
    first, second = TFOSError("first"), TFOSError("second")
    assert life.fail(first) is True
    assert life.fail(second) is False
    assert life.error is first and life.phase is Phase.FAILED
    with pytest.raises(TFOSError, match="first"):
        life.require(Phase.RUNNING, "train")


@pytest.mark.parametrize("live,counts,rows,slack,expected", [
    # a whole chunk to the node with the fewest rows (lowest index on ties) while shares stay within slack
    ([0, 1], {0: 0, 1: 0}, 50, 64, [(0, 50)]), ([0, 1], {0: 10, 1: 0}, 100, 100, [(1, 100)]),
    ([1, 2], {0: 0, 1: 5, 2: 5}, 30, 64, [(1, 30)]), ([], {0: 0}, 30, 64, []), ([3], {3: 900}, 5000, 64, [(3, 5000)]),
    # else split to level the shares, the fewest first; pieces of at least MIN_PIECE rows
    ([0, 1], {0: 0, 1: 0}, 1000, 64, [(0, 500), (1, 500)]),
    ([0, 1], {0: 0, 1: 300}, 1000, 64, [(0, 650), (1, 350)]),
    ([0, 1, 2], {0: 500, 1: 0, 2: 100}, 300, 64, [(1, 200), (2, 100)]),
    ([0, 1, 2], {0: 0, 1: 0, 2: 0}, 301, 64, [(0, 101), (1, 100), (2, 100)]),
    ([0, 1], {0: 0, 1: 970}, 1000, 64, [(0, 1000)]),  # the leveling piece (15 rows) would be too small
])
def test_plan_chunk_keeps_shares_level(live, counts, rows, slack, expected):
    pieces = plan_chunk(live, counts, rows, slack)
    assert pieces == expected and sum(r for _, r in pieces) == (rows if live else 0)


@pytest.mark.parametrize("live,counts,rows,local,expected", [
    ([0, 1], {0: 0, 1: 0}, 1000, (1,), [(1, 1000)]),  # the producer's host runs node 1: no network
    ([0, 1], {0: 900, 1: 0}, 1000, (0,), [(0, 1000)]),  # up to two chunks ahead of the fewest
    ([0, 1], {0: 1500, 1: 0}, 600, (0,), [(1, 600)]),  # more: the fewest rows take it
    ([0, 1, 2], {0: 0, 1: 0, 2: 900}, 1000, (1, 2), [(1, 1000)]),  # the local node with the fewest rows
    ([0, 1], {0: 0, 1: 0}, 1000, (0, 1), [(0, 500), (1, 500)]),  # every node local: no preference
    ([0], {0: 0, 1: 0}, 1000, (1,), [(0, 1000)]),  # the local node finished reading
])
def test_plan_chunk_prefers_a_node_on_the_producing_host(live, counts, rows, local, expected):
    assert plan_chunk(live, counts, rows, 64, local) == expected


@pytest.mark.parametrize("live,counts,rows,local,expected", [
    # placed a quarter at a time: the local node runs at most two quarters ahead, not two chunks
    ([0, 1], {0: 0, 1: 0}, 4000, (0,), [(0, 3000), (1, 1000)]),
    ([0, 1], {0: 5000, 1: 0}, 4000, (0,), [(1, 4000)]),  # far ahead: every quarter goes to the fewest
    ([0, 1], {0: 0, 1: 3000}, 4000, (0,), [(0, 4000)]),  # behind: all of it stays local
    ([0, 1], {0: 0, 1: 0}, 200, (0,), [(0, 200)]),  # too small to part: as before the last wave
    ([0, 1], {0: 0, 1: 0}, 4000, (), [(0, 2000), (1, 2000)]),  # no locality: leveled as ever
    ([0, 1], {0: 0, 1: 0}, 4001, (0,), [(0, 3001), (1, 1000)]),  # every row placed
])
def test_plan_chunk_places_the_last_wave_by_quarters(live, counts, rows, local, expected):
    assert plan_chunk(live, counts, rows, 64, local, 0, last_wave=True) == expected
    if local:  # before the last wave the whole chunk stays local while within two chunks
        assert plan_chunk([0, 1], {0: 0, 1: 0}, 4000, 64, (0,), 0) == [(0, 4000)]


@pytest.mark.parametrize("started,partitions,live,expected", [
    (3, 32, 2, False), (29, 32, 2, False), (30, 32, 2, True), (31, 32, 2, True), (3, 0, 2, False), (1, 2, 2, True),
])
def test_last_wave_table(started, partitions, live, expected):
    from tfos.feed.driver.scheduler import last_wave

    assert last_wave(started, partitions, live) is expected


I, F, S = Column("a", "number", "int64"), Column("a", "number", "double"), Column("a", "string", "string")
V8, V9 = Column("v", "list<item: float>", "fixed_size_list<item: float>[8]", "8"), \
    Column("v", "list<item: float>", "fixed_size_list<item: float>[9]", "9")


@pytest.mark.parametrize("first,cols,expected", [
    ((I, V8), (I, V8), None),
    ((I,), (F,), None),  # numbers may widen
    ((I,), (S,), "column 'a' holds string, but earlier rows of this feed hold int64"),
    ((V8,), (V9,), "column 'v' holds fixed_size_list<item: float>[9] of shape (9), but earlier rows of this "
                   "feed hold fixed_size_list<item: float>[8] of shape (8)"),
    ((I,), (I, V8), "column 'v' appears (the feed began with columns ['a'])"),
    ((I, V8), (I,), "column 'v' is missing (the feed began with columns ['a', 'v'])"),
    ((I, V8), (V8, I), "columns are reordered: ['v', 'a'], the feed began with ['a', 'v']"),
])
def test_column_drift(first, cols, expected):
    assert column_drift(first, cols) == expected


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
    assert G.choose_gpus(num, spark, G.parse_nvidia_smi(SMI), claimed) == expected


@pytest.mark.parametrize("num,smi,claimed,match", [
    (1, "", [], "nvidia-smi is not there or shows no GPU"),
    (4, SMI, [], "3 of 4 are free"),
    (2, SMI, ["0", "2"], "1 of 4 are free"),
])
def test_choose_gpus_errors(num, smi, claimed, match):
    with pytest.raises(ConfigError, match=match):
        G.choose_gpus(num, None, G.parse_nvidia_smi(smi), claimed)


def test_parse_nvidia_smi_skips_garbage():
    assert G.parse_nvidia_smi("0, 1, 2\nbad line\n1, N/A, 3\n") == [("0", 1, 2)]


def test_gpu_environment():
    assert G.gpu_environment(["1", "3"])["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert G.gpu_environment([])["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("eph,taken", [((32768, 60999), []), ((32768, 60999), [20000, 20001]),
                                       ((1024, 60000), []), ((10000, 65535), [])])
def test_port_candidates_avoid_ephemeral_range_and_taken(eph, taken):
    ports = port_candidates(eph, taken, count=50, seed=3)
    assert len(ports) == len(set(ports)) == 50
    for p in ports:
        assert not (eph[0] <= p <= eph[1]) or eph == (10000, 65535)
        assert p not in taken and 1024 <= p <= 65535


@pytest.mark.parametrize("path,fs,wd,user,expected", [
    # TensorFlowOnSpark's TFNode.hdfs_path, for each form of fs.defaultFS
    ("hdfs://nn:8020/data", "hdfs://nn:8020", "/w", "u", "hdfs://nn:8020/data"),
    ("file:///tmp/x", "hdfs://nn:8020", "/w", "u", "file:///tmp/x"),
    ("gs://bucket/x", "hdfs://nn:8020", "/w", "u", "gs://bucket/x"),
    ("/data/x", "hdfs://nn:8020", "/w", "u", "hdfs://nn:8020/data/x"),
    ("data/x", "hdfs://nn:8020", "/w", "u", "hdfs://nn:8020/user/u/data/x"),
    ("data/x", "hdfs://nn:8020/", "/w", "u", "hdfs://nn:8020/user/u/data/x"),
    ("/data/x", "hdfs://", "/w", "u", "hdfs:///data/x"),
    ("data/x", "hdfs://", "/w", "u", "hdfs:///user/u/data/x"),
    ("/x", "viewfs://", "/w", "bob", "viewfs:///x"),
    ("x", "viewfs://cluster", "/w", "bob", "viewfs://cluster/user/bob/x"),
    ("x", "viewfs://cluster/", "/w", "bob", "viewfs://cluster/user/bob/x"),
    ("data/x", "file://", "/work/dir", "u", "file:///work/dir/data/x"),
    ("data/x", "file:///", "/work/dir", "u", "file:///work/dir/data/x"),
    ("/abs/x", "file:///", "/work/dir", "u", "file:///abs/x"),
    ("/abs/x", "file://", "/work/dir", "u", "file:///abs/x"),
    ("../x", "", "/work/dir", "u", "file:///work/dir/../x"),
    ("x", "s3a://bucket", "/w", "u", "s3a://bucket/x"),
    ("/x", "s3a://bucket/", "/w", "u", "s3a://bucket/x"),
])
def test_absolute_path(path, fs, wd, user, expected):
    assert absolute_path(path, fs, wd, user) == expected


def test_command_lines():
    assert tf_process_command("/py") == ["/py", "-u", "-m", "tfos.cluster.node"]
    assert agent_command("/py") == ["/py", "-u", "-m", "tfos.cluster.agent"]


def _imported_after(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "; import sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_package_root_loads_neither_driver_nor_pyspark_nor_tensorflow():
    mods = _imported_after("import tfos; from tfos import InputMode, TFOSError, NodeFailedError")
    assert not [m for m in mods if m.startswith(("tfos.cluster.driver", "pyspark", "tensorflow", "tfos.cluster.node"))]


def test_node_and_agent_packages_do_not_load_driver_modules():
    for entry in ("tfos.cluster.node.runtime", "tfos.feed.node.datafeed", "tfos.cluster.agent.node_agent", "tfos.feed.executor.producer"):
        mods = _imported_after(f"import {entry}")
        assert not [m for m in mods if m.startswith(("tfos.cluster.driver", "tensorflow"))], entry


def test_the_driver_api_loads_no_pyarrow_until_data_is_fed():
    mods = _imported_after("from tfos import TFCluster")  # e.g. Horovod's TF 2.15 env pins an older stack
    assert not [m for m in mods if m.startswith(("pyarrow", "tensorflow", "tfos.feed.executor.producer"))]


def test_public_names_resolve_lazily():
    mods = _imported_after("import tfos; tfos.TFCluster; tfos.NodeContext; tfos.DataFeed; tfos.TFNode")
    assert "tfos.api" in mods and "tfos.cluster.node.context" in mods


@pytest.mark.parametrize("value,allow_zero,expected", [(1, False, 1.0), (0.5, False, 0.5), (0, True, 0.0),
                                                       (0, False, None), (-1, True, None), (None, False, None),
                                                       (True, False, None), ("5", False, None)])
def test_duration_settings_are_checked_before_they_cross_to_the_nodes(value, allow_zero, expected):
    if expected is None:
        with pytest.raises(ConfigError, match="heartbeat_timeout must be"):
            _seconds("heartbeat_timeout", value, allow_zero)
    else:
        assert _seconds("heartbeat_timeout", value, allow_zero) == expected


@pytest.mark.parametrize("conf,env,expected", [
    ({"spark.driver.host": "10.1.2.3"}, {}, ("10.1.2.3", "0.0.0.0", 0, "spark.driver.host")),
    ({"spark.driver.host": "h", "spark.driver.bindAddress": "10.1.2.3"}, {}, ("h", "10.1.2.3", 0, "spark.driver.host")),
    ({"spark.driver.host": "h"}, {"TFOS_SERVER_HOST": "10.9.9.9", "TFOS_SERVER_PORT": "4000"},
     ("10.9.9.9", "10.9.9.9", 4000, "TFOS_SERVER_HOST")),
    ({"spark.driver.host": "h"}, {"TFOS_SERVER_PORT": "4001"}, ("h", "0.0.0.0", 4001, "spark.driver.host")),
])
def test_control_address(conf, env, expected):
    from tfos.cluster.driver.spark import control_address

    a = control_address(conf, env)
    assert (a.advertise, a.bind, a.port, a.setting) == expected
    assert a.ports == (a.port,)


@pytest.mark.parametrize("conf,env,client,expected", [
    # Spark Connect: the control service runs in the client, which is not the Spark driver
    ({}, {}, "10.7.0.4", ("10.7.0.4", "0.0.0.0", "TFOS_SERVER_HOST", "TFOS_SERVER_HOST")),
    ({}, {"TFOS_SERVER_HOST": "10.9.9.9"}, "10.7.0.4", ("10.9.9.9", "10.9.9.9", "TFOS_SERVER_HOST",
                                                         "TFOS_SERVER_HOST/TFOS_SERVER_PORT")),
    # behind NAT: listen on all interfaces, tell executors the forwarded address
    ({}, {"TFOS_ADVERTISE_HOST": "203.0.113.5"}, "10.7.0.4", ("203.0.113.5", "0.0.0.0", "TFOS_ADVERTISE_HOST",
                                                               "TFOS_SERVER_HOST")),
    ({"spark.driver.host": "h", "spark.driver.bindAddress": "10.1.2.3"}, {"TFOS_ADVERTISE_HOST": "gw"}, None,
     ("gw", "10.1.2.3", "TFOS_ADVERTISE_HOST", "spark.driver.bindAddress")),
])
def test_control_address_of_a_client_and_behind_nat(conf, env, client, expected):
    from tfos.cluster.driver.spark import control_address

    a = control_address(conf, env, default_advertise=client)
    assert (a.advertise, a.bind, a.setting, a.bind_setting) == expected


@pytest.mark.parametrize("xml,expected", [
    ("<configuration><property><name>fs.defaultFS</name><value>hdfs://nn:8020</value></property></configuration>",
     "hdfs://nn:8020"),
    ("<configuration><property><name>fs.default.name</name><value> hdfs://old:9000 </value></property>"
     "</configuration>", "hdfs://old:9000"),
    ("<configuration><property><name>fs.default.name</name><value>hdfs://old</value></property><property>"
     "<name>fs.defaultFS</name><value>viewfs://c</value></property></configuration>", "viewfs://c"),
    ("<configuration><property><name>io.file.buffer.size</name><value>4096</value></property></configuration>",
     None),
    ("<configuration><property><name>fs.defaultFS</name>", None),  # not XML
    ("", None),
])
def test_core_site_default_fs(xml, expected):
    from tfos.data.fs import core_site_default_fs

    assert core_site_default_fs(xml) == expected


@pytest.mark.parametrize("environ,files,expected", [
    ({}, {}, "file:///"),
    ({"HADOOP_CONF_DIR": "/c"}, {"/c/core-site.xml": "hdfs://a"}, "hdfs://a"),
    ({"HADOOP_CONF_DIR": "/c", "HADOOP_HOME": "/h"}, {"/h/etc/hadoop/core-site.xml": "hdfs://b"}, "hdfs://b"),
    ({"HADOOP_CONF_DIR": "/c", "HADOOP_HOME": "/h"}, {"/c/core-site.xml": "hdfs://a",
                                                       "/h/etc/hadoop/core-site.xml": "hdfs://b"}, "hdfs://a"),
    ({"HADOOP_HOME": "/h"}, {"/h/etc/hadoop/core-site.xml": None}, "file:///"),  # sets no defaultFS
])
def test_hadoop_default_fs_as_a_connect_barrier_task_reads_it(environ, files, expected):
    """Under Spark Connect the client cannot ask the driver JVM: each barrier task reads its host's
    Hadoop configuration."""
    from tfos.data.fs import hadoop_default_fs

    def read(path):
        if path not in files:
            raise FileNotFoundError(path)
        fs = files[path]
        prop = f"<property><name>fs.defaultFS</name><value>{fs}</value></property>" if fs else ""
        return f"<configuration>{prop}</configuration>"

    assert hadoop_default_fs(environ, read) == expected


@pytest.mark.parametrize("value,ports", [("9997-9999", (9997, 9998, 9999)), ("8888", (8888,)), ("0", (0,)),
                                         ("5000-5000", (5000,))])
def test_control_address_port_range(value, ports):
    """TensorFlowOnSpark's TFOS_SERVER_PORT forms: one port, or a range tried in order."""
    from tfos.cluster.driver.spark import control_address

    a = control_address({"spark.driver.host": "h"}, {"TFOS_SERVER_PORT": value})
    assert a.ports == ports and a.port == ports[0]


@pytest.mark.parametrize("port", ["x", "-1", "70000", "9999-9997", "1-2-3", "0-5", "65535-65536", "9997-", "-9999"])
def test_control_address_rejects_bad_port(port):
    from tfos.cluster.driver.spark import control_address

    with pytest.raises(ConfigError, match="TFOS_SERVER_PORT"):
        control_address({}, {"TFOS_SERVER_PORT": port})


@pytest.mark.parametrize("advertise,master,resolves_to,fails", [
    ("127.0.0.1", "spark://10.0.0.9:7077", "127.0.0.1", True),
    ("myhost", "yarn", "127.0.1.1", True),          # Debian's /etc/hosts maps the hostname to 127.0.1.1
    ("myhost", "yarn", "10.0.0.5", False),
    ("127.0.0.1", "local-cluster[2,1,1024]", "127.0.0.1", False),
    ("127.0.0.1", "local[*]", "127.0.0.1", False),
    ("127.0.0.1", "spark://127.0.0.1:7077", "127.0.0.1", False),   # a standalone master on loopback: all local
    ("localhost", "spark://10.0.0.1:7077,10.0.0.2:7077", "127.0.0.1", True),
    ("gone", "k8s://x", None, False),                # unresolvable here: executors may resolve it
])
def test_check_advertised_refuses_loopback_for_remote_executors(advertise, master, resolves_to, fails):
    from tfos.cluster.driver.spark import ControlAddress, check_advertised

    def resolve(name):
        if name[0].isdigit():
            return name
        if resolves_to is None:
            raise OSError("unknown host")
        return resolves_to

    address = ControlAddress(advertise, "0.0.0.0", 0, "spark.driver.host")
    if fails:
        with pytest.raises(ConfigError, match="loopback.*set spark.driver.host"):
            check_advertised(address, master, resolve)
    else:
        check_advertised(address, master, resolve)


@pytest.mark.parametrize("retryable,done,max_restarts,running,resumable,final,action,reason", [
    ((True,), 0, 0, True, True, False, "FAIL", "max_restarts=0"),
    ((True,), 0, 1, True, True, False, "RESTART", "restart 1 of 1"),
    ((True, True), 1, 2, True, True, False, "RESTART", "restart 2 of 2"),
    ((True,), 2, 2, True, True, False, "FAIL", "all 2 restart(s)"),
    ((False,), 0, 3, True, True, False, "FAIL", "NonRetryable"),
    ((True, False), 0, 3, True, True, False, "FAIL", "NonRetryable"),
    ((True,), 0, 3, False, True, False, "FAIL", "not running"),  # still starting, or already ended
    # InputMode.SPARK: no train() waiting: hold until one comes; shutdown() waiting: nothing to resume
    ((True,), 0, 1, True, False, False, "HOLD", "next train()"),
    ((True,), 0, 1, True, False, True, "FAIL", "feeds ended"),
    ((True,), 1, 1, True, False, False, "FAIL", "all 1 restart(s)"),  # no restart left: fail at once
])
def test_failure_policy_restart_or_fail(retryable, done, max_restarts, running, resumable, final, action, reason):
    from tfos.cluster.driver.lifecycle import Action, ClusterView, decide
    from tfos.errors import NodeFailure

    failures = tuple(NodeFailure(i, "worker", i, "h", "boom", retryable=r) for i, r in enumerate(retryable))
    d = decide(ClusterView(failures, max_restarts=max_restarts, restarts_done=done, running=running,
                           resumable=resumable, final=final))
    assert d.action is Action[action] and reason in d.reason


@pytest.mark.parametrize("job,survivable,peers,started,max_restarts,action", [
    ("worker", ("worker",), 1, True, 1, "LOSE_NODE"),  # ps backend: the coordinator goes on with the other worker
    ("worker", ("worker",), 3, True, 2, "LOSE_NODE"),
    ("worker", ("worker",), 3, True, 0, "FAIL"),       # max_restarts=0 keeps failing fast
    ("worker", ("worker",), 0, True, 1, "RESTART"),    # the last worker: nothing left to run the functions
    ("worker", ("worker",), 1, False, 1, "RESTART"),   # still starting: the rendezvous needs every node
    ("ps", ("worker",), 1, True, 1, "RESTART"),        # a ps holds variables: restart every node
    ("chief", ("worker",), 1, True, 1, "RESTART"),
    ("worker", (), 1, True, 1, "RESTART"),             # MWMS/Horovod: a collective needs every rank
])
def test_failure_policy_losing_a_node(job, survivable, peers, started, max_restarts, action):
    from tfos.cluster.driver.lifecycle import Action, ClusterView, decide
    from tfos.errors import NodeFailure

    d = decide(ClusterView((NodeFailure(1, job, 1, "h", "killed"),), max_restarts=max_restarts,
                           survivable_jobs=survivable, peers_running=peers, all_started=started))
    assert d.action is Action[action]


@pytest.mark.parametrize("size,max_nodes,offered,expected", [
    (2, 4, 3, 3), (2, 4, 6, 4), (2, 4, 2, None), (2, 4, 1, None),  # fewer slots than nodes: nothing to grow into
    (4, 4, 6, None), (2, 4, None, None),  # at the max; Spark cannot say
])
def test_grow_to_table(size, max_nodes, offered, expected):
    from tfos.cluster.driver.lifecycle import grow_to

    assert grow_to(size, max_nodes, offered) == expected


@pytest.mark.parametrize("offered,lo,hi,waited,size_wait,expected", [
    (4, 2, 4, 0.0, 15.0, 4),      # all offered: at once
    (6, 2, 4, 0.0, 15.0, 4),      # more than asked: the max
    (None, 2, 4, 0.0, 15.0, 4),   # Spark cannot say: the max (the barrier stage waits)
    (3, 2, 4, 1.0, 15.0, None),   # fewer: wait size_wait for more
    (3, 2, 4, 15.0, 15.0, 3),     # ... then start with what is offered
    (3, 2, 4, 0.0, 0.0, 3),       # size_wait=0: at once
    (1, 2, 4, 99.0, 15.0, None),  # below min: wait on (reservation_timeout ends it)
    (2, 2, 2, 0.0, 15.0, 2),
])
def test_size_to_start_table(offered, lo, hi, waited, size_wait, expected):
    from tfos.cluster.driver.settings import size_to_start

    assert size_to_start(offered, lo, hi, waited, size_wait) == expected


@pytest.mark.parametrize("num_executors,min_executors,expected", [
    (4, None, (4, 4)), (4, 2, (2, 4)), ((2, 4), None, (2, 4)), ([3, 3], None, (3, 3)),
    (4, 5, "min_executors must be an int from 1 to num_executors=4"), (4, 0, "from 1"),
    ((2, 4), 2, "without min_executors="), ((1, 2, 3), None, "as a range"), (0, None, "positive int"),
    (4, True, "from 1"),
])
def test_size_range_table(num_executors, min_executors, expected):
    from tfos.cluster.driver.settings import size_range
    from tfos.errors import ConfigError

    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            size_range(num_executors, min_executors)
    else:
        assert size_range(num_executors, min_executors) == expected


@pytest.mark.parametrize("shape,size,expected", [
    ((0, "chief", False), 3, [("chief", 0), ("worker", 0), ("worker", 1)]),
    ((0, "chief", False), 2, [("chief", 0), ("worker", 0)]),
    ((1, "chief", True), 4, [("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0)]),
    ((0, None, False), 2, [("worker", 0), ("worker", 1)]),
])
def test_a_smaller_cluster_keeps_every_remaining_nodes_role(shape, size, expected):
    from tfos.cluster.driver.settings import ClusterShape

    s = ClusterShape(*shape)
    assert s.roles(size) == expected and s.roles(size + 2)[:size] == expected
    assert s.smallest == shape[0] + (1 if shape[2] else 0) + 1


@pytest.mark.parametrize("assigned,started,partitions,live,expected", [
    # the rows of `live` partitions of the average size so far: what the last wave can level
    (16000, 3, 32, 2, 10666), (16000, 16, 32, 2, 2000), (16000, 16, 32, 3, 3000), (0, 0, 32, 2, 0),
    (16000, 30, 32, 2, 0), (16000, 31, 32, 2, 0), (16000, 3, 0, 2, 0),  # the last wave; partitions unknown
])
def test_locality_slack_lets_a_node_run_ahead_until_the_last_partitions(assigned, started, partitions, live, expected):
    from tfos.feed.driver.scheduler import locality_slack

    assert locality_slack(assigned, started, partitions, live) == expected


@pytest.mark.parametrize("now, last, disconnected, stopping, expected", [
    (10.0, 9.5, None, False, None),                 # heartbeating
    (20.0, 9.0, None, False, "no heartbeat for 10s"),  # silent past heartbeat_timeout: lost
    (10.0, 9.0, 9.5, False, None),                  # connection closed 0.5 s ago: within the grace
    (12.5, 9.0, 9.5, False, "did not come back within"),  # closed 3 s ago, no heartbeat since: lost
    (12.5, 11.0, 9.5, False, None),                 # closed, then a heartbeat on a new connection: alive
    (12.5, 9.5, 9.5, False, "did not come back within"),  # closed right after its last heartbeat
    (10.0, 9.0, 9.5, True, "while the driver was stopping"),  # being stopped: no grace
    (10.0, 9.5, None, True, None),                  # being stopped, still connected: waits for its exit
    (10.0, 9.8, 9.5, True, None),                   # being stopped, came back on a new connection
])
def test_agent_lost_table(now, last, disconnected, stopping, expected):
    from tfos.cluster.driver.lifecycle import agent_lost

    why = agent_lost(now, last, disconnected, timeout=10.0, grace=2.5, stopping=stopping)
    assert why is None if expected is None else expected in why


@pytest.mark.parametrize("interval, timeout, expected", [
    (1.0, 60.0, 2.5), (0.2, 60.0, 2.0), (4.0, 60.0, 10.0), (4.0, 6.0, 6.0)])
def test_disconnect_grace_table(interval, timeout, expected):
    from tfos.cluster.driver.lifecycle import disconnect_grace

    assert disconnect_grace(interval, timeout) == expected


@pytest.mark.parametrize("nbytes, max_pieces, piece_bytes, expected", [
    (0, 4, 4 << 20, 1), (1000, 4, 4 << 20, 1), ((8 << 20) - 1, 4, 4 << 20, 1),  # under two pieces: whole
    (8 << 20, 4, 4 << 20, 2), (12_000_004, 4, 4 << 20, 2), (16 << 20, 4, 4 << 20, 4),
    (256 << 20, 4, 4 << 20, 4),  # no more parts than Gloo has threads
    (64 << 20, 1, 4 << 20, 1), (64 << 20, 4, 0, 1),  # one thread, or splitting off
])
def test_gloo_split_count_table(nbytes, max_pieces, piece_bytes, expected):
    from tfos.tf.gloo import split_count

    assert split_count(nbytes, max_pieces, piece_bytes) == expected


@pytest.mark.parametrize("ranks, expected", [(1, 1), (2, 4), (3, 1), (8, 1)])
def test_gloo_splits_only_on_two_ranks(ranks, expected):
    from tfos.tf.gloo import max_pieces

    assert max_pieces(ranks) == expected


@pytest.mark.parametrize("proposals, ranks, expected", [
    ({}, [0, 1], -1),  # nobody proposed yet
    ({0: 7}, [0, 1], -1),  # rank 1 still to propose
    ({0: 7, 1: 8}, [0, 1], 8),  # the highest: each rank waits at its own, none is past it
    ({0: 7, 1: 8, 2: 3}, [0, 1], 8),  # a rank that exited meanwhile no longer counts
    ({0: 5, 1: 5, 2: 5}, [0, 1, 2], 5),
    ({0: 0}, [0], 0),  # step 0 is a step
    ({0: 4}, [], -1),  # no training rank runs: nothing to save
])
def test_save_target_table(proposals, ranks, expected):
    from tfos.cluster.driver.lifecycle import save_target

    assert save_target(proposals, ranks) == expected
