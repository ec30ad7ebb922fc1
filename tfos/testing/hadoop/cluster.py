"""The daemons of the Hadoop test cluster: a NameNode and a ResourceManager, and a DataNode and a
NodeManager per worker host, each its own JVM (Java 17, Hadoop 3.5.0 jars from
:mod:`tfos.testing.hadoop.artifacts`), their configuration, readiness and their end. With
``kerberos=True`` a MiniKdc (:mod:`tfos.testing.hadoop.kerberos`) runs first and HDFS asks for
Kerberos; ``yarn=False`` starts HDFS alone."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable
from xml.sax.saxutils import escape

from tfos.host.deadline import Deadline
from tfos.testing.ports import free_port
from tfos.testing.daemons import alive as _alive, stop_tree, tail as _tail
from tfos.testing.hadoop import kerberos
from tfos.testing.hadoop.artifacts import (DATANODE, FS_SHELL, HADOOP_VERSION, HEAPS, JVM_FLAGS, MINIKDC, NAMENODE,
                                           NODEMANAGER, RESOURCEMANAGER, HadoopClusterError, _LOG4J, cache_dir,
                                           fetch)

log = logging.getLogger(__name__)


def _xml(props: dict) -> str:
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
                   for k, v in props.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


def _marker(base_dir) -> str:
    """The JVM flag on every command line started for the cluster in ``base_dir``."""
    return f"-Dtfos.hadoop.cluster={Path(base_dir).resolve()}"


def _carries(pid: int | str, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False


def processes_of(base_dir) -> list[int]:
    """Pids of every live process started for the cluster in ``base_dir`` (its marker on the command line)."""
    marker = _marker(base_dir)
    return [int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if _carries(pid, marker)]


class HadoopCluster:
    """NameNode + ResourceManager on ``host``, a DataNode + NodeManager on each of ``workers``.

    All addresses are loopback for now.  ``launcher(host)`` may return a command prefix
    that runs a worker daemon on that host, e.g. ``["ip", "netns", "exec", NAME]`` (it
    must exec, so that the recorded pid stays the JVM's).
    """

    def __init__(self, base_dir, *, host: str = "127.0.0.1", workers=("127.0.0.1", "127.0.0.1"),
                 nm_memory_mb: int = 4096, nm_vcores: int = 2, java: str = "java",
                 version: str = HADOOP_VERSION, timeout: float = 180, mvn: str = "mvn",
                 launcher: Callable[[str], list[str]] | None = None, kerberos: bool = False, yarn: bool = True):
        self.dir = Path(base_dir).resolve()
        self.kerberos, self.yarn = kerberos, yarn
        self.kdc_dir = self.dir / "kdc"
        self.host, self.workers, self.launcher = host, list(workers), launcher
        self.nm_memory_mb, self.nm_vcores = nm_memory_mb, nm_vcores
        self.java = shutil.which(java) or java
        self.version, self.timeout, self.mvn = version, timeout, mvn
        self.conf_dir = self.dir / "conf"
        self.ports: dict[str, int] = {}
        self._marker = _marker(self.dir)  # tells our daemons from reused pids

    @classmethod
    def attach(cls, base_dir, **kw) -> HadoopCluster:
        """A handle on a cluster started elsewhere (e.g. by ``up``) in base_dir."""
        try:
            meta = json.loads((Path(base_dir) / "cluster.json").read_text())
        except (OSError, ValueError) as e:
            raise HadoopClusterError(f"no cluster description in {base_dir}: {e}") from e
        cluster = cls(base_dir, host=meta["host"], workers=meta["workers"], kerberos=meta.get("kerberos", False),
                      yarn=meta.get("yarn", True), **kw)
        cluster.ports = meta["ports"]
        return cluster

    default_fs = property(lambda self: f"hdfs://{self.host}:{self.ports['nn_rpc']}")
    webhdfs_address = property(lambda self: f"{self.host}:{self.ports['nn_http']}")
    rm_address = property(lambda self: f"{self.host}:{self.ports['rm']}")
    rm_webapp_address = property(lambda self: f"{self.host}:{self.ports['rm_web']}")

    @property
    def krb5_option(self) -> str:
        """The JVM option naming the Kerberos cluster's realm (its KDC's krb5.conf)."""
        return f"-Djava.security.krb5.conf={self.kdc_dir / 'krb5.conf'}"

    def classpath(self, conf: Path | None = None) -> str:
        root = cache_dir(self.version)
        return os.pathsep.join(map(str, (conf or self.conf_dir, root / "lib" / "*", root / "webapps-stub")))

    # -- configuration ----------------------------------------------------
    def _site(self) -> dict[str, dict]:
        h, p, d = self.host, self.ports, self.dir / "data"
        core = {"fs.defaultFS": self.default_fs, "hadoop.tmp.dir": d / "tmp"}
        hdfs = {"dfs.replication": min(2, len(self.workers)), "dfs.permissions.enabled": "false",
                "dfs.webhdfs.enabled": "true", "dfs.namenode.name.dir": f"file://{d / 'nn'}",
                "dfs.namenode.rpc-address": f"{h}:{p['nn_rpc']}",
                "dfs.namenode.http-address": f"{h}:{p['nn_http']}",
                "dfs.namenode.safemode.extension": "0", "dfs.heartbeat.interval": "1",
                # a stopped DataNode is declared dead after 2 x 5 s + 10 x 1 s (Hadoop's default: 10.5 min)
                "dfs.namenode.heartbeat.recheck-interval": "5000",
                "dfs.namenode.datanode.registration.ip-hostname-check": "false"}
        yarn = {"yarn.resourcemanager.hostname": h,
                "yarn.resourcemanager.address": f"{h}:{p['rm']}",
                "yarn.resourcemanager.scheduler.address": f"{h}:{p['rm_scheduler']}",
                "yarn.resourcemanager.resource-tracker.address": f"{h}:{p['rm_tracker']}",
                "yarn.resourcemanager.admin.address": f"{h}:{p['rm_admin']}",
                "yarn.resourcemanager.webapp.address": f"{h}:{p['rm_web']}",
                "yarn.nodemanager.resource.memory-mb": self.nm_memory_mb,
                "yarn.nodemanager.resource.cpu-vcores": self.nm_vcores,
                "yarn.scheduler.minimum-allocation-mb": 128,
                "yarn.scheduler.maximum-allocation-mb": self.nm_memory_mb,
                "yarn.scheduler.maximum-allocation-vcores": self.nm_vcores,
                "yarn.nodemanager.pmem-check-enabled": "true",
                # 3.5.0 skips the procfs pmem check while this is true (its default), even
                # without cgroups: false is what makes over-limit containers get killed.
                "yarn.nodemanager.resource.memory.enforced": "false",
                "yarn.nodemanager.vmem-check-enabled": "false",
                "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "100",
                "yarn.log-aggregation-enable": "true",
                "yarn.nodemanager.remote-app-log-dir": "/tmp/logs",
                "yarn.log-aggregation.retain-seconds": "86400"}
        capacity = {"yarn.scheduler.capacity.root.queues": "default",
                    "yarn.scheduler.capacity.root.default.capacity": "100",
                    "yarn.scheduler.capacity.root.default.maximum-capacity": "100",
                    "yarn.scheduler.capacity.maximum-am-resource-percent": "0.5",
                    "yarn.scheduler.capacity.node-locality-delay": "-1"}
        if self.kerberos:
            secure = kerberos.site(self.kdc_dir / "tfos.keytab")
            core, hdfs = {**core, **secure["core-site.xml"]}, {**hdfs, **secure["hdfs-site.xml"]}
            yarn = {**yarn, **secure["yarn-site.xml"]}
        return {"core-site.xml": core, "hdfs-site.xml": hdfs, "yarn-site.xml": yarn,
                "capacity-scheduler.xml": capacity}

    def _write_conf(self, conf: Path, overrides: dict[str, dict] | None = None) -> None:
        conf.mkdir(parents=True, exist_ok=True)
        for name, props in self._site().items():
            (conf / name).write_text(_xml({**props, **(overrides or {}).get(name, {})}))
        (conf / "log4j.properties").write_text(_LOG4J)

    def _worker_overrides(self, i: int, host: str) -> dict[str, dict]:
        w = self.dir / "data" / f"worker-{i}"  # port 0: the daemons report their real ports
        return {"hdfs-site.xml": {
                    "dfs.datanode.data.dir": f"file://{w / 'dn'}", "dfs.datanode.hostname": host,
                    **{f"dfs.datanode.{k}": f"{host}:0" for k in
                       ("address", "http.address", "ipc.address", "https.address")}},
                "yarn-site.xml": {
                    "yarn.nodemanager.hostname": host,
                    **{f"yarn.nodemanager.{k}": f"{host}:0" for k in
                       ("address", "localizer.address", "webapp.address", "collector-service.address")},
                    "yarn.nodemanager.local-dirs": w / "nm-local",
                    "yarn.nodemanager.log-dirs": w / "nm-logs"}}

    # -- processes --------------------------------------------------------
    def _env(self, conf: Path, client: bool = False) -> dict:
        """A daemon's environment (``client``: a Hadoop client's). No daemon sees a Kerberos ticket
        or client keytab: the containers inherit the NodeManager's environment, and there only the
        job's delegation tokens may authenticate."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KRB5") and k != "HADOOP_TOKEN_FILE_LOCATION"}
        env.update({"JAVA_HOME": str(Path(self.java).resolve().parents[1]), "HADOOP_CONF_DIR": str(conf),
                    "HADOOP_USER_NAME": os.environ.get("HADOOP_USER_NAME", "root")})
        if self.kerberos and client:  # Hadoop's Java clients read the ticket cache that kerberos.login() fills
            env["KRB5CCNAME"] = kerberos.client_env(self.kdc_dir)["KRB5CCNAME"]
        return env

    def _java(self, conf: Path, main: str, *args: str, logger: str = "INFO", heap: str = "256m",
              extra: tuple = ()) -> list[str]:
        if self.kerberos:
            extra = (*extra, self.krb5_option)
        return [self.java, f"-Xmx{heap}", *JVM_FLAGS, *extra, f"-Dhadoop.log.dir={self.dir / 'logs'}",
                f"-Dhadoop.root.logger={logger},console", "-cp", self.classpath(conf), main, *args]

    def _spawn(self, name: str, main: str, conf: Path, pids: dict, host: str | None = None, args=()) -> None:
        cmd = self._java(conf, main, *args, heap=HEAPS[main], extra=(self._marker,))
        if host is not None and self.launcher is not None:
            cmd = [*self.launcher(host), *cmd]
        logf = self.dir / "logs" / f"{name}.log"
        with open(logf, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=conf.parent, env=self._env(conf), start_new_session=True)
        pids[name] = proc.pid
        (self.dir / "pids").write_text(json.dumps(pids, indent=1))
        log.info("started %s (pid %d), log %s", name, proc.pid, logf)

    def hadoop_cli(self, args, *, check: bool = True, timeout: float = 120,
                   input: str | None = None) -> subprocess.CompletedProcess:
        """Run a Hadoop client main class with this cluster's conf, e.g. ``[FS_SHELL, "-ls", "/"]``."""
        cmd = self._java(self.conf_dir, *map(str, args), logger="WARN")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input,
                                  env=self._env(self.conf_dir, client=True))
        except subprocess.TimeoutExpired as e:
            raise HadoopClusterError(f"{list(args)} did not finish within {timeout:.0f}s") from e
        if check and proc.returncode != 0:
            raise HadoopClusterError(f"{list(args)} exited {proc.returncode}: {proc.stderr[-3000:]}")
        return proc

    def fs(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """``hadoop fs ARGS``: ``cluster.fs("-cat", "/x").stdout``."""
        return self.hadoop_cli([FS_SHELL, *args], **kw)

    def _get_json(self, url: str, timeout: float = 5) -> dict:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)

    def rm_rest(self, path: str) -> dict:
        """The ResourceManager's REST answer for ``/ws/v1/cluster/<path>``, e.g. ``apps/<id>``."""
        return self._get_json(f"http://{self.rm_webapp_address}/ws/v1/cluster/{path}", timeout=10)

    def missing(self) -> str:
        """What keeps the cluster from being ready ("" once it is)."""
        out, n = [], len(self.workers)
        try:
            q = "Hadoop:service=NameNode,name=FSNamesystemState"
            bean = self._get_json(f"http://{self.webhdfs_address}/jmx?qry={q}")["beans"][0]
            if bean["NumLiveDataNodes"] < n or bean["FSState"] != "Operational":
                out.append(f"HDFS: {bean['NumLiveDataNodes']}/{n} live DataNodes, state {bean['FSState']}")
        except (OSError, ValueError, KeyError, IndexError) as e:
            out.append(f"NameNode JMX at {self.webhdfs_address}: {e}")
        if not self.yarn:
            return "; ".join(out)
        try:
            nodes = (self.rm_rest("nodes")
                     .get("nodes") or {}).get("node", [])
            if (running := sum(x.get("state") == "RUNNING" for x in nodes)) < n:
                out.append(f"YARN: {running}/{n} RUNNING NodeManagers")
        except (OSError, ValueError, AttributeError) as e:
            out.append(f"ResourceManager REST at {self.rm_webapp_address}: {e}")
        return "; ".join(out)

    def _wait_ready(self, pids: dict) -> None:
        deadline = Deadline(self.timeout)
        while True:
            for name, pid in pids.items():
                if not _alive(pid):
                    raise HadoopClusterError(f"{name} (pid {pid}) exited during start-up; log tail:\n"
                                             f"{_tail(self.dir / 'logs' / f'{name}.log')}")
            if not (missing := self.missing()):
                return
            if deadline.expired():
                tails = "\n".join(f"--- {n}.log\n{_tail(self.dir / 'logs' / f'{n}.log', 15)}" for n in pids)
                raise HadoopClusterError(f"cluster not ready after {self.timeout:.0f}s, waiting for: "
                                         f"{missing}\n{tails}")
            time.sleep(1)

    def start(self) -> HadoopCluster:
        """Format HDFS and start all daemons in fresh state; return once both are ready."""
        if self.running():
            raise HadoopClusterError(f"a cluster already runs in {self.dir}; stop it first")
        fetch(self.version, self.mvn)
        t0 = time.monotonic()
        for sub in ("conf", "daemons", "data", "logs"):  # only our own subdirectories
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        (self.dir / "logs").mkdir(parents=True)
        taken: set[int] = set()
        self.ports = {k: free_port(self.host, taken) for k in
                      ("nn_rpc", "nn_http", "rm", "rm_scheduler", "rm_tracker", "rm_admin", "rm_web")}
        (self.dir / "cluster.json").write_text(
            json.dumps({"ports": self.ports, "host": self.host, "workers": self.workers, "kerberos": self.kerberos,
                        "yarn": self.yarn}, indent=1))
        self._write_conf(self.conf_dir)
        pids: dict[str, int] = {}
        try:
            if self.kerberos:  # the KDC first: the daemons log in from its keytab
                shutil.rmtree(self.kdc_dir, ignore_errors=True)
                self.kdc_dir.mkdir(mode=0o700)
                self._spawn("kdc", MINIKDC, self.conf_dir, pids, args=kerberos.kdc_args(self.kdc_dir))
                kerberos.wait_ready(self.dir / "logs" / "kdc.log", lambda: _alive(pids["kdc"]), self.timeout)
            fmt = subprocess.run(self._java(self.conf_dir, NAMENODE, "-format", "-force", "-nonInteractive"),
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                                 env=self._env(self.conf_dir))
            (self.dir / "logs" / "namenode-format.log").write_text(fmt.stdout + fmt.stderr)
            if fmt.returncode != 0:
                raise HadoopClusterError(f"NameNode format failed: {fmt.stderr[-3000:]}")
            self._spawn("namenode", NAMENODE, self.conf_dir, pids)
            if self.yarn:
                self._spawn("resourcemanager", RESOURCEMANAGER, self.conf_dir, pids)
            for i, host in enumerate(self.workers):
                conf = self.dir / "daemons" / f"worker-{i}" / "conf"
                self._write_conf(conf, self._worker_overrides(i, host))
                self._spawn(f"datanode-{i}", DATANODE, conf, pids, host)
                if self.yarn:
                    self._spawn(f"nodemanager-{i}", NODEMANAGER, conf, pids, host)
            self._wait_ready(pids)
            if self.kerberos:
                kerberos.login(self.kdc_dir, self.default_fs, self.conf_dir)
        except BaseException:
            try:
                self.stop()
            except HadoopClusterError:
                log.exception("clean-up after the failed start failed too")
            raise
        log.info("Hadoop cluster up in %.1fs: %s%s%s", time.monotonic() - t0, self.default_fs,
                 f", RM {self.rm_address}" if self.yarn else "", ", Kerberos" if self.kerberos else "")
        return self

    def _pids(self) -> dict[str, int]:
        try:
            return json.loads((self.dir / "pids").read_text())
        except (OSError, ValueError):
            return {}

    def _owned(self, pid: int) -> bool:
        return _carries(pid, self._marker)

    def running(self) -> bool:
        return any(self._owned(p) for p in self._pids().values())

    def stop(self, grace: float = 20) -> None:
        """SIGTERM every daemon's process group and its descendants (containers), SIGKILL after
        ``grace`` seconds; raise if anything survives.  Idempotent."""
        names = {p: n for n, p in self._pids().items() if self._owned(p)}
        count, left = stop_tree(list(names), grace, on_kill=lambda pids: log.warning(
            "still alive %.0fs after SIGTERM, sending SIGKILL: %s", grace, [names.get(p, p) for p in pids]))
        if left:
            raise HadoopClusterError(f"processes still alive after SIGKILL: {left}")
        (self.dir / "pids").unlink(missing_ok=True)
        if count:
            log.info("stopped the Hadoop cluster in %s (%d processes)", self.dir, count)

    def _daemon(self, name: str) -> tuple[str, Path, str | None]:
        """``(main class, conf dir, host)`` of daemon ``name`` (``namenode``, ``datanode-1``, ...)."""
        if name in ("namenode", "resourcemanager"):
            return (NAMENODE if name == "namenode" else RESOURCEMANAGER), self.conf_dir, None
        kind, _, index = name.rpartition("-")
        if kind not in ("datanode", "nodemanager") or not index.isdigit() or int(index) >= len(self.workers):
            raise HadoopClusterError(f"no daemon {name!r} in this cluster")
        i = int(index)
        return ((DATANODE if kind == "datanode" else NODEMANAGER), self.dir / "daemons" / f"worker-{i}" / "conf",
                self.workers[i])

    def stop_daemon(self, name: str, grace: float = 20) -> int:
        """Stop one daemon (SIGTERM, SIGKILL after ``grace`` s), e.g. a DataNode mid-run; its data
        stays for :meth:`start_daemon`. Returns the pid it had."""
        self._daemon(name)
        pid = self._pids().get(name)
        if pid is None or not self._owned(pid):
            raise HadoopClusterError(f"{name} is not running in {self.dir}")
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            deadline = Deadline(wait)
            while not deadline.expired() and self._owned(pid):
                time.sleep(0.2)
            if not self._owned(pid):
                log.info("stopped %s (pid %d)", name, pid)
                return pid
        raise HadoopClusterError(f"{name} (pid {pid}) is still alive after SIGKILL")

    def start_daemon(self, name: str) -> None:
        """Start daemon ``name`` again (after :meth:`stop_daemon`); a no-op if it runs."""
        main, conf, host = self._daemon(name)
        pids = self._pids()
        if name in pids and self._owned(pids[name]):
            return
        self._spawn(name, main, conf, pids, host)

    def __enter__(self) -> HadoopCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
