"""tfos across hosts: a Spark standalone master on the bridge, one worker per host (network
namespaces, tests/multihost/hosts.py). The driver is this pytest process on the bridge address."""

import argparse
import ipaddress
import json
import os

import numpy as np
import pytest

from hosts import DRIVER_ADDRESS, SUBNET
from tfos import InputMode, TFCluster
from tfos.errors import ConfigError, TFOSError


def digits_main(args, ctx):
    import digits_spark

    ctx.report(tf_config=os.environ["TF_CONFIG"])
    digits_spark.main_fun(args, ctx)


def _on_subnet(address: str) -> bool:
    return ipaddress.ip_address(address.rsplit(":", 1)[0]) in SUBNET


def test_digits_trains_on_two_hosts_feeding_rdd_and_dataframe_across_hosts(mh_spark, hosts):
    import digits_spark

    sc = mh_spark.sparkContext
    args = argparse.Namespace(batch_size=32, learning_rate=0.01, train_calls=2)
    (xtr, ytr), (xte, yte) = digits_spark.load()
    cluster = TFCluster.run(sc, digits_main, args, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            heartbeat_timeout=20)
    try:
        assert cluster.driver_host == DRIVER_ADDRESS  # the bridge address, never loopback
        spec = cluster.cluster_spec
        addresses = spec["chief"] + spec["worker"]
        node_hosts = {a.rsplit(":", 1)[0] for a in addresses}
        assert len(node_hosts) == 2 and all(_on_subnet(a) for a in addresses), spec
        assert DRIVER_ADDRESS not in node_hosts
        rdd = sc.parallelize(list(zip(xtr, ytr.tolist())), 4)
        df = mh_spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(xtr, ytr)],
                                      "features array<float>, label long").repartition(4)
        fed = cluster.train(rdd, num_epochs=3) + cluster.train(df, num_epochs=3)
        assert fed == 6 * len(ytr)
        per_node = cluster.feed_rows_total
        assert set(per_node) == {0, 1} and all(v > 0 for v in per_node.values()), per_node  # both hosts fed
        from tfos.tunnel import addresses as private

        block = private.block_for(cluster.config.cluster_id)  # encrypted (the default): TF names private addresses
        in_private = sorted(f"{private.node_address(block, n['node_index'])}:{n['tf_port']}" for n in cluster.nodes)
        for m in cluster.metrics().values():  # what each TF process saw in TF_CONFIG
            tf_config = json.loads(m["tf_config"])
            assert sorted(tf_config["cluster"]["chief"] + tf_config["cluster"]["worker"]) == in_private
        test = sc.parallelize(list(zip(xte, yte.tolist())), 4)
        preds = cluster.inference(test).collect()
        assert len(preds) == len(yte)  # every row answered
        acc = float(np.mean(np.asarray(preds) == yte))
    finally:
        cluster.shutdown(timeout=300)
    assert acc >= 0.8


# Parameter servers across three hosts (digits_ps to accuracy, ps, chief and worker on three hosts):
# test_outsiders.py, whose outsiders probe that cluster's servers once it has trained.


