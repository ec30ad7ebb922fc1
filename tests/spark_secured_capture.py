"""The marked feed of tests/integration/test_security.py in a Spark application that authenticates and
encrypts its own traffic (spark.authenticate, spark.network.crypto.enabled with AES-GCM,
spark.io.encryption.enabled): a clear tfos cluster (encrypt=False) and one with tfos's default,
which issue 53's attacker (another user fetching blocks from every JVM port) then tries.
Runs in its own process (one Spark driver per process); prints one JSON line with the marker
copies the capture found on each cluster's ports and what the driver logged. Needs root."""

import json
import logging
import os
import secrets
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from capture import Capture  # noqa: E402
from spark_blocks import Keep, holds_secret, jvm_listeners, plaintext, steal  # noqa: E402

MARK = "tfos-marker-7Q2x"  # 16 bytes
ROWS = 2000


def count_marked(mark, ctx):
    """Count the rows fed to this node and the markers in them."""
    feed = ctx.get_data_feed(train_mode=True)
    seen = rows = 0
    for text, _label in feed.batches(100):
        rows += len(text)
        seen += sum(str(t).count(mark) for t in text)
    ctx.report(rows=rows, seen=seen)


def job_ports(cluster) -> set[int]:
    """The ports a tfos job listens on: the control service, the feed hubs, the node tunnels."""
    return {cluster.service.port} | {p for n in cluster.nodes for p in (n["feed_port"], n["tunnel_port"]) if p}


def feed_marked(cluster, rdd, attack=None) -> dict:
    """Feed ``rdd`` to a started cluster under a capture of loopback, shut it down; the marker copies
    found on its ports, whether it was encrypted, and the rows and markers its nodes read. With
    ``attack(cluster)``, what it returns (run after the feed, before the shutdown) as "attack"."""
    cap = Capture("lo")
    attacked = {}
    try:
        # on the channel, as from another host: a same-host feed's chunks go through shared memory
        # (wire.ring) and never reach a socket, which would leave this capture nothing to compare
        cluster.train(rdd, num_epochs=1, shared_memory=False)
        if attack is not None:
            attacked["attack"] = attack(cluster)
        cluster.shutdown(timeout=120)
    finally:
        cap.stop()
    metrics = list(cluster.metrics().values())
    return {**attacked, "copies": cap.payload(job_ports(cluster)).count(MARK.encode()), "encrypted": cluster.config.key.encrypt,
            "rows": sum(m["rows"] for m in metrics), "seen": sum(m["seen"] for m in metrics)}


def main():
    from tfos import InputMode, TFCluster
    from tfos.testing import local_cluster_session

    kept = Keep()
    logging.getLogger("tfos").addHandler(kept)
    events = tempfile.mkdtemp(prefix="tfos-eventlog-")
    spark = local_cluster_session(2, 1, 1024, app_name="tfos-secured-capture", conf={
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}", "spark.eventLog.compress": "false",
        "spark.authenticate": "true", "spark.authenticate.secret": secrets.token_hex(16),
        "spark.network.crypto.enabled": "true", "spark.network.crypto.authEngineVersion": "2",
        "spark.network.crypto.cipher": "AES/GCM/NoPadding", "spark.io.encryption.enabled": "true"})
    sc = spark.sparkContext
    rdd = sc.parallelize(range(ROWS), 4).map(lambda i: (MARK * 4, i))
    canary = secrets.token_hex(16)
    control = sc.broadcast(canary)  # what the attacker would get if Spark served it

    def attack(cluster):
        """Issue 53's attacker (tests/spark_blocks.py) against every port of the application's JVMs."""
        targets = jvm_listeners(sc)
        answer = steal(targets, control._jbroadcast.id(), 64)
        text = plaintext(answer)
        return {"ports": len(targets), "refused": len(answer["errors"]), "blocks": len(answer["blocks"]), "canary": canary.encode() in text,
                "secret": holds_secret(text, cluster.config.key.secret)}

    out = {}
    used = []
    for name, encrypt in (("clear", False), ("default", None)):
        cluster = TFCluster.run(sc, count_marked, MARK, 2, 0, input_mode=InputMode.SPARK, encrypt=encrypt,
                                report_interval=0.1, progress=False)
        out[name] = feed_marked(cluster, rdd, attack if name == "default" and os.geteuid() == 0 else None)
        used.append(cluster.config.key.secret)
    control.destroy()
    out["warnings"] = kept.lines
    spark.stop()  # the event log is complete now: the feeding jobs' local property, redacted?
    log = "".join(open(os.path.join(d, f), errors="replace").read() for d, _, fs in os.walk(events) for f in fs)
    out["eventlog"] = {"bytes": len(log), "secret": any(s in log for s in used),
                       "redacted": '"tfos.cluster.secret":"*********(redacted)"' in log}
    shutil.rmtree(events, ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
