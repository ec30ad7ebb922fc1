"""spark-submit to the test Kubernetes: the settings, the executor (and driver) pod template under
PodSecurity "restricted", the shared volume, and the submission itself, in client or cluster mode.

* **client mode**: the driver runs here (this machine is the node, at ``NODE_IP``); executor pods
  reach it and tfos's control service at that address.
* **cluster mode**: the driver is a pod of the image (service account ``spark``, its Role from
  :mod:`.manifests`); executors reach it at its pod IP (``useDriverPodIP``: no cluster DNS), and
  tfos's control service listens on that IP (the image's entry point sets ``TFOS_SERVER_HOST``).

Data, checkpoints and exports live on a volume every pod mounts at the same path as this machine
sees it (``shared_dir``): a hostPath PersistentVolume bound to the claim ``tfos-shared`` (a pod
under "restricted" may mount a claim, not a hostPath).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tfos.testing.kubernetes.cluster import API_PORT, NAMESPACE, NODE_IP, KubernetesError
from tfos.testing.kubernetes.images import SPARK_UID, VENV
from tfos.testing.kubernetes.manifests import RESTRICTED, SERVICE_ACCOUNT

CLAIM = "tfos-shared"
#: The executor container's memory: the JVM's heap plus the overhead that holds the Python worker,
#: the node agent and the TF process (the pod's limit is their sum)
EXECUTOR_MEMORY = "512m"
EXECUTOR_OVERHEAD = "1536m"
#: seconds a deleted executor pod has to save through its preStop hook before SIGKILL
GRACE_SECONDS = 90
PRESTOP = ["python", "-m", "tfos.cluster.agent.evict"]


def shared_dir(cluster) -> Path:
    return cluster.dir / "shared"


def shared_volume(cluster) -> None:
    """The shared directory (the job's user, uid 185, owns it) as a PersistentVolume and its claim."""
    path = shared_dir(cluster)
    path.mkdir(exist_ok=True)
    os.chown(path, SPARK_UID, SPARK_UID)
    os.chmod(path, 0o770)
    items = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NAMESPACE}-shared"},
         "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(path), "type": "Directory"},
                  "claimRef": {"namespace": NAMESPACE, "name": CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NAMESPACE},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{NAMESPACE}-shared",
                  "resources": {"requests": {"storage": "10Gi"}}}},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def job_dir(cluster, name: str) -> Path:
    """A fresh directory of the shared volume for one job, owned by the pods' user (a client-mode
    driver, root here, writes its data there too)."""
    path = shared_dir(cluster) / name
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, SPARK_UID, SPARK_UID)
    os.chmod(path, 0o770)
    return path


def pod_template(cluster, role: str) -> Path:
    """The pod template of ``role`` ("executor" or "driver"): "restricted" (non-root uid 185, every
    capability dropped, no privilege escalation, seccomp RuntimeDefault), the shared volume, and for
    executors the preStop hook that saves before the pod goes (docs/kubernetes.md)."""
    container = {"name": f"spark-kubernetes-{role}", "securityContext": dict(RESTRICTED),
                 "volumeMounts": [{"name": "shared", "mountPath": str(shared_dir(cluster))}]}
    if role == "executor":
        container["lifecycle"] = {"preStop": {"exec": {"command": PRESTOP}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": SPARK_UID, "runAsGroup": SPARK_UID,
                                        "fsGroup": SPARK_UID, "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": GRACE_SECONDS, "containers": [container],
                    "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": CLAIM}}]}}
    path = cluster.dir / f"{role}-template.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(pod, indent=1))
    os.replace(tmp, path)  # whole: a running client-mode driver reads it for each executor pod it makes
    return path


def service_account_token(cluster, hours: int = 4) -> Path:
    """A token of the ``spark`` service account, for spark-submit and a client-mode driver."""
    token = cluster.kubectl("-n", NAMESPACE, "create", "token", SERVICE_ACCOUNT, f"--duration={hours}h").stdout.strip()
    path = cluster.pki_dir / "spark.token"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)  # whole: another submission's driver may be reading the one before
    return path


def submit_conf(cluster, mode: str, image: str, executors: int = 2, extra: dict | None = None) -> dict[str, str]:
    """Spark's settings for a job on the test cluster (``mode``: "client" or "cluster")."""
    if mode not in ("client", "cluster"):
        raise ValueError(f"mode is 'client' or 'cluster', not {mode!r}")
    ca, token = str(cluster.pki_dir / "ca.crt"), str(service_account_token(cluster))
    conf = {
        "spark.master": f"k8s://https://{NODE_IP}:{API_PORT}",
        "spark.submit.deployMode": mode,
        "spark.kubernetes.namespace": NAMESPACE,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": "Never",
        "spark.kubernetes.executor.podTemplateFile": str(pod_template(cluster, "executor")),
        "spark.kubernetes.executor.useDriverPodIP": "true",
        "spark.kubernetes.authenticate.submission.caCertFile": ca,
        "spark.kubernetes.authenticate.submission.oauthTokenFile": token,
        "spark.kubernetes.authenticate.caCertFile": ca,
        "spark.kubernetes.authenticate.oauthTokenFile": token,
        "spark.executor.instances": str(executors),
        "spark.executor.cores": "1",
        "spark.kubernetes.executor.request.cores": "0.5",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.executor.memoryOverhead": EXECUTOR_OVERHEAD,
        "spark.ui.enabled": "false",
        "spark.pyspark.python": f"{VENV}/bin/python",
        "spark.kubernetes.executor.deleteOnTermination": "true",
    }
    if mode == "cluster":
        conf.update({
            "spark.kubernetes.driver.podTemplateFile": str(pod_template(cluster, "driver")),
            "spark.kubernetes.authenticate.driver.serviceAccountName": SERVICE_ACCOUNT,
            "spark.kubernetes.driver.master": f"https://{NODE_IP}:{API_PORT}",
            "spark.kubernetes.driver.request.cores": "0.25",
            "spark.driver.memory": "768m",
            "spark.pyspark.driver.python": f"{VENV}/bin/python",
            "spark.kubernetes.submission.waitAppCompletion": "true",
        })
    else:
        conf.update({"spark.driver.host": NODE_IP, "spark.driver.bindAddress": NODE_IP,
                     "spark.pyspark.driver.python": sys.executable})
    conf.update(extra or {})
    return conf


def spark_submit(cluster, mode: str, app: str, args=(), *, executors: int = 2, extra: dict | None = None,
                 timeout: float = 900, log: Path | None = None, env: dict | None = None,
                 background: bool = False):
    """Run ``spark-submit`` of ``app`` (a path here in client mode; ``local:///...`` in the image in
    cluster mode) with ``args``; its output in ``log`` (default: the cluster's logs directory).
    ``background``: the running Popen instead of its result."""
    import pyspark

    image = (cluster.dir / "image").read_text().strip()
    conf = submit_conf(cluster, mode, image, executors, extra)
    shared_volume(cluster)
    argv = [os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    argv += [app, *map(str, args)]
    env = {**os.environ, "PYSPARK_PYTHON": f"{VENV}/bin/python", "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})}
    if mode == "client":
        env.setdefault("TFOS_SERVER_HOST", NODE_IP)
    log = log or cluster.logs / f"spark-submit-{mode}.log"
    if background:  # the caller owns the process (and its log)
        with open(log, "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    with open(log, "wb") as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise KubernetesError(f"spark-submit ({mode} mode) ran past {timeout:.0f}s; see {log}") from None
    return subprocess.CompletedProcess(argv, done.returncode, log.read_text(errors="replace"), "")
