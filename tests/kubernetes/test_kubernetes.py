"""tfos on a real Kubernetes (``pytest --kubernetes``): the API server, scheduler, controller
manager and a kubelet running containers through containerd and runc, with the image built here.

* PodSecurity "restricted" is enforced on the job's namespace, and the executor pods run under it;
* digits trains to accuracy with ``spark-submit --master k8s://...`` in client and in cluster mode,
  the nodes on the pods' own loopback (tunnel mode "pod"), the tunnel prebuilt in the image;
* an outsider pod (another uid, no secret, same namespace) gets nothing from a running job: TF's
  gRPC, the tunnels, the driver's control service, a scan of the executor pods' ports.
"""

import json
import time
from pathlib import Path

import pytest

from tfos.testing.kubernetes import NAMESPACE
from tfos.testing.kubernetes import spark as k8s_spark
from tfos.testing.kubernetes.manifests import RESTRICTED

HERE = Path(__file__).parent
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits" / "digits_tf.py"


def pods(k8s, selector="spark-role=executor"):
    return json.loads(k8s.kubectl("-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]


def wait_for(what, check, timeout=300.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s")
        time.sleep(1.0)


def test_restricted_is_enforced_on_the_namespace(k8s):
    """A pod that runs as root with its capabilities is refused at admission: the namespace's pods
    (Spark's among them) run under "restricted"."""
    image = (k8s.dir / "image").read_text().strip()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rooted", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "args": ["true"],
                                    "securityContext": {"runAsUser": 0}}]}}
    done = k8s.kubectl("apply", "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0 and 'violates PodSecurity "restricted' in done.stderr, done.stderr


def digits(k8s, mode, epochs=3):
    """digits_tf.py on Kubernetes in ``mode``; its result.json and spark-submit's output."""
    out = k8s_spark.job_dir(k8s, f"digits-{mode}")
    app = str(DIGITS) if mode == "client" else "local:///opt/tfos/examples/digits/digits_tf.py"
    done = k8s_spark.spark_submit(k8s, mode, app, ["--epochs", epochs, "--data-dir", out / "data",
                                                   "--output-dir", out / "out", "--export-dir", out / "export"],
                                  extra={"spark.kubernetes.executor.deleteOnTermination": "false"}, timeout=900)
    result = out / "out" / "result.json"
    assert done.returncode == 0 and result.exists(), done.stdout[-4000:]
    return json.loads(result.read_text()), done.stdout, out


def check_executor_pods(k8s):
    """The job's executor pods ran under "restricted", as the job's uid, and their nodes said which
    tunnel they run (prebuilt in the image) and in which mode (the pod's own loopback)."""
    executors = pods(k8s)
    assert len(executors) >= 2
    for pod in executors:
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 185
        ctx = spec["containers"][0]["securityContext"]
        assert {k: ctx[k] for k in RESTRICTED} == RESTRICTED
        assert spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == k8s_spark.PRESTOP
    k8s.kubectl("-n", NAMESPACE, "delete", "pods", "-l", "spark-role=executor", "--wait=false")


@pytest.mark.parametrize("mode", ["client", "cluster"])
def test_digits_trains_to_accuracy(k8s, mode):
    result, output, out = digits(k8s, mode)
    assert result["accuracy"] >= 0.9, result
    assert (out / "export" / "saved_model.pb").exists()
    if mode == "cluster":  # the driver was a pod: its log holds the job's output
        driver = pods(k8s, "spark-role=driver")[-1]
        assert driver["status"]["phase"] == "Succeeded"
        log = k8s.kubectl("-n", NAMESPACE, "logs", driver["metadata"]["name"]).stdout
        assert "test accuracy" in log
    check_executor_pods(k8s)


def test_an_outsider_pod_gets_nothing(k8s):
    """A job holds its TF servers and tunnels up; a pod of the same image in the same namespace,
    as another uid and without the secret, tries TF's remote eager client on the executor pods
    (the TF port, the tunnel's, the nodes' private address from its own pod), junk at the tunnel
    and at the driver's control service, and a scan of every port of the executor pods. It runs
    nothing, and only the tunnel and Spark's own JVM listen on a pod's address: every listener of
    the TF processes is on the pod's loopback."""
    out = k8s_spark.job_dir(k8s, "hold")
    for f in out.glob("*"):
        f.unlink()
    control_port = 29901
    proc = k8s_spark.spark_submit(k8s, "client", str(HERE / "hold_job.py"), [out], background=True,
                                  env={"TFOS_SERVER_PORT": str(control_port)},
                                  log=k8s.logs / "spark-submit-hold.log")
    try:
        nodes = wait_for("both nodes' reports", lambda: [json.loads((out / f"node-{r}.json").read_text())
                                                         for r in (0, 1)] if all(
            (out / f"node-{r}.json").exists() for r in (0, 1)) else None, timeout=400)
        assert proc.poll() is None, (k8s.logs / "spark-submit-hold.log").read_text()[-3000:]
        assert all(n["sum"] == 2.0 for n in nodes)  # a collective went through the tunnels
        for n in nodes:  # the TF process listens on the pod's loopback only
            assert n["listeners"] and all(host.startswith("127.") for host, _ in n["listeners"]), n["listeners"]
        info = {m["node_index"]: m for m in nodes[0]["nodes"]}
        assert all(m["tunnel_mode"] == "pod" for m in info.values()), info
        targets = {"pods": [{"ip": m["host"], "tf_port": int(nodes[0]["spec"][i].rsplit(":", 1)[1]),
                             "tunnel_port": m["tunnel_port"], "private": nodes[0]["spec"][i]}
                            for i, m in sorted(info.items())],
                   "control": ["198.18.0.1", control_port]}
        result = run_outsider(k8s, targets)
        (out / "outsider.json").write_text(json.dumps({"targets": targets, "result": result}, indent=1))
    finally:
        (out / "done").touch()
        try:
            proc.wait(180)
        finally:
            if proc.poll() is None:
                proc.kill()
    for pod, target in zip(result["pods"], targets["pods"]):
        for probe in ("eager_tf_port", "eager_tunnel", "eager_private"):
            # it got as far as TF's client connecting (a probe that never loaded proves nothing), no further
            assert pod[probe]["ran"] is False and pod[probe]["loaded"], (probe, pod[probe])
        assert pod["tf_port"] == "refused", pod
        assert target["tf_port"] not in pod["open_ports"], pod["open_ports"]
        assert target["tunnel_port"] in pod["open_ports"]
        assert pod["tunnel_junk"]["closed"] and pod["tunnel_junk"]["reply"] == "", pod["tunnel_junk"]
    assert result["control"]["eager"]["ran"] is False and result["control"]["eager"]["loaded"], result["control"]
    assert result["control"]["junk"]["closed"], result["control"]
    assert proc.returncode == 0, (k8s.logs / "spark-submit-hold.log").read_text()[-3000:]


def run_outsider(k8s, targets) -> dict:
    image = (k8s.dir / "image").read_text().strip()
    # tests/outsider.py (TF's remote eager probe, as the other suites' outsiders run it) as the
    # module `outsider`, then the pod's own script
    module = (HERE.parent / "outsider.py").read_text()
    script = ("import sys, types\noutsider = sys.modules['outsider'] = types.ModuleType('outsider')\n"
              f"exec(compile({module!r}, 'outsider.py', 'exec'), outsider.__dict__)\n"
              + (HERE / "pod_outsider.py").read_text())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "outsider", "namespace": NAMESPACE},
           "spec": {"restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 4242, "runAsGroup": 4242,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                    "args": ["python", "-c", script, json.dumps(targets)],
                                    "securityContext": dict(RESTRICTED)}]}}
    k8s.kubectl("-n", NAMESPACE, "delete", "pod", "outsider", "--ignore-not-found", "--wait=true")
    k8s.kubectl("apply", "-f", "-", input=json.dumps(pod))
    phase = wait_for("the outsider pod's end", lambda: json.loads(k8s.kubectl(
        "-n", NAMESPACE, "get", "pod", "outsider", "-o", "json").stdout)["status"].get("phase") in (
        "Succeeded", "Failed") or None, timeout=400)
    log = k8s.kubectl("-n", NAMESPACE, "logs", "outsider").stdout
    assert phase, log
    line = next((x for x in log.splitlines() if x.startswith("RESULT ")), None)
    assert line, log[-3000:]
    return json.loads(line[len("RESULT "):])