def allreduce_per_batch(batch, ctx):
    """MWMS: feed.batches(batch) with one all-reduce per step; reports steps and rows read."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train_mode=True)
    steps = rows = 0
    for ids, _x in feed.batches(batch):
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda n=len(ids): tf.constant(float(n))), axis=None)
        steps, rows = steps + 1, rows + len(ids)
        ctx.report(step=steps, rows=rows)


@pytest.mark.parametrize("sizes", [[5000] * 4, [12000, 5000, 2000, 1000]], ids=["4 equal", "skewed"])
def test_equal_steps_across_hosts_drop_at_most_a_batch_less_one_per_rank(mh_spark, hosts, sizes):
    """The issue's case: 20,000 rows in 4 partitions fed to 2 nodes on 2 hosts, the default
    uneven='drop'. Each partition is one chunk, and chunks go to a node on their own host when they
    can: the shares part by thousands of rows (11,048 and 8,952 measured before). At the end of
    the feed the node with the surplus sends its last rows to the other, so every rank reads its
    share to the row and equal steps drop at most batch - 1 rows per rank."""
    sc = mh_spark.sparkContext
    batch = 32
    parts, start = [], 0
    for n in sizes:
        parts.append([(start + k, [float(k % 7)] * 8) for k in range(n)])
        start += n
    cluster = TFCluster.run(sc, allreduce_per_batch, batch, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            report_interval=0.2, heartbeat_timeout=20)
    try:
        spec = cluster.cluster_spec
        assert len({a.rsplit(":", 1)[0] for a in spec["chief"] + spec["worker"]}) == 2, spec  # two hosts
        assert cluster.train(sc.parallelize(parts, len(parts)).flatMap(lambda p: p)) == start
    finally:
        cluster.shutdown(timeout=300)
    m = cluster.metrics()
    per_node = cluster.feed_rows_total  # what each rank read, after levelling
    assert max(per_node.values()) - min(per_node.values()) <= 1 and sum(per_node.values()) == start, per_node
    assert m[0]["step"] == m[1]["step"] == -(-min(per_node.values()) // batch), m
    dropped = [m[i].get("rows_dropped", 0) for i in (0, 1)]
    assert all(d <= batch - 1 for d in dropped) and m[0]["rows"] + m[1]["rows"] + sum(dropped) == start, (m, dropped)


def gpu_main(args, ctx):
    ctx.report(gpus=",".join(ctx.gpus), cuda=os.environ.get("CUDA_VISIBLE_DEVICES", ""))


def _gpus_by_host(cluster):
    metrics = cluster.metrics()
    by_host = {}
    for n in cluster.nodes:
        by_host.setdefault(n["host"], []).append(metrics[n["node_index"]]["gpus"])
    return by_host


def test_gpu_claims_are_per_host(mh_spark, hosts):
    """Each host's fake nvidia-smi reports GPUs 0 and 1; no Spark GPU resources, so the agents claim
    GPUs in their host's registry. A second worker on host 1 puts two nodes on one host."""
    sc = mh_spark.sparkContext
    ring = {"communication": "ring"}  # TF's own collectives on GPUs (NCCL would be refused under encryption)
    cluster = TFCluster.run(sc, gpu_main, None, 3, 0, num_gpus=1, master_node="chief", backend_options=ring)
    cluster.shutdown(timeout=120)
    by_host = _gpus_by_host(cluster)
    assert len(by_host) == 3 and all(g == ["0"] for g in by_host.values()), by_host  # GPU 0 on every host

    hosts.add_worker(hosts.hosts[0])
    from conftest import wait_executors

    wait_executors(sc, 4)
    try:
        cluster = TFCluster.run(sc, gpu_main, None, 4, 0, num_gpus=1, master_node="chief", backend_options=ring)
        cluster.shutdown(timeout=120)
        by_host = _gpus_by_host(cluster)
        assert sorted(by_host[hosts.hosts[0].address]) == ["0", "1"], by_host  # two nodes on one host: never both 0
        assert all(g == ["0"] for h, g in by_host.items() if h != hosts.hosts[0].address), by_host
    finally:
        hosts.remove_extra_workers()


def test_loopback_driver_address_fails_at_start_naming_the_setting(mh_spark, monkeypatch):
    monkeypatch.setenv("TFOS_SERVER_HOST", "127.0.0.1")
    with pytest.raises(ConfigError, match="loopback.*TFOS_SERVER_HOST"):
        TFCluster.reserve(mh_spark.sparkContext, 2, 0)


def test_unreachable_driver_address_fails_at_start_naming_spark_driver_host(mh_spark, monkeypatch):
    """192.0.2.2 is this machine's own address, but the hosts have no route to it."""
    import time

    own = [a for a in os.popen("ip -o -4 addr show").read().split() if "/" in a and not a.startswith("127.")
           and not ipaddress.ip_interface(a).network.overlaps(SUBNET)]
    if not own:
        pytest.skip("this machine has no address outside the test subnet")
    monkeypatch.setenv("TFOS_SERVER_HOST", own[0].split("/")[0])
    t0 = time.monotonic()
    with pytest.raises(TFOSError, match=r"cannot reach the driver at that address: set TFOS_SERVER_HOST \(or spark.driver.host"):
        TFCluster.run(mh_spark.sparkContext, gpu_main, None, 2, 0, reservation_timeout=60)
    assert time.monotonic() - t0 < 90
