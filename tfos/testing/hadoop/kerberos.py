"""A Kerberos KDC for the secure test cluster: Hadoop's MiniKdc (Apache Kerby) as a JVM of its
own, from the ``hadoop-minikdc`` jar on Maven Central. Its realm is ``EXAMPLE.COM``; one keytab
holds the test user's principal (first, so that MIT Kerberos's client-keytab login picks it) and
the daemons' service principals. Files in ``DIR/kdc``: ``krb5.conf``, ``tfos.keytab``, and
``ccache`` once :func:`login` ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tfos.host.deadline import Deadline
from tfos.testing.hadoop.artifacts import HadoopClusterError

REALM = "EXAMPLE.COM"
USER = "tfos"  # the test user: tfos@EXAMPLE.COM, "tfos" to HDFS
SERVICE_HOST = "localhost"  # the service principals' host part: hdfs/localhost, HTTP/localhost
READY_LINE = "Standalone MiniKdc Running"


def principal(name: str) -> str:
    return f"{name}@{REALM}"


def service_principal(service: str) -> str:
    return principal(f"{service}/{SERVICE_HOST}")


def kdc_args(kdc_dir: Path) -> list[str]:
    """MiniKdc's arguments: work dir, properties file, keytab, principals (the user's first)."""
    props = kdc_dir / "kdc.properties"
    props.write_text(f"kdc.bind.address={SERVICE_HOST}\nkdc.port=0\n")
    return [str(kdc_dir), str(props), str(kdc_dir / "tfos.keytab"), USER,
            f"hdfs/{SERVICE_HOST}", f"HTTP/{SERVICE_HOST}"]


def wait_ready(log: Path, pid_alive, timeout: float) -> None:
    """Until MiniKdc says it runs (it has then written krb5.conf and the keytab)."""
    deadline = Deadline(timeout)
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if READY_LINE in text:
            return
        if not pid_alive():
            raise HadoopClusterError(f"MiniKdc exited during start-up; log tail:\n{text[-3000:]}")
        if deadline.expired():
            raise HadoopClusterError(f"MiniKdc not ready after {timeout:.0f}s; log tail:\n{text[-3000:]}")
        time.sleep(0.2)


def site(keytab: Path) -> dict[str, dict]:
    """The security settings of core-site, hdfs-site and yarn-site for a Kerberos cluster. Every
    daemon logs in as ``hdfs/localhost`` (the ResourceManager renews the jobs' HDFS tokens as
    ``hdfs``). The DataNodes keep unprivileged ports without SASL on data transfer
    (``ignore.secure.ports.for.testing``): a test setting, which spares the cluster root ports or
    TLS keystores; RPC is Kerberos all the same, and block access tokens are on. Containers run as
    the NodeManager's user (the default container executor), as in the rest of the test cluster.
    Log aggregation is off: with security on it opens container logs through Hadoop's native
    SecureIO, which Maven's jars lack, and the NodeManager shuts down ("Secure IO is not possible
    without native code extensions"); container logs stay in the NodeManagers' log dirs
    (:func:`tfos.testing.hadoop.yarn.local_logs`)."""
    hdfs_service, http = service_principal("hdfs"), service_principal("HTTP")
    return {"yarn-site.xml": {"yarn.resourcemanager.principal": hdfs_service,
                              "yarn.resourcemanager.keytab": keytab,
                              "yarn.nodemanager.principal": hdfs_service,
                              "yarn.nodemanager.keytab": keytab,
                              "yarn.log-aggregation-enable": "false"},
            "core-site.xml": {"hadoop.security.authentication": "kerberos",
                              "hadoop.security.auth_to_local": "DEFAULT"},
            "hdfs-site.xml": {"dfs.namenode.kerberos.principal": hdfs_service,
                              "dfs.namenode.keytab.file": keytab,
                              "dfs.datanode.kerberos.principal": hdfs_service,
                              "dfs.datanode.keytab.file": keytab,
                              "dfs.web.authentication.kerberos.principal": http,
                              "dfs.web.authentication.kerberos.keytab": keytab,
                              "dfs.block.access.token.enable": "true",
                              "ignore.secure.ports.for.testing": "true"}}


def client_env(kdc_dir: Path, keytab: bool = True) -> dict[str, str]:
    """Environment for a Kerberos client of the test realm (MIT Kerberos, as hdfs-native loads it):
    the realm's krb5.conf, a ticket cache in ``kdc_dir``, and with ``keytab`` the user's keytab as
    the client keytab (MIT logs in from it when the cache holds no ticket: no kinit needed)."""
    env = {"KRB5_CONFIG": str(kdc_dir / "krb5.conf"), "KRB5CCNAME": f"FILE:{kdc_dir / 'ccache'}"}
    if keytab:
        env["KRB5_CLIENT_KTNAME"] = str(kdc_dir / "tfos.keytab")
    return env


def login(kdc_dir: Path, default_fs: str, conf_dir: Path, timeout: float = 60) -> None:
    """Fill ``kdc_dir/ccache`` with the user's ticket, which Hadoop's Java clients read (this JDK
    has no kinit): one hdfs-native call logged in from the client keytab, in a child process."""
    code = "import sys, hdfs_native; hdfs_native.Client(sys.argv[1]).get_file_info('/')"
    env = {**os.environ, **client_env(kdc_dir), "HADOOP_CONF_DIR": str(conf_dir)}
    env.pop("HADOOP_TOKEN_FILE_LOCATION", None)
    proc = subprocess.run([sys.executable, "-c", code, default_fs], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0 or not (kdc_dir / "ccache").exists():
        raise HadoopClusterError(f"Kerberos login of {principal(USER)} failed: {proc.stderr[-2000:]}")
