"""Feed bytes that cross hosts, with the scheduler's locality on and off, in ONE run on the
multi-host harness (tests/multihost/hosts.py: a Spark standalone cluster whose hosts are network
namespaces on a bridge; needs root).

Two hosts, one 1-core executor each, a 2-node cluster (one TF node per host); a train() of
generated MNIST-shaped rows (784 float32 + label) whose partitions Spark spreads over both
executors. Every host-to-host byte passes the bridge: the bytes each host sends into it (its
veth's counters on the bridge side) during the feed, over the bytes fed, is the cross-host
share (it also counts the small control traffic to the driver on the bridge).

    bash scripts/bench.sh locality [--rows 300000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import feed  # noqa: E402 (the feed benchmark's rows)
from feed import ROW_BYTES, make_rdd  # noqa: E402


def count_every_feed(args, ctx):
    """main_fun: read feed after feed (one per train()) until the cluster shuts down."""
    while True:
        data = ctx.get_data_feed(train_mode=True)
        for _features, _labels in data.batches(1024):
            pass
        if data.closed:
            return


def sent_into_bridge(hosts) -> int:
    """Bytes the hosts have sent into the bridge so far (rx of their veths' bridge ends)."""
    total = 0
    for h in hosts.hosts:
        with open(f"/sys/class/net/{h.veth_bridge}/statistics/rx_bytes") as f:
            total += int(f.read())
    return total


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from hosts import Hosts, can_run, wait_executors

    from pyspark import cloudpickle

    from tfos import InputMode, TFCluster

    cloudpickle.register_pickle_by_value(feed)  # the executors cannot import bench/feed.py
    why = can_run()
    if why:
        sys.exit(f"the multi-host harness cannot run here: {why}")
    with Hosts(2) as hosts:
        spark = hosts.spark_session("tfos-bench-locality")
        sc = spark.sparkContext
        wait_executors(sc, 2)
        sc.setLogLevel(os.environ.get("TFOS_BENCH_SPARK_LOG", "ERROR"))
        cluster = TFCluster.run(sc, count_every_feed, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                                progress=False, preimport_tensorflow=False)
        print(f"locality benchmark: 2 hosts, nodes on {sorted(n['host'] for n in cluster.nodes)}, "
              f"{args.rows:,d} rows of {ROW_BYTES} B per feed, {args.partitions} partitions")
        try:
            rdd = make_rdd(sc, args.rows, args.partitions)
            results = {True: [], False: []}
            for _ in range(args.rounds):
                for locality in (False, True):
                    cluster.scheduler.locality = locality
                    before, t0 = sent_into_bridge(hosts), time.perf_counter()
                    made, fed = dict(cluster.scheduler.produced), dict(cluster.feed_rows_total)
                    n = cluster.train(rdd, num_epochs=1)
                    secs, crossed = time.perf_counter() - t0, sent_into_bridge(hosts) - before
                    share = crossed / (n * ROW_BYTES)
                    results[locality].append(share)
                    made = {h: r - made.get(h, 0) for h, r in cluster.scheduler.produced.items()}
                    fed = {i: r - fed.get(i, 0) for i, r in cluster.feed_rows_total.items()}
                    print(f"  locality {'on ' if locality else 'off'}: {n:,d} rows in {secs:5.2f} s, "
                          f"{crossed / 1e6:8.1f} MB crossed hosts = {share:6.1%} of the bytes fed; rows made per "
                          f"host {made}, fed per node {fed}", flush=True)
        finally:
            cluster.shutdown(timeout=300)
            spark.stop()
    off, on = max(results[False]), max(results[True])
    print(f"  cross-host share, worst of {args.rounds}: locality off {off:.1%}, on {on:.1%}   (target <= 10%)")


if __name__ == "__main__":
    main()