def test_an_executor_pod_deleted_mid_training_loses_no_step_and_the_cluster_grows_back(k8s):
    """``kubectl delete pod`` on an executor mid-training: the kubelet runs the pod's preStop hook
    (python -m tfos.cluster.agent.evict) before it stops the JVM; every rank saves at one step, the
    cluster goes on with the other node from that step (0 steps lost, no restart counted), and grows
    back to 2 nodes at a checkpoint once Spark has replaced the executor pod; both finish."""
    out = k8s_spark.job_dir(k8s, "evict")
    for f in out.glob("*"):
        if f.is_file():
            f.unlink()
    steps = 700
    proc = k8s_spark.spark_submit(k8s, "client", str(HERE / "evict_job.py"), [out, steps], background=True,
                                  log=k8s.logs / "spark-submit-evict.log")
    try:
        def progressed():
            lasts = [out / f"last-a0-r{r}" for r in (0, 1)]
            return all(p.exists() and int(p.read_text() or 0) >= 60 for p in lasts)

        wait_for("60 steps on both ranks", progressed, timeout=400)
        worker_ip = json.loads((out / "nodes.json").read_text())["hosts"]["1"]  # node 1: the worker
        victim = next(p for p in pods(k8s) if p["status"].get("podIP") == worker_ip)
        k8s.kubectl("-n", NAMESPACE, "delete", "pod", victim["metadata"]["name"], "--wait=false")
        proc.wait(900)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (k8s.logs / "spark-submit-evict.log").read_text(errors="replace")
    assert proc.returncode == 0 and (out / "driver.json").exists(), log[-4000:]
    driver = json.loads((out / "driver.json").read_text())
    (ev,) = driver["evictions"]
    assert ev["attempt"] == 0 and "termination signal" in ev["why"], driver
    saved = [json.loads((out / f"saved-a0-r{r}.json").read_text()) for r in (0, 1)]
    assert saved[0][-1] == saved[1][-1] == ev["step"], (saved, ev)  # every rank saved at that step
    last = [int((out / f"last-a0-r{r}").read_text()) for r in (0, 1)]
    assert last == [ev["step"]] * 2, (last, ev)  # no rank stepped past it: nothing to lose
    assert driver["restarts"] == 0, driver
    assert [1, 2] in [r[:2] for r in driver["resizes"]] and len(driver["roles"]) == 2, driver  # grown back
    ranks = [json.loads((out / f"attempt-rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["steps"] == steps for r in ranks) and ranks[0]["weights"] == ranks[1]["weights"], ranks


def test_an_oom_killed_node_names_the_pods_memory_limit_and_the_setting(k8s):
    """A TF process that outgrows its executor pod is ended by the kernel's OOM killer (the pod's
    cgroup counts it); the driver's error says so with the pod's limit and the setting to raise."""
    out = k8s_spark.job_dir(k8s, "oom")
    done = k8s_spark.spark_submit(k8s, "client", str(HERE / "oom_job.py"), [out], timeout=600,
                                  log=k8s.logs / "spark-submit-oom.log")
    message = (out / "error.txt").read_text() if (out / "error.txt").exists() else done.stdout[-3000:]
    assert message.startswith("NodeFailedError"), message
    assert "by the kernel's OOM killer" in message and "memory limit of 2048 MiB" in message, message
    assert "spark.executor.memoryOverhead" in message, message
