"""The security decisions of reserve() and the node tunnel's pure parts, from tables."""

import dataclasses

import pytest

from tfos.backends import make_backend
from tfos.cluster.agent.node_agent import tunnel_netns
from tfos.cluster.driver import security
from tfos.errors import ConfigError
from tfos.tunnel import addresses
from tfos.tunnel.agent import TunnelError, parse_ready, shim_environment
from tfos.wire import messages as M


@pytest.mark.parametrize("encrypt,conf,expected,noted", [
    (None, {}, True, False),  # on by default
    (None, {"spark.authenticate": "true"}, True, False),
    (True, {}, True, False),
    (False, {}, False, False),
    (False, {"spark.network.crypto.enabled": "true"}, False, True),  # said, not overridden
    (False, {"spark.ssl.rpc.enabled": " TRUE "}, False, True),
    (False, {"spark.ssl.enabled": "false", "spark.authenticate": None}, False, False),
])
def test_encryption_follows_the_argument_and_says_when_spark_is_secured_but_tfos_not(encrypt, conf, expected, noted):
    on, note = security.encryption(encrypt, conf)
    assert on is expected and bool(note) is noted
    if noted:
        assert "encrypt=False although Spark secures" in note


AUTH, CRYPTO = "spark.authenticate", "spark.network.crypto.enabled"


@pytest.mark.parametrize("conf,encrypt,said", [
    ({}, True, "takes any peer"),  # Spark's defaults
    ({AUTH: "false", CRYPTO: "true"}, True, "takes any peer"),  # crypto without auth is not auth
    ({AUTH: "true"}, True, "authenticates its RPC but sends it in clear"),
    ({AUTH: "true", CRYPTO: "true"}, True, ""),
    ({AUTH: "true", "spark.ssl.rpc.enabled": "true"}, True, ""),
    ({AUTH: "true", "spark.ssl.enabled": "true"}, True, ""),
    ({}, False, ""),  # a clear cluster claims nothing
])
def test_what_sparks_rpc_leaves_open_of_the_secret(conf, encrypt, said):
    got = security.spark_rpc_exposure(conf, encrypt)
    assert (said in got) if said else got == ""
    if said:
        assert got.endswith(f"Set {security.SPARK_RPC_FIX} for the Spark application to close this")
        assert "launch messages" in got


def test_encryption_by_default_even_without_spark_security():
    assert security.ENCRYPT_BY_DEFAULT is True and security.encryption(None, {"spark.authenticate": "false"})[0]


def test_encrypt_must_be_a_bool_or_none():
    with pytest.raises(ConfigError, match="encrypt must be True, False or None"):
        security.encryption("yes", {})


@pytest.mark.parametrize("backend,options,gpus,refused", [
    ("mwms", {}, 0, False),
    ("mwms", {"implementation": "gloo"}, 0, False),
    ("mwms", {"communication": "ring"}, 2, False),  # TF's own ring over gRPC: protected
    ("mwms", {}, 1, True),  # auto with GPUs is NCCL
    ("mwms", {"communication": "nccl"}, 0, True),
    ("ps", {}, 0, False),
])
def test_backends_name_the_traffic_tfos_cannot_protect(backend, options, gpus, refused):
    found = make_backend(backend, "grpc", **options).unprotected(gpus)
    assert bool(found) is refused


def test_horovod_is_unprotected_traffic():
    from tfos.backends.horovod import HorovodBackend

    assert "Horovod's collectives" in HorovodBackend().unprotected(0)[0]


@pytest.mark.parametrize("unprotected,encrypt,allow,error,warning", [
    ([], True, False, False, False),
    (["NCCL"], False, False, False, False),  # nothing is promised in clear mode
    (["NCCL"], True, False, True, False),
    (["NCCL"], True, True, False, True),
])
def test_unprotected_traffic_is_refused_with_a_way_through(unprotected, encrypt, allow, error, warning):
    refused, accepted = security.refusal(unprotected, encrypt, allow)
    assert bool(refused) is error and bool(accepted) is warning
    if refused:
        assert "allow_unprotected=True" in refused and "encrypt=False" in refused


def _node(i, host, mode):
    return M.NodeInfo(i, "worker", i, host, 1, 2, 3, 4000 + i, mode)


@pytest.mark.parametrize("modes,allow,hosts", [
    (["netns", "netns"], False, None),
    (["netns", "loopback"], False, "h1"),
    (["loopback", "loopback"], False, "h0, h1"),
    (["loopback"], True, None),  # accepted: no warning
    (["", ""], False, None),  # clear clusters have no tunnel
])
def test_hosts_without_private_namespaces_are_named_once(modes, allow, hosts):
    text = security.exposure([_node(i, f"h{i}", m) for i, m in enumerate(modes)], allow)
    assert (text == "") is (hosts is None)
    if hosts:
        assert f"host(s) {hosts} " in text and "other users of that host" in text and "allow_unprotected" in text


