"""``tfos doctor``: what would make a tfos job fail here, found before one runs (driver).

It runs one small Spark job, one task per executor, whose tasks report what their host has
(:mod:`tfos.cluster.executor.doctor`: Python, tfos, TensorFlow and pyarrow versions, the compiled
parts, GPUs) and try to reach the driver the way a node would (a listener on the control address
tfos would use, answered with a banner). :func:`judge` compares those reports with the driver's
own and Spark's settings and returns one finding per check, each ``ok``, ``warn`` or ``fail`` with
the fix; a ``fail`` is something that would fail a job (the command's exit code is then 1).
:func:`judge` is pure and tested from tables.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import threading
import time

from tfos.cluster.driver import security
from tfos.errors import ConfigError
from tfos.host.deadline import Deadline

logger = logging.getLogger(__name__)

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def _hosts(reports, pred) -> str:
    return ", ".join(sorted({r["host"] for r in reports if pred(r)}))


def judge(driver: dict, executors: list[dict], conf: dict, environ: dict, address: str) -> list[Finding]:
    """Pure: the findings for the driver's report, the executors' reports, Spark's configuration,
    the driver's environment and the control address executors were told (``host:port``)."""
    out: list[Finding] = []
    dv = driver["versions"]
    if not executors:
        return [Finding("executors", FAIL, "the doctor's Spark job got no report from any executor",
                        "check that the cluster has executors (spark.executor.instances, the master URL)")]
    out.append(Finding("executors", OK, f"{len(executors)} task(s) reported from {len({r['host'] for r in executors})}"
                       f" host(s): {_hosts(executors, lambda r: True)}"))
    broken = [r for r in executors if r.get("import_error")]
    if broken:  # nothing else can be asked of these executors
        r = broken[0]
        out.append(Finding("tfos", FAIL, f"executors on {_hosts(broken, lambda r: True)} cannot import tfos with "
                           f"Python {r['versions']['python']} at {r['versions']['python_path']} ({r['import_error']})",
                           "install tfos (with its tf extra) in the executors' Python, or point the executors at a "
                           "Python that has it: spark.pyspark.python / PYSPARK_PYTHON, or an environment shipped "
                           "with spark.archives"))
        executors = [r for r in executors if not r.get("import_error")]
        if not executors:
            return out

    # Python, tfos, TensorFlow, pyarrow: the executors must run what the driver runs
    def mm(v):
        return ".".join(v.split(".")[:2])

    bad = _hosts(executors, lambda r: mm(r["versions"]["python"]) != mm(dv["python"]))
    out.append(Finding("python", FAIL, f"the driver runs Python {dv['python']}, executors on {bad} another",
                       "run the same Python on the executors: spark.pyspark.python (PYSPARK_PYTHON), or ship an "
                       "environment with spark.archives") if bad else
               Finding("python", OK, f"Python {dv['python']} on the driver and every executor"))
    for name, fix in (("tfos", "install the same tfos on the executors (pip install tfos==V, or ship the wheel in an "
                               "environment through spark.archives)"),
                      ("tensorflow", "install the same TensorFlow on the executors")):
        want = dv[name]
        missing = _hosts(executors, lambda r: not r["versions"][name])
        other = _hosts(executors, lambda r: r["versions"][name] and want and r["versions"][name] != want)
        if missing:
            out.append(Finding(name, FAIL, f"no {name} on executor host(s) {missing}", fix.replace("V", want or "")))
        elif other:
            seen = sorted({r["versions"][name] for r in executors if r["versions"][name] != want})
            out.append(Finding(name, FAIL, f"{name} {want or '(none)'} on the driver, {', '.join(seen)} on {other}",
                               fix.replace("V", want or "")))
        else:
            have = executors[0]["versions"][name]
            out.append(Finding(name, OK, f"{name} {have} everywhere" + ("" if want else " (not on the driver, which "
                                                                          "needs none)")))
    other = _hosts(executors, lambda r: r["versions"]["pyarrow"] != dv["pyarrow"])
    out.append(Finding("pyarrow", WARN, f"pyarrow {dv['pyarrow']} on the driver, another on {other}",
                       "the same pyarrow everywhere avoids surprises in the feed's Arrow data") if other else
               Finding("pyarrow", OK, f"pyarrow {dv['pyarrow']} everywhere"))

    # the driver's control address, as nodes and feeding tasks reach it
    unreached = [r for r in executors if r["reach"]]
    if unreached:
        why = unreached[0]["reach"]
        out.append(Finding("driver address", FAIL, f"executors on {_hosts(unreached, lambda r: True)} cannot reach the "
                           f"driver at {address} ({why})",
                           "name an address of this machine the executors reach: TFOS_SERVER_HOST (and "
                           "TFOS_SERVER_PORT for a port the firewall opens), TFOS_ADVERTISE_HOST behind NAT, or "
                           "spark.driver.host"))
    else:
        out.append(Finding("driver address", OK, f"every executor reached the driver at {address}"))

    # GPUs each executor's task sees
    want_gpus = conf.get("spark.task.resource.gpu.amount")
    lines = sorted({f"{r['host']}: task GPUs {r['gpus']['spark'] or 'none'}, nvidia-smi {r['gpus']['nvidia_smi']}"
                    for r in executors})
    starved = _hosts(executors, lambda r: not r["gpus"]["spark"])
    if want_gpus and starved:
        out.append(Finding("gpus", FAIL, f"spark.task.resource.gpu.amount={want_gpus} but tasks on {starved} got no GPU",
                           "check the executors' GPU discovery script (spark.executor.resource.gpu.discoveryScript)"))
    else:
        out.append(Finding("gpus", OK, "; ".join(lines)))

    # the compiled parts
    encrypt, _ = security.encryption(None, conf)
    no_tunnel = _hosts(executors, lambda r: not r["builds"]["tunnel"] and not r["builds"]["cargo"])
    to_build = _hosts(executors, lambda r: not r["builds"]["tunnel"] and r["builds"]["cargo"])
    if encrypt and no_tunnel:
        out.append(Finding("node tunnel", FAIL, f"encrypted clusters (the default) need tfos's node tunnel, which is "
                           f"not built on {no_tunnel} and cannot be (no cargo)",
                           "run 'tfos build tunnel' on a host like them and ship the build (TFOS_TUNNEL_DIR), "
                           "install Rust there, or reserve(encrypt=False)"))
    elif encrypt and to_build:
        out.append(Finding("node tunnel", WARN, f"not built yet on {to_build}: the first encrypted cluster builds it "
                           "there (a minute or two)", "run 'tfos build tunnel' on each host first"))
    else:
        out.append(Finding("node tunnel", OK, "built on every executor host" if encrypt else "not needed (encryption off)"))
    no_op = _hosts(executors, lambda r: r["versions"]["torch"] and not r["builds"]["gloo_op"])
    out.append(Finding("gloo op", WARN, f"tfos's Gloo op is not built on {no_op}: keras_dist's Gloo all-reduce takes "
                       "the slower py_function path", "run 'tfos build gloo' on each host") if no_op else
               Finding("gloo op", OK, "built where PyTorch is installed"))
    hdfs = (conf.get("spark.hadoop.fs.defaultFS") or "").startswith(("hdfs:", "viewfs:")) or bool(
        environ.get("HADOOP_CONF_DIR"))
    no_plugin = _hosts(executors, lambda r: not r["builds"]["hdfs_plugin"])
    if hdfs and no_plugin:
        out.append(Finding("hdfs:// plugin", WARN, f"TensorFlow's hdfs:// plugin is not built on {no_plugin}: tf.data "
                           "and checkpoints cannot open hdfs:// there", "run 'tfos build hdfs' on each host"))
    else:
        out.append(Finding("hdfs:// plugin", OK, "built on every executor host" if not no_plugin else
                           "not needed (no HDFS configured)"))

    # Spark's security settings and what tfos does with them
    secured = security.spark_secured(conf)
    out.append(Finding("encryption", OK, (f"Spark secures its RPC ({', '.join(secured)}); " if secured else "")
                       + ("tfos encrypts every channel, TensorFlow's and Gloo's included (reserve(encrypt=False) "
                          "turns it off)" if encrypt else "tfos channels in clear")))
    open_rpc = security.spark_rpc_exposure(conf, encrypt)
    out.append(Finding("spark rpc", WARN, open_rpc, security.SPARK_RPC_FIX) if open_rpc else
               Finding("spark rpc", OK, "Spark authenticates and encrypts its RPC, which carries the cluster's secret "
                       "to the barrier tasks" if encrypt else "tfos channels in clear: no secret to protect"))

    # Java, Hadoop and Kerberos on the driver
    if not driver["java"]:
        out.append(Finding("java", FAIL, "no java on the driver's PATH", "install Java 17 (Spark needs it)"))
    else:
        out.append(Finding("java", OK, driver.get("java_version") or "java found"))
    conf_dir = environ.get("HADOOP_CONF_DIR", "")
    if conf_dir:
        core = os.path.join(conf_dir, "core-site.xml")
        if not driver.get("hadoop_conf_readable"):
            out.append(Finding("hadoop", FAIL, f"HADOOP_CONF_DIR={conf_dir} has no readable core-site.xml",
                               "point HADOOP_CONF_DIR at the cluster's client configuration"))
        elif driver.get("kerberos") and not driver.get("kerberos_credentials"):
            out.append(Finding("kerberos", FAIL, f"{core} asks for Kerberos and the driver holds no ticket or keytab",
                               "kinit (or spark.kerberos.principal with spark.kerberos.keytab)"))
        else:
            out.append(Finding("hadoop", OK, f"HADOOP_CONF_DIR={conf_dir}" + (
                " (Kerberos: credentials found)" if driver.get("kerberos") else "")))
    return out


