"""Outsiders against tfos jobs across hosts: from another host (the root namespace, on the bridge)
and from a node's own host as another user, a TensorFlow remote eager client against every TF server
and every port the job listens on, a torch store client where Gloo's rendezvous used to be, raw
bytes to every listener. A clear cluster is the control: there the same probe runs an operation
inside the job's TF process. Encrypted (the default), nothing gets in, and the job works."""

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest

import outsider
from hosts import DRIVER_ADDRESS
from spark_blocks import found_nothing, jvm_listeners, quiet_block_errors, read_slowly, row_text, steal
from tfos import InputMode, TFCluster
from tfos.testing import wait_for


def serve_until_done(done_file, ctx):
    """MWMS (TF's collectives and a Gloo group beside them): one all-reduce of each, then stay up until
    ``done_file`` appears (every host sees the same file system)."""
    import tensorflow as tf

    from tfos import distribute

    strategy = ctx.strategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    grads = strategy.run(lambda: distribute.allreduce_gradients([tf.fill([1000], float(ctx.rank + 1))]))
    ctx.report(total=float(total), gloo=float(strategy.experimental_local_results(grads)[0][0][0]),
               gloo_on=distribute._gloo is not None)
    while not os.path.exists(done_file):
        time.sleep(0.2)


def ps_train_then_serve(args, ctx):
    """The chief of a PS cluster (the ps and worker nodes run tf.distribute.Server): digits_ps's
    training, then stay up until ``args.done`` appears, the servers with it."""
    import digits_ps

    digits_ps.main_fun(args, ctx)
    ctx.report(trained=1)
    while not os.path.exists(args.done):
        time.sleep(0.2)


def _listening(host) -> set[int]:
    """The ports listening in ``host``'s namespace, but the Spark JVMs' (the job's processes: tunnels,
    TF processes, agents)."""
    out = subprocess.run(host.exec_args("ss", "-Htlnp"), capture_output=True, text=True, timeout=30).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()
            if line.strip() and '"java"' not in line}


def _java_listening(host) -> set[int]:
    """The Spark JVMs' ports in ``host``'s namespace (its worker and executor)."""
    out = subprocess.run(host.exec_args("ss", "-Htlnp"), capture_output=True, text=True, timeout=30).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if '"java"' in line}


def _job_of(cluster, address):
    return next(job for job, addrs in cluster.cluster_spec.items() if address in addrs)


def test_a_remote_eager_client_runs_code_in_a_clear_cluster_but_nothing_gets_into_an_encrypted_one(
        mh_sc, hosts, tmp_path):
    done = tmp_path / "done"
    clear = TFCluster.run(mh_sc, serve_until_done, str(done), 2, 0, master_node="chief", encrypt=False,
                          report_interval=0.2)
    try:
        assert wait_for(lambda: len(clear.metrics()) == 2 and all("total" in m for m in clear.metrics().values()), 240)
        address = clear.cluster_spec["worker"][0]
        control, = outsider.run_all([outsider.eager(address, "worker")])  # the control: what anyone could do
        assert control["ran"] and "tfos.cluster.node" in control["answer"], control
    finally:
        done.touch()
        clear.shutdown(timeout=120)

    done.unlink()
    cluster = TFCluster.run(mh_sc, serve_until_done, str(done), 2, 0, master_node="chief", report_interval=0.2)
    try:
        assert wait_for(lambda: len(cluster.metrics()) == 2 and all("total" in m for m in cluster.metrics().values()),
                        240)
        metrics = cluster.metrics().values()
        assert all(m["total"] == 2.0 and m["gloo_on"] and m["gloo"] == 3.0 for m in metrics), list(metrics)
        assert all(n["tunnel_mode"] == "netns" for n in cluster.nodes)
        node_hosts = [hosts.by_address(n["host"]) for n in cluster.nodes]
        spec = [a for addrs in cluster.cluster_spec.values() for a in addrs]
        ports = {h.address: _listening(h) for h in node_hosts}
        assert all(str(n["tf_port"]) not in map(str, ports[n["host"]]) for n in cluster.nodes), ports
        # from another host: every TF address, every port the job listens on, as TF's remote eager client
        probes = [outsider.eager(address, _job_of(cluster, address)) for address in spec]
        probes += [outsider.eager(f"{h}:{port}") for h, listening in ports.items() for port in sorted(listening)]
        # from a node's own host, as another user: its loopback, the TF address and every listener there
        h = node_hosts[0]
        probes += [outsider.eager(target, namespace=h.netns, other_user=True)
                   for target in [f"127.0.0.1:{p}" for p in sorted(ports[h.address])] + [a for a in spec
                                                                                        if a.startswith(h.address)]]
        # Gloo's old rendezvous: a store client at the leader's TF address, from another host and as another user
        leader_host, leader_port = cluster.cluster_spec["chief"][0].rsplit(":", 1)
        probes += [outsider.store(leader_host, int(leader_port)),
                   outsider.store("127.0.0.1", int(leader_port), namespace=hosts.by_address(leader_host).netns,
                                  other_user=True)]
        results = outsider.run_all(probes)
        assert len(results) >= 8 and all(r["loaded"] for r in results), [r for r in results if not r["loaded"]]
        assert not any(r["ran"] for r in results), [r for r in results if r["ran"]]
        # still working after the probes: every rank answers
        assert all(m["gloo"] == 3.0 for m in cluster.metrics().values())
    finally:
        done.touch()
        cluster.shutdown(timeout=120)


