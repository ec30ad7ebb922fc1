"""A one-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd (CRI, runc, the bridge CNI plugin) and a kubelet, each a real process
started here as root (the kubelet and containerd need it), their state under one directory.

Addresses: the node is ``198.18.0.1`` on the bridge ``tfosk8s0`` (made here), its pods get
``198.18.0.0/24``, services ``198.18.128.0/24``; nothing listens elsewhere but etcd (loopback).
Every component authenticates with certificates of the cluster's own CA (:mod:`.pki`);
authorization is Node + RBAC; PodSecurity "restricted" is enforced on the namespace ``tfos``.
Images are never pulled: :mod:`.images` builds them and imports them into containerd.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tfos.errors import TFOSError
from tfos.host.deadline import Deadline
from tfos.testing.daemons import alive as _alive, stop_tree, tail as _tail
from tfos.testing.kubernetes.pki import PKI

log = logging.getLogger(__name__)

BRIDGE = "tfosk8s0"
BRIDGE_MAC = "02:74:66:6f:73:01"  # locally administered, fixed: see _network
NODE_IP = "198.18.0.1"
POD_SUBNET = "198.18.0.0/24"
SERVICE_RANGE = "198.18.128.0/24"
SERVICE_IP = "198.18.128.1"  # the 'kubernetes' service (first of the range)
API_PORT = 6443
ETCD_PORT = 23790
NODE_NAME = "tfos-node-0"
NAMESPACE = "tfos"
CNI_BIN = "/usr/lib/cni"
DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "mmdebstrap", "iproute2")


class KubernetesError(TFOSError):
    """The test Kubernetes could not be started, reached or stopped."""


#: what each Debian package gives the cluster (checked before any is installed)
_PROVIDES = {"containerd": "/usr/bin/containerd", "runc": "/usr/sbin/runc",
             "containernetworking-plugins": f"{CNI_BIN}/bridge", "mmdebstrap": "/usr/bin/mmdebstrap",
             "iproute2": "/usr/sbin/ip"}


def ensure_packages() -> list[str]:
    """Install the Debian packages the cluster runs on (containerd, runc, the CNI plugins, mmdebstrap)
    where they are missing, as root with apt-get; the ones installed."""
    missing = [p for p in DEBIAN_PACKAGES if not Path(_PROVIDES[p]).exists()]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise KubernetesError(f"the test Kubernetes needs Debian's {', '.join(missing)}: apt-get install them as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            raise KubernetesError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr[-2000:]}")
    log.info("installed Debian's %s", ", ".join(missing))
    return missing


def _has_sys_resource() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE (a container's root may not)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def _marker(base: Path) -> str:
    return f"TFOS_K8S_CLUSTER={base.resolve()}"


def _owned(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


class KubernetesCluster:
    """``start()``, ``kubectl(...)``, ``stop()``; the state lives in ``base`` (short: unix sockets)."""

    def __init__(self, base, binaries: Path, *, timeout: float = 180.0):
        self.dir = Path(base)
        self.bin = Path(binaries)
        self.timeout = timeout
        self.pki_dir = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.kubeconfig = self.pki_dir / "admin.kubeconfig"
        self.containerd_sock = self.dir / "containerd" / "containerd.sock"
        self.server = f"https://{NODE_IP}:{API_PORT}"
        self._marker = _marker(self.dir)

    # ------------------------------------------------------------------ processes
    def _pids(self) -> dict[str, int]:
        try:
            return json.loads((self.dir / "pids").read_text())
        except (OSError, ValueError):
            return {}

    def _spawn(self, name: str, argv: list[str], pids: dict) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TFOS_K8S_CLUSTER": str(self.dir.resolve()),
               "PATH": f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin"}
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        pids[name] = proc.pid
        (self.dir / "pids").write_text(json.dumps(pids, indent=1))

    def _check_alive(self, pids: dict) -> None:
        for name, pid in pids.items():
            if not _alive(pid):
                raise KubernetesError(f"{name} exited while the cluster started; its log "
                                      f"({self.logs / (name + '.log')}):\n{_tail(self.logs / (name + '.log'), 25)}")

    def _wait(self, what: str, ready, pids: dict, timeout: float | None = None) -> None:
        deadline = Deadline(timeout or self.timeout)
        while True:
            self._check_alive(pids)
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if deadline.expired():
                raise KubernetesError(f"{what} not ready within {timeout or self.timeout:.0f}s; logs in {self.logs}")
            time.sleep(0.5)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None
                ) -> subprocess.CompletedProcess:
        """The cluster's kubectl (built with the cluster) as the cluster admin."""
        done = subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], text=True,
                              capture_output=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise KubernetesError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    # ------------------------------------------------------------------ set-up
    def _network(self) -> None:
        """The node's bridge with its address (the CNI plugin adds the pods' veths to it)."""
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        # A bridge whose address was never set takes the lowest of its ports' addresses, so it
        # changes as pods come and go; the pods keep the old one for the gateway (the driver in
        # client mode) and lose it for tens of seconds once that pod's veth is gone (measured: an
        # outsider pod's end cost a running job both nodes' heartbeats). A set address stays.
        subprocess.run(["ip", "link", "set", BRIDGE, "address", BRIDGE_MAC], check=True)
        subprocess.run(["ip", "addr", "replace", f"{NODE_IP}/24", "dev", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-tfos.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "tfos-k8s",
            "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "dataDir": str(self.dir / "cni-ipam"),
                                  "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]]}},
                        {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1))

    def _containerd_config(self) -> Path:
        root = self.dir / "containerd"
        root.mkdir(exist_ok=True)
        from tfos.testing.kubernetes.images import PAUSE_IMAGE, SNAPSHOTTER

        path = root / "config.toml"
        path.write_text(f"""version = 2
root = "{root / 'root'}"
state = "{root / 'state'}"
[grpc]
  address = "{self.containerd_sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # no oom_score_adj below containerd's own: this host's root lacks CAP_SYS_RESOURCE (the kubelet
  # asks -998 for a pod's sandbox, and runc fails to start any pod without it)
  restrict_oom_score_adj = {"true" if not _has_sys_resource() else "false"}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.dir / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{SNAPSHOTTER}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{root / 'runc'}"
""")
        return path

    def _kubelet_config(self, pki: PKI) -> Path:
        crt, key = pki.issue("kubelet-serving", NODE_NAME, server_names=(NODE_NAME,), server_ips=(NODE_IP,),
                             client=False)
        path = self.dir / "kubelet.yaml"
        (self.dir / "pod-logs").mkdir(exist_ok=True)
        path.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(crt), "tlsPrivateKeyFile": str(key),
            "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            "podLogsDir": str(self.dir / "pod-logs"),
            "serializeImagePulls": False, "maxPods": 60, "protectKernelDefaults": False,
            "shutdownGracePeriod": "0s",
        }, indent=1))
        return path

    def start(self) -> KubernetesCluster:
        """Start every component and wait for the node to be Ready (KubernetesError otherwise, with
        the log of whatever exited)."""
        if os.geteuid() != 0:
            raise KubernetesError("the test Kubernetes runs its kubelet and containerd as root: run as root")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.running():
            raise KubernetesError(f"a cluster already runs from {self.dir}: 'down' it first")
        pki = PKI(self.pki_dir)
        sa_key, sa_pub = pki.service_account_key()
        api_crt, api_key = pki.issue(
            "apiserver", "kube-apiserver", client=False,
            server_names=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local", "localhost"),
            server_ips=(NODE_IP, SERVICE_IP, "127.0.0.1"))
        kc_crt, kc_key = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
        pki.kubeconfig("admin", self.server, "tfos-admin", ("system:masters",))
        cm_conf = pki.kubeconfig("controller-manager", self.server, "system:kube-controller-manager")
        sched_conf = pki.kubeconfig("scheduler", self.server, "system:kube-scheduler")
        node_conf = pki.kubeconfig("kubelet", self.server, f"system:node:{NODE_NAME}", ("system:nodes",))
        self._network()
        pids: dict[str, int] = {}
        images_pool = ThreadPoolExecutor(1, thread_name_prefix="tfos-k8s-images")
        try:
            self._spawn("etcd", [str(self.bin / "etcd"), "--name", "tfos", "--data-dir", str(self.dir / "etcd"),
                                 "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                                 "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                                 "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                                 "--initial-cluster", f"tfos=http://127.0.0.1:{ETCD_PORT + 10}"], pids)
            self._spawn("containerd", ["containerd", "--config", str(self._containerd_config())], pids)
            self._spawn("kube-apiserver", [
                str(self.bin / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
                f"--bind-address={NODE_IP}", f"--advertise-address={NODE_IP}", f"--secure-port={API_PORT}",
                f"--service-cluster-ip-range={SERVICE_RANGE}", f"--tls-cert-file={api_crt}",
                f"--tls-private-key-file={api_key}", f"--client-ca-file={pki.ca_cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={kc_crt}", f"--kubelet-client-key={kc_key}",
                f"--kubelet-certificate-authority={pki.ca_cert}", "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false", "--v=1"], pids)
            # the images stream into containerd and unpack (minutes of disk on a slow host) while the
            # control plane and the kubelet start: only a pod needs them, after start() returns
            self._wait("containerd", lambda: self.containerd_sock.exists(), pids)
            from tfos.testing.kubernetes.images import import_images

            importing = images_pool.submit(import_images, self)
            self._wait("kube-apiserver", lambda: self.kubectl("get", "--raw", "/readyz", check=False,
                                                               timeout=10).returncode == 0, pids)
            self._spawn("kube-controller-manager", [
                str(self.bin / "kube-controller-manager"), f"--kubeconfig={cm_conf}",
                f"--authentication-kubeconfig={cm_conf}", f"--authorization-kubeconfig={cm_conf}",
                f"--service-account-private-key-file={sa_key}", f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=true", "--leader-elect=false", "--bind-address=127.0.0.1",
                "--secure-port=10257", "--v=1"], pids)
            self._spawn("kube-scheduler", [
                str(self.bin / "kube-scheduler"), f"--kubeconfig={sched_conf}",
                f"--authentication-kubeconfig={sched_conf}", f"--authorization-kubeconfig={sched_conf}",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259", "--v=1"], pids)
            self._spawn("kubelet", [
                str(self.bin / "kubelet"), f"--config={self._kubelet_config(pki)}", f"--kubeconfig={node_conf}",
                f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
                f"--root-dir={self.dir / 'kubelet'}", "--v=1"], pids)
            self._wait("node " + NODE_NAME, self._node_ready, pids)
            self._namespace()
            self._wait("the images in containerd", importing.done, pids, timeout=1800)
            importing.result()  # its error, if it failed
        except BaseException:
            self.stop()
            raise
        finally:
            images_pool.shutdown(wait=False)
        log.info("Kubernetes is up: %s (kubeconfig %s)", self.server, self.kubeconfig)
        return self

    def _node_ready(self) -> bool:
        out = self.kubectl("get", "node", NODE_NAME, "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False, timeout=10)
        return out.stdout.strip() == "True"

    def _namespace(self) -> None:
        """Namespace ``tfos`` under PodSecurity "restricted", and the Spark driver's service account
        with the rights Spark's driver uses (pods, services, config maps, volume claims)."""
        from tfos.testing.kubernetes.manifests import namespace_manifests

        self.kubectl("apply", "-f", "-", input=namespace_manifests(NAMESPACE))
        # a namespace's default service account appears a moment after the namespace
        deadline = Deadline(60)
        while self.kubectl("-n", NAMESPACE, "get", "serviceaccount", "default", check=False).returncode != 0:
            if deadline.expired():
                raise KubernetesError("the namespace's default service account never appeared "
                                      "(kube-controller-manager's log)")
            time.sleep(0.5)

    # ------------------------------------------------------------------ teardown
    def running(self) -> bool:
        return any(_owned(p, self._marker) for p in self._pids().values())

    def stop(self, grace: float = 20) -> None:
        """Stop the kubelet first (it stops no pod), then remove every pod sandbox through runc, then
        the control plane; SIGKILL after ``grace`` s. Idempotent."""
        pids = {n: p for n, p in self._pids().items() if _owned(p, self._marker)}
        order = ["kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "containerd", "etcd"]
        for name in order:
            if name not in pids:
                continue
            if name == "containerd":
                self._remove_containers()
            stop_tree([pids[name]], grace)
        self._remove_containers()
        self._unmount()
        (self.dir / "pids").unlink(missing_ok=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)

    def _remove_containers(self) -> None:
        """Kill every container of the cluster's containerd (its runc root) and their shims."""
        runc_root = self.dir / "containerd" / "runc"
        if runc_root.is_dir():
            for c in list(runc_root.iterdir()):
                subprocess.run(["runc", "--root", str(runc_root), "kill", c.name, "KILL"], capture_output=True)
                subprocess.run(["runc", "--root", str(runc_root), "delete", "--force", c.name], capture_output=True)
        # the shims are children of init (containerd-shim-runc-v2 -namespace k8s.io -address <our socket>)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(self.containerd_sock).encode() in cmd and b"containerd-shim" in cmd[0]:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _unmount(self) -> None:
        """Unmount what the kubelet and containerd mounted under the cluster's directory (deepest first)."""
        base = str(self.dir.resolve())
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(base + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)

    def destroy(self) -> None:
        """stop(), then remove the cluster's directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
