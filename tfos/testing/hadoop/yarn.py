"""spark-submit to the test cluster's YARN, and YARN's own clients (``yarn logs``, ``yarn
application``) through its conf: what the Hadoop suite uses to run tfos jobs on YARN the way a
user does.

The pyspark wheel bundles Spark's YARN client and the Hadoop 3.5 client, so ``HADOOP_CONF_DIR`` is
all it needs to find the ResourceManager. On one machine the containers reuse this Python and
Spark's jars where they are (``local:`` URIs), so nothing is uploaded but the application's own
files; a real cluster ships a packed environment instead (docs/hadoop.md).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from tfos.host.deadline import Deadline
from tfos.testing.hadoop.artifacts import SMALL_JVM_FLAGS, YARN_NODE
from tfos.testing.hadoop.cluster import HadoopCluster, HadoopClusterError

LOGS_CLI = "org.apache.hadoop.yarn.client.cli.LogsCLI"
APPLICATION_CLI = "org.apache.hadoop.yarn.client.cli.ApplicationCLI"
CLIS = {"logs": LOGS_CLI, "application": APPLICATION_CLI, "applicationattempt": APPLICATION_CLI,
        "container": APPLICATION_CLI, "node": YARN_NODE}


def cli_args(argv) -> list[str]:
    """``yarn SUBCOMMAND ARGS`` as a Java main class and its arguments (what Hadoop's ``yarn`` script
    does: ApplicationCLI also takes the subcommand's name as its first argument)."""
    sub, *rest = argv
    if sub not in CLIS:
        raise HadoopClusterError(f"no YARN client for {sub!r}; one of {sorted(CLIS)}")
    return [CLIS[sub], *([sub] if CLIS[sub] == APPLICATION_CLI else []), *rest]


_APP_ID = re.compile(r"application_\d+_\d+")

#: Spark's own JVMs here (the driver, the ApplicationMaster, each executor) start as the daemons do:
#: a test application's JVMs live a minute or two, and C2's compiler threads and G1's threads would
#: take the 2 cores its TF processes need
SPARK_JVM_OPTIONS = " ".join(SMALL_JVM_FLAGS)


@dataclass
class Submitted:
    """A finished spark-submit: its exit code, output and the YARN application id it got."""
    returncode: int
    stdout: str
    stderr: str
    app_id: str | None

    def describe(self) -> str:
        """Exit code, application, stdout's tail, then the first lines of stderr naming an error and
        stderr's tail (spark-submit logs at INFO)."""
        errors = [line for line in self.stderr.splitlines() if re.search(r"Error|Exception|FAILED|Traceback", line)]
        return (f"spark-submit exited {self.returncode} (application {self.app_id})\n"
                f"stdout:\n{self.stdout[-2000:]}\nstderr lines naming an error:\n" + "\n".join(errors[:20])
                + f"\nstderr:\n{self.stderr[-4000:]}")


def pyspark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def host_address() -> str:
    """This machine's first global IPv4 address outside the multi-host harness's test subnet: what
    the YARN containers (on this machine) are told to reach the driver's control service at.
    tfos refuses a loopback address for a non-local master such as ``yarn``, rightly: on a real
    cluster the executors run elsewhere. Falls back to 127.0.0.1."""
    import ipaddress

    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "127.0.0.1"
    harness = ipaddress.ip_network("198.51.100.0/24")
    for word in out.split():
        if "/" in word and word[0].isdigit():
            address = ipaddress.ip_interface(word).ip
            if address not in harness:
                return str(address)
    return "127.0.0.1"


def submit_environment(cluster: HadoopCluster, python: str = sys.executable) -> dict[str, str]:
    """The environment spark-submit needs for this cluster's YARN, with ``python`` on every side."""
    home = pyspark_home()
    archives = [os.path.join(home, "python", "lib", "pyspark.zip")]
    archives += sorted(glob.glob(os.path.join(home, "python", "lib", "py4j-*-src.zip")))[-1:]
    env = dict(os.environ)
    env.update({"HADOOP_CONF_DIR": str(cluster.conf_dir), "SPARK_LOCAL_IP": cluster.host,
                "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
                "TFOS_SERVER_HOST": host_address(),  # every NodeManager runs on this machine
                "PYSPARK_ARCHIVES_PATH": ",".join("local:" + a for a in archives)})
    env.pop("SPARK_HOME", None)  # the wheel's own Spark, whatever the caller's shell points at
    if cluster.kerberos:  # the test user after kinit: its ticket for the driver, the realm for every JVM
        from tfos.testing.hadoop import kerberos

        env.update(kerberos.client_env(cluster.kdc_dir, keytab=False))
        env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} {cluster.krb5_option}".strip()
    return env