def test_parameter_servers_train_across_three_hosts_and_no_outsider_reaches_their_servers(mh_sc, hosts, tmp_path):
    """backend='ps' (ps, chief and worker on three hosts, encrypted: the default) trains digits_ps to
    accuracy with every scheduled step counted on the ps; then, the servers still up, TF's remote
    eager client from another host gets into no TF address and no node's tunnel."""
    import argparse

    import digits_tf

    data = str(tmp_path / "data")
    out = str(tmp_path / "out")
    done = tmp_path / "done"
    args = argparse.Namespace(epochs=2, batch_size=32, learning_rate=0.01, data_dir=data, output_dir=out, input="files",
                              train_rows=digits_tf.prepare_shards(data)["train_rows"], done=str(done))
    cluster = TFCluster.reserve(mh_sc, 3, num_ps=1, backend="ps", input_mode=InputMode.TENSORFLOW,
                                report_interval=0.2)
    try:
        cluster.start(ps_train_then_serve, args)
        spec = cluster.cluster_spec
        hosts_of = {job: {a.rsplit(":", 1)[0] for a in addrs} for job, addrs in spec.items()}
        assert len(set().union(*hosts_of.values())) == 3, spec  # ps, chief and worker on three hosts
        assert set(spec) == {"ps", "chief", "worker"} and all(n["tunnel_mode"] == "netns" for n in cluster.nodes)
        assert wait_for(lambda: any(m.get("trained") for m in cluster.metrics().values()), 300), cluster.metrics()
        probes = [outsider.eager(a, job) for job, addrs in spec.items() for a in addrs]
        probes += [outsider.eager(f"{n['host']}:{n['tunnel_port']}", "ps") for n in cluster.nodes]  # each tunnel
        results = outsider.run_all(probes)
        assert len(results) == 6 and all(r["loaded"] for r in results), results
        assert not any(r["ran"] for r in results), [r for r in results if r["ran"]]
    finally:
        done.touch()
        cluster.shutdown(timeout=300)
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    assert result["scheduled_steps"] == result["counted_steps"] and result["accuracy"] > 0.5


@pytest.mark.skipif(os.geteuid() != 0, reason="the attacker runs as another user (uid 65534)")
def test_from_another_host_every_spark_block_holds_no_secret_and_no_fed_row(mh_sc, hosts):
    """Issue 53's attack across hosts, on Spark's defaults: a 2-node cluster is fed from all three
    executors (the node-less one gets the secret as a local property of its tasks), and meanwhile
    another user on the third host asks every Spark JVM port of the other hosts and of the driver for
    every broadcast block. It gets the control broadcast and the feeding job's closure; no block
    holds the cluster's secret or a fed row."""
    canary = secrets.token_hex(16)
    control = mh_sc.broadcast(canary)
    first = control._jbroadcast.id()
    rows = 2000
    rdd = mh_sc.parallelize(range(rows), 6).map(lambda i: (row_text(i), i))
    cluster = TFCluster.run(mh_sc, read_slowly, None, 2, 0, input_mode=InputMode.SPARK, master_node="chief",
                            report_interval=0.1)
    try:
        node_hosts = {n["host"] for n in cluster.nodes}
        attacker = next(h for h in hosts.hosts if h.address not in node_hosts)
        targets = [(DRIVER_ADDRESS, port) for _, port in jvm_listeners(mh_sc)]
        targets += [(h.address, port) for h in hosts.hosts if h is not attacker for port in sorted(_java_listening(h))]
        feeding = threading.Thread(target=cluster.train, args=(rdd,), kwargs={"chunk_rows": 10, "uneven": None})
        feeding.start()
        assert wait_for(lambda: sum(m.get("rows", 0) for m in cluster.metrics().values()) > 0, 120)
        with quiet_block_errors(mh_sc):
            answer = steal(targets, first, 64, namespace=attacker.netns)
        feeding.join(300)
        secret = cluster.config.key.secret
    finally:
        cluster.shutdown(timeout=120)
        control.destroy()
    assert sum(m["rows"] for m in cluster.metrics().values()) == rows
    fetched = found_nothing(answer, canary, first, secret, [row_text(i) for i in range(rows)])
    print(f"from {attacker.address}: {len(targets)} ports, {len(fetched)} blocks fetched: {fetched}")