# --------------------------------------------------------------------------- the driver's own facts

def driver_report(conf: dict, environ: dict) -> dict:
    from tfos.cluster.executor.doctor import probe

    report = probe("", 0, 0.0)
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        report["java_version"] = (out.stderr or out.stdout).splitlines()[0] if out.returncode == 0 else ""
        report["java"] = out.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        report["java"] = False
    conf_dir = environ.get("HADOOP_CONF_DIR", "")
    if conf_dir:
        core = os.path.join(conf_dir, "core-site.xml")
        try:
            with open(core, encoding="utf-8") as f:
                text = f.read()
            report["hadoop_conf_readable"] = True
            from tfos.data.hadoop_conf import site_properties

            report["kerberos"] = site_properties(text).get("hadoop.security.authentication", "").lower() == "kerberos"
        except OSError:
            report["hadoop_conf_readable"] = False
        if report.get("kerberos"):
            keytab = conf.get("spark.kerberos.keytab")
            has_ticket = False
            try:
                has_ticket = subprocess.run(["klist", "-s"], timeout=10).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                pass
            report["kerberos_credentials"] = bool(has_ticket or (keytab and os.path.isfile(keytab)))
    return report


class _Banner:
    """The listener executors must reach: sends the banner to each connection, then closes it; at
    most 64 connections at once, a deadline per connection, any accept error survived."""

    def __init__(self, bind: str, ports):
        from tfos.cluster.executor.doctor import BANNER

        self.banner = BANNER
        self.sock = None
        last = None
        for port in ports or (0,):
            try:
                self.sock = socket.create_server((bind, port), backlog=64)
                break
            except OSError as e:
                last = e
        if self.sock is None:
            raise ConfigError(f"the doctor cannot listen on {bind}:{ports}: {last}")
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.stopped = threading.Event()
        self.slots = threading.BoundedSemaphore(64)
        threading.Thread(target=self._loop, name="tfos-doctor-listener", daemon=True).start()

    def _loop(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stopped.is_set():
                    return
                time.sleep(0.1)
                continue
            if not self.slots.acquire(blocking=False):
                conn.close()
                continue
            try:
                conn.settimeout(5.0)
                conn.sendall(self.banner)
            except OSError:
                pass
            finally:
                conn.close()
                self.slots.release()

    def close(self):
        self.stopped.set()
        self.sock.close()


def expected_executors(master: str, conf: dict) -> int | None:
    """Pure: how many executors the application asked for (``local-cluster[N,...]``,
    ``spark.executor.instances``), None when it does not say."""
    import re

    m = re.match(r"local-cluster\[(\d+),", master or "")
    if m:
        return int(m.group(1))
    value = conf.get("spark.executor.instances")
    return int(value) if value and str(value).isdigit() and int(value) > 0 else None


def executors_expected(sc, conf: dict, wait: float = 60.0) -> int:
    """One task per executor: as many as the application asked for, once they registered (up to
    ``wait`` seconds), else as many as there are."""
    if sc.master == "local" or sc.master.startswith("local["):
        return 1  # the driver's own executor
    want = expected_executors(sc.master, conf)
    deadline = Deadline(wait)
    while True:
        have = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        if (want is None and have > 0) or (want is not None and have >= want) or deadline.expired():
            return max(1, want or have)
        time.sleep(0.5)


def run(spark, timeout: float = 10.0, tasks: int | None = None, job_timeout: float = 300.0) -> list[Finding]:
    """Run the doctor's job on ``spark`` (a SparkSession or SparkContext) and judge what it found. The
    job is cancelled after ``job_timeout`` seconds (no executor slots, a stuck task): that is a finding."""
    from tfos.cluster.driver.spark import control_address
    from tfos.cluster.executor.doctor import task

    sc = getattr(spark, "sparkContext", spark)
    conf = dict(sc.getConf().getAll())
    address = control_address(conf, os.environ)
    listener = _Banner(address.bind, address.ports)
    try:
        n = tasks or executors_expected(sc, conf)
        where = f"{address.advertise}:{listener.port}"
        rdd = sc.parallelize(range(n), n).mapPartitions(task(address.advertise, listener.port, timeout))
        lines, error = _collect_within(sc, rdd, job_timeout)
    finally:
        listener.close()
    if error is not None:
        return [Finding("executors", FAIL, f"the doctor's Spark job of {n} task(s) did not finish: {error}",
                        "check that the cluster gives this application executors (the master URL, "
                        "spark.executor.instances, the queue) and that their Python runs pyspark")]
    executors = [json.loads(line) for line in lines]
    return judge(driver_report(conf, os.environ), executors, conf, dict(os.environ), where)


def _collect_within(sc, rdd, seconds: float):
    """``(rdd.collect(), None)``, or ``(None, why)`` when it failed or ran past ``seconds`` (then the job
    is cancelled)."""
    group = f"tfos-doctor-{os.getpid()}-{time.monotonic_ns()}"
    out: dict = {}

    def collect():
        try:
            sc.setJobGroup(group, "tfos doctor", interruptOnCancel=True)
            out["lines"] = rdd.collect()
        except Exception as e:  # the finding says what Spark said
            out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"

    thread = threading.Thread(target=collect, name="tfos-doctor-job", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        thread.join(30)
        return None, f"still running after {seconds:g} s (cancelled)"
    if "error" in out:
        return None, out["error"]
    return out["lines"], None


def table(findings: list[Finding]) -> str:
    """The findings as the command prints them: one row each, the fix under a row that needs one."""
    width = max(len(f.check) for f in findings)
    rows = []
    for f in findings:
        rows.append(f"{f.check:<{width}}  {f.status.upper():<4}  {f.detail}")
        if f.fix and f.status != OK:
            rows.append(f"{'':<{width}}        fix: {f.fix}")
    return "\n".join(rows)