@pytest.mark.parametrize("uri,plain", [
    ("http://mlflow.example:5000", True), ("https://mlflow.example", False), ("http://127.0.0.1:5000", False),
    ("http://localhost:5000", False), ("file:///tmp/mlruns", False), ("databricks", False), (None, False),
    ("sqlite:///x.db", False),
])
def test_plain_http_to_another_host_is_noticed(uri, plain):
    assert security.plain_http_elsewhere(uri) is plain


# --------------------------------------------------------------------------- the tunnel's pure parts

def test_each_cluster_has_its_block_and_port_and_each_node_its_address():
    block, port = addresses.block_for("c1"), addresses.tf_port_for("c1")
    assert block == addresses.block_for("c1") and 64 <= int(block.split(".")[1]) < 192
    assert 20000 <= port < 30000
    assert len({addresses.block_for(f"c{i}") for i in range(400)}) > 100  # spread over the blocks
    assert [addresses.node_address("127.77", i) for i in (0, 1, 254, 255, 65533)] == [
        "127.77.0.1", "127.77.0.2", "127.77.0.255", "127.77.1.0", "127.77.255.254"]
    with pytest.raises(ValueError):
        addresses.node_address("127.77", 65534)


def test_the_peer_table_names_other_nodes_with_tunnels_and_marks_same_host_ones():
    """A same-host node's control socket is passed on (its namespace is reached straight);
    another host's never is, nor a node without a namespace of its own."""
    ctl = dataclasses.replace
    nodes = [ctl(_node(0, "10.0.0.1", "netns"), tunnel_control="/n0/tunnel.sock"), _node(1, "10.0.0.1", "netns"),
             ctl(_node(2, "10.0.0.2", "netns"), tunnel_control="/n2/tunnel.sock"),
             M.NodeInfo(3, "evaluator", 0, "10.0.0.3", 1, 0, 9), _node(4, "10.0.0.1", "loopback")]
    assert addresses.peer_table(nodes, 1, "127.77", "10.0.0.1") == [
        ["127.77.0.1", "10.0.0.1", 4000, True, "/n0/tunnel.sock"], ["127.77.0.3", "10.0.0.2", 4002, False, ""],
        ["127.77.0.5", "10.0.0.1", 4004, True, ""]]
    private = addresses.in_private_network(nodes, "127.77")
    assert [n.address for n in private[:3]] == ["127.77.0.1:1", "127.77.0.2:1", "127.77.0.3:1"]


@pytest.mark.parametrize("line,expected", [
    ("READY 4242 netns\n", (4242, "netns", "")),
    ("READY 1 loopback unshare: Operation not permitted\n", (1, "loopback", "unshare: Operation not permitted")),
])
def test_the_tunnels_first_line(line, expected):
    assert parse_ready(line) == expected


@pytest.mark.parametrize("line,match", [
    ("FAILED cannot bind\n", "failed to start: cannot bind"),
    ("READY x netns\n", "instead of READY"),
    ("hello\n", "instead of READY"),
])
def test_a_tunnel_that_does_not_start_says_why(line, match):
    with pytest.raises(TunnelError, match=match):
        parse_ready(line)


def test_the_shim_goes_first_in_ld_preload_and_the_tf_process_learns_its_network():
    info = M.TunnelInfo(4000, "netns", "/p/ctl.sock", "127.77", "127.77.0.2", 21000)
    env = shim_environment(info, "/c/shim.so", {"LD_PRELOAD": "/usr/lib/libjemalloc.so"})
    assert env["LD_PRELOAD"] == "/c/shim.so /usr/lib/libjemalloc.so"
    assert (env["TFOS_TUNNEL_CONTROL"], env["TFOS_TUNNEL_BLOCK"], env["TFOS_TUNNEL_SELF"], env["TFOS_TUNNEL_TF_PORT"]) \
        == ("/p/ctl.sock", "127.77", "127.77.0.2", "21000")
    assert shim_environment(info, "/c/shim.so", {})["LD_PRELOAD"] == "/c/shim.so"


@pytest.mark.parametrize("cluster_env,env,expected", [
    ({}, {}, "auto"), ({"TFOS_TUNNEL_NETNS": "off"}, {}, "off"), ({}, {"TFOS_TUNNEL_NETNS": "0"}, "off"),
    ({"TFOS_TUNNEL_NETNS": "auto"}, {"TFOS_TUNNEL_NETNS": "off"}, "auto"),
])
def test_the_namespace_can_be_turned_off_per_cluster_or_executor(cluster_env, env, expected):
    assert tunnel_netns(cluster_env, env) == expected
