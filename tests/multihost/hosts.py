"""A real Spark standalone cluster of several hosts on this machine, one Linux network namespace
per host (needs root and iproute2).

Layout: a bridge in the root namespace holds the driver's address (``.1``); each host is a
namespace joined to the bridge by a veth pair, with its own address (``.11``, ``.12``, ...) and
no default route, so its traffic can reach the bridge's subnet and nothing else. The Spark master
runs in the root namespace next to the driver; one Spark worker (1 core) runs in each host's
namespace, with its own TMPDIR (what a real host's /tmp is: per-host private directories and
claim registries) and a fake ``nvidia-smi`` reporting two GPUs. Executors, tfos agents and TF
processes started by that worker live in the same namespace.

Addresses come from 198.51.100.0/24 (TEST-NET-2, documentation only); :meth:`Hosts.start`
refuses to run if any interface of the machine already uses that range. :meth:`Hosts.close`
kills every process in the namespaces and removes namespaces, veths and bridge, whatever
happened before; the context manager calls it in ``finally``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

SUBNET = ipaddress.ip_network("198.51.100.0/24")
DRIVER_ADDRESS = "198.51.100.1"

FAKE_SMI = """#!/bin/sh
# fake nvidia-smi of a test host: two idle GPUs
echo "0, 0, 0"
echo "1, 0, 0"
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def range_in_use() -> list[str]:
    """Interfaces of this machine with an address in SUBNET (pure on ``ip -o addr`` output)."""
    out = _ip("-o", "-4", "addr", "show").stdout
    used = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1]
            if ipaddress.ip_interface(addr).network.overlaps(SUBNET):
                used.append(f"{parts[1]} {addr}")
    return used


def reclaim_stale() -> list[str]:
    """Remove what a harness run that died without closing left behind (its bridge ``tfbr<tag>``,
    namespaces ``tfos-<tag>-h<i>``), but only a run none of whose namespaces holds a process.
    Returns the tags reclaimed. Nothing else on the machine is touched."""
    links = _ip("-o", "link", "show").stdout
    tags = sorted({m.group(1) for m in re.finditer(r"^\d+: tfbr([0-9a-f]{6})[:@]", links, re.M)})
    spaces = _ip("netns", "list").stdout.split()
    reclaimed = []
    for tag in tags:
        mine = [n for n in spaces if re.fullmatch(rf"tfos-{tag}-h\d+", n)]
        if any(_ip("netns", "pids", n).stdout.strip() for n in mine):
            continue  # a live run: not ours to touch
        for n in mine:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        subprocess.run(["ip", "link", "del", f"tfbr{tag}"], capture_output=True)
        reclaimed.append(tag)
    return reclaimed


