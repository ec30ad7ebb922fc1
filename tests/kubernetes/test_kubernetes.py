"""tfos on a real Kubernetes (``pytest --kubernetes``): the API server, scheduler, controller
manager and a kubelet running containers through containerd and runc, with the image built here.

* PodSecurity "restricted" is enforced on the job's namespace, and the executor pods run under it;
* digits trains to accuracy with ``spark-submit --master k8s://...`` in client and in cluster mode,
  the nodes on the pods' own loopback (tunnel mode "pod"), the tunnel prebuilt in the image;
* an outsider pod (another uid, no secret, same namespace) gets nothing from a running job: TF's
  gRPC, the tunnels, the driver's control service, a scan of the executor pods' ports;
* an executor pod deleted mid-training loses no step, and the cluster grows back;
* a feed's chunks come through shared memory within a pod and on the channel between pods;
* an OOM-killed TF process's error names the pod's memory limit and the setting to raise.

A submission's start (a driver JVM, executor pods, their JVMs) is most of what a job costs here, so
two submissions serve every test but the first (the ``apps`` fixture): one client-mode application
(client_job.py) runs, on the same two executor pods, digits behind the outsider's target, then the
pod-deletion training, then a feed, then the OOM; the cluster-mode digits (the example as the image holds it)
starts once the pod-deletion training has grown back, beside what is left of the first (steps to
the end and the OOM, which no clock decides). Each test checks its part of what they did.
"""

import json
import shutil
import subprocess
import time
import traceback
import types
from pathlib import Path

import pytest

from tfos.testing.kubernetes import NAMESPACE, NODE_IP
from tfos.testing.kubernetes import spark as k8s_spark
from tfos.testing.kubernetes.manifests import RESTRICTED

HERE = Path(__file__).parent
CONTROL_PORT = 29901  # the client-mode driver's control service while the outsider probes it
EVICT_STEPS = 700
CLUSTER_LABEL = "tfos-test=digits-cluster"  # the cluster-mode application's pods (beside the client one's)
#: the tests that read the applications: the first one to run waits for both (setup counts in pytest-timeout)
APPS_TIMEOUT = 2400