def _lines_of(proc) -> tuple[list, threading.Thread]:
    """The lines ``proc`` prints, as they come, and the thread that appends them (it ends at EOF)."""
    lines: list = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def test_from_another_host_under_sparks_auth_every_port_refuses_blocks_then_its_driver_killed_leaves_nothing(
        hosts, tmp_path, record_property):
    """Issue 53's attack across hosts with Spark's own security on: a second application on its own
    master and workers (h1, h2), which share ``spark.authenticate`` and its secret from a file only
    root reads, with Spark's network and I/O encryption. While its 2-node cluster is fed, another
    user on h3 asks every port of the application's JVMs (driver, workers, executors) for every
    broadcast block: every port refuses it, and the feed and the cluster work.

    Then the fault matrix's driver kill on that application: its driver is SIGKILLed while feeding
    a second cluster; every agent, TF process and feeding task on both hosts is gone within
    heartbeat_timeout + stop grace (+ the agent's last report attempts)."""
    import psutil

    from tfos.testing import tfos_processes

    conf = {"spark.authenticate": "true", "spark.authenticate.secret": secrets.token_hex(16),
            "spark.network.crypto.enabled": "true", "spark.io.encryption.enabled": "true"}
    properties = hosts.properties_file("secured", conf)
    _proc, port = hosts.start_master("master-secured", properties)
    workers = [(h, hosts.add_worker(h, ("master-secured", port), properties)) for h in hosts.hosts[:2]]
    attacker = hosts.hosts[2]
    here = os.path.dirname(os.path.abspath(__file__))
    stderr = tmp_path / "secured_app.stderr"
    driver = None
    try:
        with open(stderr, "w") as err:
            driver = subprocess.Popen([sys.executable, os.path.join(here, "secured_app.py"),
                                       f"spark://{DRIVER_ADDRESS}:{port}", properties, attacker.netns]
                                      + [f"{h.address}@{h.netns}@{w.pid}" for h, w in workers],
                                      cwd=here, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
                                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        lines, reader = _lines_of(driver)
        wait_for(lambda: any(x.startswith("FEEDING") for x in lines) or driver.poll() is not None, 480, 0.2)
        if driver.poll() is not None:
            reader.join(10)  # what it printed before it exited
        line = next((x for x in lines if x.startswith("RESULT ")), None)
        assert line, "".join(lines)[-2000:] + stderr.read_text()[-4000:]
        out = json.loads(line[7:])
        print(f"from {attacker.address} under Spark's auth: {out}")
        assert out["crypto"] == "true" and out["nodes_hosts"] == sorted(h.address for h, _ in workers), out
        assert out["host_ports"] >= 4 and out["rows_during_attack"] < 2000, out  # workers and executors, mid-feed
        assert out["refused"] == out["ports"] and out["blocks"] == 0, out
        assert not out["canary"] and not out["secret"] and not out["rows_found"], out
        assert out["rows"] == 2000, out
        assert not any("launch messages" in w for w in out["warnings"]), out["warnings"]  # Spark's RPC is secured

        # the driver killed
        assert any(x.startswith("FEEDING") for x in lines), ("the driver program never fed its nodes",
                                                             stderr.read_text()[-4000:])

        def app_processes():
            found = []
            for _h, w in workers:
                try:
                    found += [p for p in psutil.Process(w.pid).children(recursive=True)
                              if "org.apache.spark.deploy.worker.Worker" not in " ".join(p.cmdline())]
                except psutil.Error:
                    pass
            return found + tfos_processes()

        assert any("pyspark.daemon" in " ".join(p.cmdline()) or "pyspark/daemon" in " ".join(p.cmdline())
                   for p in app_processes() if p.is_running()) or tfos_processes()
        t0 = time.monotonic()
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's Python and its JVM
        bound = 10.0 + 2.0 + 15.0
        gone = wait_for(lambda: not app_processes(), bound + 30, 0.25)
        secs = time.monotonic() - t0
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in app_processes() if p.is_running()] if not gone else []
        assert gone, left
        assert secs < bound, secs
        record_property("seconds_to_no_process", round(secs, 1))
    finally:
        if driver is not None:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        hosts.remove_extra_workers()