def can_run() -> str | None:
    """Why the harness cannot run here (None if it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    return None


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _descendants(root: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class Host:
    def __init__(self, index: int, tag: str, root: str):
        self.index = index
        self.name = f"h{index}"
        self.netns = f"tfos-{tag}-h{index}"
        self.veth_host = f"tv{tag[:6]}{index}"  # inside the namespace
        self.veth_bridge = f"tb{tag[:6]}{index}"  # on the bridge
        self.address = str(SUBNET.network_address + 10 + index)
        self.dir = os.path.join(root, self.name)
        self.tmp = os.path.join(self.dir, "tmp")
        self.worker: subprocess.Popen | None = None

    def pids(self) -> list[int]:
        r = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []

    def exec_args(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd]


class Hosts:
    """``with Hosts(3) as hosts: ...`` a master on the bridge and one 1-core worker per host."""

    def __init__(self, n: int, worker_memory: str = "1200m", wait_secs: float = 120.0):
        self.n = n
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"tfbr{self.tag}"
        self.dir = tempfile.mkdtemp(prefix="tfos-hosts-")
        os.chmod(self.dir, 0o755)
        self.hosts = [Host(i + 1, self.tag, self.dir) for i in range(n)]
        self.worker_memory = worker_memory
        self.wait_secs = wait_secs
        self.master: subprocess.Popen | None = None
        self.master_port = 0
        self.extra_workers: list[tuple[Host, subprocess.Popen]] = []
        self.masters: list[subprocess.Popen] = []  # the main one first

    @property
    def master_url(self) -> str:
        return f"spark://{DRIVER_ADDRESS}:{self.master_port}"

    # -- life
    def __enter__(self) -> "Hosts":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        why = can_run()
        if why:
            raise RuntimeError(f"the multi-host harness cannot run here: {why}")
        stale = reclaim_stale()
        if stale:
            logging.getLogger(__name__).warning("removed the bridges and namespaces of dead harness runs %s", stale)
        used = range_in_use()
        if used:
            raise RuntimeError(f"{SUBNET} is already used on this machine ({used}); the harness will not share it")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{DRIVER_ADDRESS}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for h in self.hosts:
            _ip("netns", "add", h.netns)
            _ip("link", "add", h.veth_bridge, "type", "veth", "peer", "name", h.veth_host)
            _ip("link", "set", h.veth_host, "netns", h.netns)
            _ip("link", "set", h.veth_bridge, "master", self.bridge)
            _ip("link", "set", h.veth_bridge, "up")
            _ip("netns", "exec", h.netns, "ip", "addr", "add", f"{h.address}/24", "dev", h.veth_host)
            _ip("netns", "exec", h.netns, "ip", "link", "set", h.veth_host, "up")
            _ip("netns", "exec", h.netns, "ip", "link", "set", "lo", "up")
            os.makedirs(h.tmp, mode=0o1777, exist_ok=True)
            os.chmod(h.tmp, 0o1777)
            bin_dir = os.path.join(h.dir, "bin")
            os.makedirs(bin_dir, exist_ok=True)
            smi = os.path.join(bin_dir, "nvidia-smi")
            with open(smi, "w") as f:
                f.write(FAKE_SMI)
            os.chmod(smi, 0o755)
        self.master, self.master_port = self.start_master("master")
        for h in self.hosts:
            h.worker = self._start_worker(h, "worker")
        self._wait_workers(self.n)

    def _env(self, h: Host | None) -> dict:
        env = dict(os.environ)
        env["SPARK_HOME"] = spark_home()
        env["PYSPARK_PYTHON"] = sys.executable
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        if h is None:
            env["SPARK_LOCAL_IP"] = DRIVER_ADDRESS
        else:
            env["SPARK_LOCAL_IP"] = h.address
            env["SPARK_PUBLIC_DNS"] = h.address
            env["TMPDIR"] = h.tmp
            env["SPARK_LOCAL_DIRS"] = h.tmp
            env["PATH"] = os.path.join(h.dir, "bin") + os.pathsep + env.get("PATH", "")
        return env

    def _spark_class(self, *args: str) -> list[str]:
        return [os.path.join(spark_home(), "bin", "spark-class"), *args]

    def properties_file(self, name: str, conf: dict) -> str:
        """``conf`` in a Spark properties file only root reads (``--properties-file``: a secret in it
        stays off the command lines every user can read in /proc)."""
        path = os.path.join(self.dir, f"{name}.properties")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{k} {v}\n" for k, v in conf.items())
        return path

    def start_master(self, name: str, properties: str | None = None) -> tuple[subprocess.Popen, int]:
        """A Spark master on the bridge address (log ``<name>.log``; its settings from the
        ``properties`` file if given); returns it and its port."""
        with socket.socket() as s:  # a free port on the bridge address (bound right after: no other user here)
            s.bind((DRIVER_ADDRESS, 0))
            port = s.getsockname()[1]
        log = open(os.path.join(self.dir, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            self._spark_class("org.apache.spark.deploy.master.Master", "--host", DRIVER_ADDRESS,
                              "--port", str(port), "--webui-port", "0",
                              *(["--properties-file", properties] if properties else [])),
            stdout=log, stderr=subprocess.STDOUT, env=self._env(None), start_new_session=True)
        log.close()
        self.masters.append(proc)
        return proc, port

    def _start_worker(self, h: Host, name: str, master_url: str | None = None,
                      properties: str | None = None) -> subprocess.Popen:
        work = os.path.join(h.dir, f"{name}-work")
        os.makedirs(work, exist_ok=True)
        log = open(os.path.join(h.dir, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            h.exec_args(*self._spark_class("org.apache.spark.deploy.worker.Worker", "--host", h.address,
                                           "--cores", "1", "--memory", self.worker_memory, "--work-dir", work,
                                           "--webui-port", "0",
                                           *(["--properties-file", properties] if properties else []),
                                           master_url or self.master_url)),
            stdout=log, stderr=subprocess.STDOUT, env=self._env(h), start_new_session=True)
        log.close()
        return proc

    def add_worker(self, h: Host, master: tuple[str, int] | None = None,
                   properties: str | None = None) -> subprocess.Popen:
        """Another 1-core worker on host ``h`` (two executors on one host), of the main master or of
        ``master`` = (log name, port) from start_master(), with the ``properties`` file's settings."""
        name = f"worker{len(self.extra_workers) + 2}"
        log, port = master or ("master", self.master_port)
        before = self._alive_workers(log)
        proc = self._start_worker(h, name, f"spark://{DRIVER_ADDRESS}:{port}", properties)
        self.extra_workers.append((h, proc))
        self._wait_workers(before + 1, log)
        return proc

    def remove_extra_workers(self) -> None:
        """Stop the workers add_worker() started (their executors are lost to the application)."""
        for h, proc in self.extra_workers:
            for pid in _descendants(proc.pid) + [proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
        self.extra_workers.clear()

    def _alive_workers(self, log: str = "master") -> int:
        # the master's log says when each worker registered
        with open(os.path.join(self.dir, f"{log}.log"), "rb") as f:
            text = f.read().decode("utf-8", "replace")
        return text.count("Registering worker")

    def _wait_workers(self, n: int, log: str = "master") -> None:
        deadline = time.monotonic() + self.wait_secs
        while self._alive_workers(log) < n:
            if self.master.poll() is not None:
                raise RuntimeError(f"Spark master exited: {self.log_tail('master.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self._alive_workers(log)} of {n} Spark workers registered within "
                                   f"{self.wait_secs:.0f}s; master log: {self.log_tail(log + '.log')}")
            time.sleep(0.25)

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.dir, name), "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- faults
    def cut(self, h: Host) -> None:
        """Cut host ``h`` off the network (its processes keep running)."""
        _ip("link", "set", h.veth_bridge, "down")

    def reconnect(self, h: Host) -> None:
        _ip("link", "set", h.veth_bridge, "up")

    def kill_host(self, h: Host) -> int:
        """SIGKILL every process of host ``h`` (a host that dies); returns how many."""
        pids = h.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def restart_worker(self, h: Host) -> None:
        """A fresh worker on host ``h`` after kill_host() (the host came back)."""
        before = self._alive_workers()
        if h.worker is not None and h.worker.poll() is None:
            raise RuntimeError(f"the worker of {h.name} is still running")
        h.worker = self._start_worker(h, f"worker-r{before}")
        self._wait_workers(before + 1)

    def executor_pids(self, h: Host) -> list[int]:
        """Executor JVMs on host ``h``."""
        import psutil

        found = []
        for pid in h.pids():
            try:
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in psutil.Process(pid).cmdline():
                    found.append(pid)
            except psutil.Error:
                pass
        return found

    def by_address(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    def spark_session(self, app_name: str):
        """The driver (this process) on the bridge address; one 1-core executor per host, once
        every host's executor has registered."""
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(self.master_url).appName(app_name)
                 .config("spark.driver.host", DRIVER_ADDRESS)
                 .config("spark.driver.bindAddress", DRIVER_ADDRESS)
                 .config("spark.executor.cores", "1")
                 .config("spark.executor.memory", "1g")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.task.maxFailures", "2")  # Spark may retry a task (as on YARN, 4 by default)
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        wait_executors(spark.sparkContext, len(self.hosts))
        return spark


    # -- teardown
    def close(self) -> None:
        for h in self.hosts:
            for _ in range(50):  # kill until the namespace is empty (processes may fork meanwhile)
                if not self.kill_host(h):
                    break
                time.sleep(0.1)
        for proc in [h.worker for h in self.hosts] + [p for _, p in self.extra_workers] + self.masters:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
        for h in self.hosts:
            _ip("link", "del", h.veth_bridge, check=False)
            _ip("netns", "del", h.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
        if os.environ.get("TFOS_KEEP_HOSTS_DIR"):  # to read the workers' and executors' logs after a run
            logging.getLogger(__name__).warning("kept the hosts' logs in %s", self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def wait_executors(sc, n: int, timeout: float = 120.0) -> None:
    """Wait until ``n`` executors (besides the driver) are registered with ``sc``."""
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while len(tracker.getExecutorInfos()) - 1 < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(tracker.getExecutorInfos()) - 1} of {n} executors within {timeout:.0f}s")
        time.sleep(0.25)