def pods(k8s, selector="spark-role=executor"):
    return json.loads(k8s.kubectl("-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]


def wait_for(what, check, timeout=300.0, interval=1.0, gone=None):
    """``check()``'s first true value, polled every ``interval`` s; AssertionError after ``timeout``
    s, or as soon as ``gone()`` says why it never will be."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        why = gone() if gone else None
        if why:
            raise AssertionError(f"{what}: never, {why}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s")
        time.sleep(interval)


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"({path} is missing)"


def test_restricted_is_enforced_on_the_namespace(k8s):
    """A pod that runs as root with its capabilities is refused at admission: the namespace's pods
    (Spark's among them) run under "restricted"."""
    image = (k8s.dir / "image").read_text().strip()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rooted", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "args": ["true"],
                                    "securityContext": {"runAsUser": 0}}]}}
    done = k8s.kubectl("apply", "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0 and 'violates PodSecurity "restricted' in done.stderr, done.stderr


# ---------------------------------------------------------------------- the two applications

def fresh_dir(k8s, name: str) -> Path:
    shutil.rmtree(k8s_spark.shared_dir(k8s) / name, ignore_errors=True)
    return k8s_spark.job_dir(k8s, name)


def attempt(app, name, fn):
    """``fn()``; its traceback in ``app.errors[name]`` instead of raising (the later steps run either way)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 (the test of that part reports it)
        app.errors[name] = traceback.format_exc()
        return None


def ended(app, proc, phase: str):
    """Why the client application will never reach a point of ``phase`` (None while it may)."""
    if proc.poll() is not None:
        return f"spark-submit exited {proc.returncode}: {tail(app.log, 3000)}"
    if (app.dirs[phase] / "phase.json").exists():
        return f"its phase ended: {(app.dirs[phase] / 'phase.json').read_text()[-3000:]}"
    return None


def probe_the_held_job(k8s, app, proc):
    """Once both nodes hold (their reports written), the executor pods as they run and the outsider
    pod's result against them."""
    hold = app.dirs["hold"]
    reports = [hold / f"node-{r}.json" for r in (0, 1)]
    wait_for("both nodes' reports", lambda: all(p.exists() for p in reports), timeout=400, interval=0.5,
             gone=lambda: ended(app, proc, "hold"))
    app.running_at_reports = proc.poll() is None
    app.nodes = [json.loads(p.read_text()) for p in reports]
    info = {m["node_index"]: m for m in app.nodes[0]["nodes"]}
    hosts = {m["host"] for m in info.values()}
    app.executor_pods = [p for p in pods(k8s) if p["status"].get("podIP") in hosts]  # this job's, running
    spec = app.nodes[0]["spec"]
    app.targets = {"pods": [{"ip": m["host"], "job": m["job_name"], "tf_port": int(spec[str(i)].rsplit(":", 1)[1]),
                             "tunnel_port": m["tunnel_port"], "private": spec[str(i)]}
                            for i, m in sorted(info.items())],
                   "control": [NODE_IP, CONTROL_PORT]}
    app.outsider = run_outsider(k8s, app.targets)
    (hold / "outsider.json").write_text(json.dumps({"targets": app.targets, "result": app.outsider}, indent=1))


def delete_the_worker_pod(k8s, app, proc):
    """After 60 steps on both ranks, ``kubectl delete pod`` on the worker's executor pod."""
    out = app.dirs["evict"]

    def progressed():
        lasts = [out / f"last-a0-r{r}" for r in (0, 1)]
        return all(p.exists() and int(p.read_text() or 0) >= 60 for p in lasts)

    wait_for("60 steps on both ranks", progressed, timeout=400, interval=0.5, gone=lambda: ended(app, proc, "evict"))
    worker_ip = json.loads((out / "nodes.json").read_text())["hosts"]["1"]  # node 1: the worker
    victim = next(p for p in pods(k8s) if p["status"].get("podIP") == worker_ip)
    k8s.kubectl("-n", NAMESPACE, "delete", "pod", victim["metadata"]["name"], "--wait=false")


def grown_back_or_past(app, proc):
    """Once rank 1 steps again in a later attempt (the cluster grew back: what is left of the client
    application decides nothing by the clock), or the pod-deletion phase is over either way."""
    out = app.dirs["evict"]
    wait_for("rank 1 back", lambda: any(p.name != "last-a0-r1" for p in out.glob("last-a*-r1")),
             timeout=900, interval=0.5, gone=lambda: ended(app, proc, "evict"))


def submit_cluster_digits(k8s, app):
    out = app.dirs["digits-cluster"]
    key, value = CLUSTER_LABEL.split("=")
    return k8s_spark.spark_submit(
        k8s, "cluster", "local:///opt/tfos/examples/digits/digits_tf.py",
        ["--epochs", 3, "--data-dir", out / "data", "--output-dir", out / "out", "--export-dir", out / "export"],
        extra={"spark.kubernetes.executor.deleteOnTermination": "false",
               f"spark.kubernetes.driver.label.{key}": value, f"spark.kubernetes.executor.label.{key}": value,
               # beside the client application's 2 executor pods (0.5 CPU each) on this 2-CPU node
               "spark.kubernetes.executor.request.cores": "0.25"},
        background=True, log=app.cluster_log)


def finish(app, name, proc, timeout):
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        app.errors[name] = f"spark-submit still ran after {timeout}s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.fixture(scope="module")
def apps(k8s):
    """Both applications, run once (module docstring): what each test reads."""
    app = types.SimpleNamespace(
        dirs={n: fresh_dir(k8s, n) for n in ("hold", "digits-client", "evict", "feed", "oom", "digits-cluster")},
        log=k8s.logs / "spark-submit-client.log", cluster_log=k8s.logs / "spark-submit-cluster.log",
        errors={}, running_at_reports=None, nodes=None, executor_pods=None, targets=None, outsider=None,
        returncode=None, cluster_returncode=None)
    d = app.dirs
    proc = k8s_spark.spark_submit(k8s, "client", str(HERE / "client_job.py"),
                                  [d["hold"], d["digits-client"], d["evict"], d["feed"], d["oom"], CONTROL_PORT,
                                   EVICT_STEPS],
                                  background=True, log=app.log)
    cluster = None
    try:
        try:
            attempt(app, "hold", lambda: probe_the_held_job(k8s, app, proc))
        finally:
            (d["hold"] / "done").touch()  # the job goes on to digits, whatever the probes did
        attempt(app, "evict", lambda: delete_the_worker_pod(k8s, app, proc))
        attempt(app, "grow", lambda: grown_back_or_past(app, proc))  # only when to start the other one
        cluster = submit_cluster_digits(k8s, app)
        app.returncode = finish(app, "client", proc, 1500)
        app.cluster_returncode = finish(app, "cluster", cluster, 900)
    finally:
        for p in (proc, cluster):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    return app


def phase_ended_cleanly(app, name):
    """The client application's phase that wrote to ``app.dirs[name]`` ended without an error (and
    the application ended)."""
    assert "client" not in app.errors, (app.errors["client"], tail(app.log))
    record = app.dirs[name] / "phase.json"
    assert record.exists(), (app.errors.get("client"), tail(app.log))
    error = json.loads(record.read_text())["error"]
    assert error is None, error


def check_executor_pods(executors):
    """The job's executor pods ran under "restricted", as the job's uid, with the preStop hook."""
    assert len(executors) >= 2, executors
    for pod in executors:
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 185
        ctx = spec["containers"][0]["securityContext"]
        assert {k: ctx[k] for k in RESTRICTED} == RESTRICTED
        assert spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == k8s_spark.PRESTOP


# ---------------------------------------------------------------------- what they did

@pytest.mark.timeout(APPS_TIMEOUT)
@pytest.mark.parametrize("mode", ["client", "cluster"])
def test_digits_trains_to_accuracy(k8s, apps, mode):
    out = apps.dirs[f"digits-{mode}"]
    result = out / "out" / "result.json"
    if mode == "client":
        phase_ended_cleanly(apps, "digits-client")
        assert result.exists(), tail(apps.log)
    else:
        assert apps.cluster_returncode == 0 and result.exists(), (apps.errors.get("cluster"), tail(apps.cluster_log))
    result = json.loads(result.read_text())
    assert result["accuracy"] >= 0.9, result
    assert (out / "export" / "saved_model.pb").exists()
    if mode == "client":  # its pods, as they ran while the job held
        assert apps.executor_pods is not None, apps.errors.get("hold")
        check_executor_pods(apps.executor_pods)
    else:  # the driver was a pod: its log holds the job's output
        driver = pods(k8s, f"spark-role=driver,{CLUSTER_LABEL}")[-1]
        assert driver["status"]["phase"] == "Succeeded"
        log = k8s.kubectl("-n", NAMESPACE, "logs", driver["metadata"]["name"]).stdout
        assert "test accuracy" in log
        check_executor_pods(pods(k8s, f"spark-role=executor,{CLUSTER_LABEL}"))
        k8s.kubectl("-n", NAMESPACE, "delete", "pods", "-l", f"spark-role=executor,{CLUSTER_LABEL}", "--wait=false")


@pytest.mark.timeout(APPS_TIMEOUT)
def test_an_outsider_pod_gets_nothing(apps):
    """A job holds its TF servers and tunnels up; a pod of the same image in the same namespace,
    as another uid and without the secret, tries TF's remote eager client on the executor pods
    (the TF port, the tunnel's, the nodes' private address from its own pod), junk at the tunnel
    and at the driver's control service, and a scan of every port of the executor pods. It runs
    nothing, and only the tunnel and Spark's own JVM listen on a pod's address: every listener of
    the TF processes is on the pod's loopback. The job then trains digits in the same processes."""
    assert "hold" not in apps.errors, apps.errors["hold"]
    nodes, targets, result = apps.nodes, apps.targets, apps.outsider
    assert apps.running_at_reports, tail(apps.log, 3000)
    assert all(n["sum"] == 2.0 for n in nodes)  # a collective went through the tunnels
    for n in nodes:  # the TF process listens on the pod's loopback only
        assert n["listeners"] and all(host.startswith("127.") for host, _ in n["listeners"]), n["listeners"]
    info = {m["node_index"]: m for m in nodes[0]["nodes"]}
    assert all(m["tunnel_mode"] == "pod" for m in info.values()), info
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
    # both nodes held to the end, and the job went on and ended cleanly after the probes
    assert all((apps.dirs["hold"] / f"held-{r}").exists() for r in (0, 1)), tail(apps.log, 3000)
    phase_ended_cleanly(apps, "hold")


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


@pytest.mark.timeout(APPS_TIMEOUT)
def test_an_executor_pod_deleted_mid_training_loses_no_step_and_the_cluster_grows_back(apps):
    """``kubectl delete pod`` on an executor mid-training: the kubelet runs the pod's preStop hook
    (python -m tfos.cluster.agent.evict) before it stops the JVM; every rank saves at one step, the
    cluster goes on with the other node from that step (0 steps lost, no restart counted), and grows
    back to 2 nodes at a checkpoint once Spark has replaced the executor pod; both finish."""
    assert "evict" not in apps.errors, apps.errors["evict"]
    out = apps.dirs["evict"]
    phase_ended_cleanly(apps, "evict")
    assert (out / "driver.json").exists(), tail(apps.log)
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
    assert all(r["steps"] == EVICT_STEPS for r in ranks) and ranks[0]["weights"] == ranks[1]["weights"], ranks


@pytest.mark.timeout(APPS_TIMEOUT)
def test_a_feed_comes_through_shared_memory_within_a_pod_and_the_channel_between_pods(apps):
    """Under "restricted" (no capability, seccomp RuntimeDefault, uid 185) a feeding task maps the
    ring its own pod's TF process lends it (memfd_create, /proc/<pid>/fd: same user, same
    container); chunks the driver places on the other pod's node go on the encrypted channel
    (how many depends on the tasks' timing: the driver prefers a task's own pod while the shares
    allow, so a node may get none); every row arrives once and both nodes get rows."""
    phase_ended_cleanly(apps, "feed")
    nodes = [json.loads((apps.dirs["feed"] / f"paths-{r}.json").read_text()) for r in (0, 1)]
    assert sum(n["rows"] for n in nodes) == 4000 and all(n["rows"] > 0 for n in nodes), nodes
    assert sum(n["shm"] for n in nodes) >= 1, nodes  # a ring within a pod, under "restricted"
    print(f"chunks through a pod's ring / on the channel from the other pod, per node: {nodes}")


@pytest.mark.timeout(APPS_TIMEOUT)
def test_an_oom_killed_node_names_the_pods_memory_limit_and_the_setting(apps):
    """A TF process that outgrows its executor pod is ended by the kernel's OOM killer (the pod's
    cgroup counts it); the driver's error says so with the pod's limit and the setting to raise."""
    out = apps.dirs["oom"]
    assert "client" not in apps.errors, (apps.errors["client"], tail(apps.log))  # the application ended
    message = (out / "error.txt").read_text() if (out / "error.txt").exists() else tail(apps.log, 3000)
    assert message.startswith("NodeFailedError"), message
    assert "by the kernel's OOM killer" in message and "memory limit of 2048 MiB" in message, message
    assert "spark.executor.memoryOverhead" in message, message
