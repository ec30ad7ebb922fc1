"""A tfos application across hosts with Spark's own security on, for issue 53's attacker from another
host (test_outsiders.py): its master, workers and driver share ``spark.authenticate`` and its secret
from a properties file only root reads, with ``spark.network.crypto.enabled`` and I/O encryption.

    python secured_app.py spark://198.51.100.1:PORT PROPERTIES ATTACKER_NETNS ADDRESS@NETNS@WORKER_PID ...

A 2-node cluster is fed slowly; meanwhile another user (uid 65534) in ATTACKER_NETNS asks every port
of this application's JVMs (the driver's, and those of each worker's process tree: the worker and
its executor) for every broadcast block. Prints one line: ``RESULT {json}``.

Then the fault matrix's driver kill, on this application (no second one to start): a 2-node cluster
(heartbeat_timeout 10 s, stop grace 2 s) fed a slow reader without end; prints ``FEEDING`` once
both nodes read fed rows, and waits to be SIGKILLed."""

import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from driver_to_kill import slow_reader  # noqa: E402
from hosts import DRIVER_ADDRESS  # noqa: E402
from spark_blocks import (Keep, holds_secret, jvm_listeners, plaintext, quiet_block_errors,  # noqa: E402
                          read_slowly, row_text, steal)

ROWS = 2000


def tree_ports(address: str, netns: str, root: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP listener of the JVMs among process ``root`` and its descendants
    (a worker and its executor), in ``netns``."""
    pids = {root} | {p.pid for p in psutil.Process(root).children(recursive=True)}
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-Htlnp"], capture_output=True, text=True,
                         timeout=30).stdout
    ports = set()
    for line in out.splitlines():
        owners = {int(part.split(",")[0]) for part in line.split("pid=")[1:]}
        if owners & pids and '"java"' in line:
            ports.add((address, int(line.split()[3].rsplit(":", 1)[1])))
    return sorted(ports)


def main(master: str, properties: str, attacker: str, workers: list[str]) -> None:
    from pyspark.sql import SparkSession

    from tfos import InputMode, TFCluster

    kept = Keep()
    logging.getLogger("tfos").addHandler(kept)
    with open(properties) as f:
        conf = dict(line.strip().split(" ", 1) for line in f if line.strip())
    builder = (SparkSession.builder.master(master).appName("tfos-secured-across-hosts")
               .config("spark.driver.host", DRIVER_ADDRESS).config("spark.driver.bindAddress", DRIVER_ADDRESS)
               .config("spark.executor.cores", "1").config("spark.executor.memory", "1g")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + 120
    while len(tracker.getExecutorInfos()) - 1 < len(workers):
        if time.monotonic() > deadline:
            raise RuntimeError("the executors of the secured application did not register within 120s")
        time.sleep(0.2)
    canary = secrets.token_hex(16)
    control = sc.broadcast(canary)  # what the attacker would get if Spark served it
    first = control._jbroadcast.id()
    rdd = sc.parallelize(range(ROWS), 4).map(lambda i: (row_text(i), i))
    cluster = TFCluster.run(sc, read_slowly, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            report_interval=0.1, progress=False)
    try:
        driver_ports = jvm_listeners(sc)
        targets = list(driver_ports)
        for spec in workers:
            address, netns, pid = spec.split("@")
            targets += tree_ports(address, netns, int(pid))
        feeding = threading.Thread(target=cluster.train, args=(rdd,), kwargs={"chunk_rows": 10, "uneven": None})
        feeding.start()
        deadline = time.monotonic() + 120
        while sum(m.get("rows", 0) for m in cluster.metrics().values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        with quiet_block_errors(sc):
            answer = steal(targets, first, 64, namespace=attacker)
        during = sum(m.get("rows", 0) for m in cluster.metrics().values())
        feeding.join(300)
        secret = cluster.config.key.secret
    finally:
        cluster.shutdown(timeout=120)
        control.destroy()
    text = plaintext(answer)
    result = {"ports": len(targets), "host_ports": len(targets) - len(driver_ports),
              "refused": len(answer["errors"]), "blocks": len(answer["blocks"]), "canary": canary.encode() in text,
              "secret": holds_secret(text, secret), "rows_found": any(row_text(i).encode() in text for i in range(ROWS)),
              "rows_during_attack": during, "rows": sum(m["rows"] for m in cluster.metrics().values()),
              "nodes_hosts": sorted({n["host"] for n in cluster.nodes}),
              "crypto": sc.getConf().get("spark.network.crypto.enabled"), "warnings": kept.lines}
    print("RESULT " + json.dumps(result), flush=True)
    feed_until_killed(sc)


def feed_until_killed(sc) -> None:
    """A cluster fed forever (the driver is SIGKILLed meanwhile): ``FEEDING`` once both nodes read."""
    from tfos import InputMode, TFCluster

    cluster = TFCluster.run(sc, slow_reader, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            heartbeat_interval=1.0, heartbeat_timeout=10.0, stop_grace_secs=2.0, progress=False)
    threading.Thread(target=cluster.train, args=(sc.parallelize(range(10_000_000), 4),), daemon=True).start()
    while not (len(cluster.metrics()) == 2 and all(m.get("rows", 0) >= 200 for m in cluster.metrics().values())):
        time.sleep(0.2)
    print("FEEDING", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