def submit_command(cluster: HadoopCluster, script: str, args=(), *, deploy_mode: str = "client",
                   num_executors: int = 2, executor_memory: str = "768m", memory_overhead: str = "1536m",
                   py_files=(), conf: dict | None = None, python: str = sys.executable) -> list[str]:
    """``spark-submit --master yarn`` of ``script``. The executor container must hold the JVM, the
    Python worker, tfos's node agent and the TF process (YARN counts the whole process tree):
    ``memory_overhead`` is their room."""
    settings = {"spark.yarn.jars": f"local:{pyspark_home()}/jars/*",
                "spark.driver.host": cluster.host,
                "spark.driver.memory": "512m", "spark.yarn.am.memory": "512m",
                "spark.executor.memoryOverhead": memory_overhead,
                "spark.executor.cores": "1",
                "spark.pyspark.python": python, "spark.pyspark.driver.python": python,
                "spark.yarn.maxAppAttempts": "1",
                "spark.yarn.appMasterEnv.TFOS_SERVER_HOST": host_address(),
                "spark.ui.enabled": "false",
                **{f"spark.{jvm}.extraJavaOptions": SPARK_JVM_OPTIONS for jvm in ("driver", "yarn.am", "executor")}}
    from tfos.tunnel import build as tunnel

    binary, _shim = tunnel.built_paths()
    if os.path.isfile(binary):  # YARN's containers have no home of this user: the node tunnel built here
        settings["spark.executorEnv.TFOS_TUNNEL_DIR"] = os.path.dirname(binary)
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:  # a source checkout the caller runs from: the containers import the same tfos
        settings["spark.executorEnv.PYTHONPATH"] = pythonpath
        settings["spark.yarn.appMasterEnv.PYTHONPATH"] = pythonpath
    if cluster.kerberos:  # Spark logs in from the keytab and hands HDFS tokens to every container
        from tfos.testing.hadoop import kerberos

        krb5 = f"{SPARK_JVM_OPTIONS} {cluster.krb5_option}"
        settings.update({"spark.kerberos.principal": kerberos.principal(kerberos.USER),
                         "spark.kerberos.keytab": str(cluster.kdc_dir / "tfos.keytab"),
                         "spark.yarn.am.extraJavaOptions": krb5, "spark.executor.extraJavaOptions": krb5,
                         "spark.driver.extraJavaOptions": krb5})
    for key, value in (conf or {}).items():  # a caller's JVM options go beside the realm's, not instead
        settings[key] = f"{settings[key]} {value}" if key.endswith("extraJavaOptions") and key in settings else value
    submit = os.path.join(os.path.dirname(python), "spark-submit")
    cmd = [submit if os.path.exists(submit) else "spark-submit", "--master", "yarn", "--deploy-mode", deploy_mode,
           "--num-executors", str(num_executors), "--executor-memory", executor_memory]
    if py_files:
        cmd += ["--py-files", ",".join(py_files)]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [script, *map(str, args)]


def spark_submit(cluster: HadoopCluster, script: str, args=(), *, timeout: float = 600, cwd: str | None = None,
                 **kw) -> Submitted:
    """Run :func:`submit_command` to its end (at most ``timeout`` seconds)."""
    cmd = submit_command(cluster, script, args, **kw)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                             env=submit_environment(cluster, kw.get("python", sys.executable)))
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        app = _APP_ID.search(stderr)
        if app:
            kill(cluster, app.group(0), check=False)
        raise HadoopClusterError(f"spark-submit did not finish within {timeout:.0f}s "
                                 f"(application {app.group(0) if app else 'unknown'}): {stderr[-3000:]}") from e
    app = _APP_ID.search(out.stderr) or _APP_ID.search(out.stdout)
    return Submitted(out.returncode, out.stdout, out.stderr, app.group(0) if app else None)


def logs(cluster: HadoopCluster, app_id: str, *, want=(), timeout: float = 90) -> str:
    """``yarn logs -applicationId app_id``: every container's aggregated logs. The NodeManagers
    upload them after the application ends; this waits (up to ``timeout``) until each string in
    ``want`` appears in them."""
    deadline = Deadline(timeout)
    while True:
        out = cluster.hadoop_cli(cli_args(["logs", "-applicationId", app_id]), check=False, timeout=120)
        text = out.stdout + out.stderr
        missing = [w for w in want if w not in text]
        if out.returncode == 0 and not missing:
            return text
        if deadline.expired():
            raise HadoopClusterError(f"yarn logs of {app_id} lack {missing or 'nothing'} after {timeout:.0f}s "
                                     f"(exit {out.returncode}): {text[-3000:]}")
        time.sleep(2)


def local_logs(cluster: HadoopCluster, app_id: str) -> dict[str, str]:
    """``{container/file: text}`` of an application's logs where the NodeManagers keep them (all on
    this machine): what to read when log aggregation is off (the Kerberos cluster)."""
    found = {}
    for path in sorted(cluster.dir.glob(f"data/worker-*/nm-logs/{app_id}/container_*/*")):
        if path.is_file():
            found[f"{path.parent.name}/{path.name}"] = path.read_text(errors="replace")
    return found


def application_report(cluster: HadoopCluster, app_id: str) -> dict:
    """The ResourceManager's view of ``app_id`` (REST: state, finalStatus, diagnostics)."""
    return cluster.rm_rest(f"apps/{app_id}")["app"]


def running_applications(cluster: HadoopCluster) -> list[str]:
    """Ids of the applications the ResourceManager has RUNNING, oldest first."""
    apps = (cluster.rm_rest("apps?states=RUNNING").get("apps") or {}).get("app") or []
    return sorted(a["id"] for a in apps)


def kill(cluster: HadoopCluster, app_id: str, check: bool = True) -> subprocess.CompletedProcess:
    """``yarn application -kill app_id``."""
    return cluster.hadoop_cli(cli_args(["application", "-kill", app_id]), check=check, timeout=120)
