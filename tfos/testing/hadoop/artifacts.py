"""Hadoop's own jars for the test cluster, from Maven Central into this user's cache.

``fetch()`` writes a small POM naming the daemons' artifacts and runs ``mvn
dependency:copy-dependencies`` with its local repository in the cache too; a stamp keyed by the
version and the POM makes later calls offline.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from tfos.errors import TFOSError
from tfos.host.private import user_cache_dir

log = logging.getLogger(__name__)

HADOOP_VERSION = "3.5.0"
ARTIFACTS = ("hadoop-common", "hadoop-hdfs", "hadoop-hdfs-client", "hadoop-yarn-client",
             "hadoop-yarn-server-resourcemanager", "hadoop-yarn-server-nodemanager",
             "hadoop-yarn-server-timelineservice",  # the RM web app needs its classes
             "hadoop-minikdc")  # the KDC of the Kerberos cluster
FS_SHELL = "org.apache.hadoop.fs.FsShell"                              # -ls /
YARN_LOGS = "org.apache.hadoop.yarn.client.cli.LogsCLI"                # -applicationId ID
YARN_APPLICATION = "org.apache.hadoop.yarn.client.cli.ApplicationCLI"  # application -list
YARN_NODE = "org.apache.hadoop.yarn.client.cli.NodeCLI"                # -list -all
NAMENODE = "org.apache.hadoop.hdfs.server.namenode.NameNode"
DATANODE = "org.apache.hadoop.hdfs.server.datanode.DataNode"
RESOURCEMANAGER = "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"
NODEMANAGER = "org.apache.hadoop.yarn.server.nodemanager.NodeManager"
MINIKDC = "org.apache.hadoop.minikdc.MiniKdc"
HEAPS = {NAMENODE: "512m", RESOURCEMANAGER: "512m", DATANODE: "256m", NODEMANAGER: "384m", MINIKDC: "128m"}
# C1 only and the serial collector: quick start-up and few threads on a small test box (the
# daemons, and Spark's own JVMs on the test YARN: yarn.SPARK_JVM_OPTIONS).
SMALL_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
JVM_FLAGS = (*SMALL_JVM_FLAGS, "-Djava.net.preferIPv4Stack=true")
# hadoop-hdfs 3.5.0 on Maven Central has no webapps/ resources, and the NameNode and
# DataNode exit with "webapps/hdfs not found in CLASSPATH"; empty directories suffice
# (WebHDFS and /jmx are servlets registered in code).
_WEBAPP_STUBS = ("hdfs", "datanode", "secondary", "journal", "static")
_LOG4J = """hadoop.root.logger=INFO,console
log4j.rootLogger=${hadoop.root.logger}
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
"""


class HadoopClusterError(TFOSError):
    """The test cluster could not be fetched, started, queried or stopped."""


def cache_dir(version: str = HADOOP_VERSION) -> Path:
    """``$TFOS_CACHE_DIR/hadoop-<version>`` (default ``~/.cache/tfos``): this user's cache, created
    0700 and refused when it is a symlink, foreign-owned or open to others (``check_private``)."""
    base = user_cache_dir()
    return Path(base) / f"hadoop-{version}"


def _pom(version: str) -> str:
    deps = "".join(f"<dependency><groupId>org.apache.hadoop</groupId><artifactId>{a}</artifactId>"
                   f"<version>{version}</version></dependency>\n" for a in ARTIFACTS)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>\n'
            '<groupId>tfos.testing</groupId><artifactId>hadoop-test-cluster</artifactId>'
            f'<version>1</version><packaging>pom</packaging>\n'
            f'<dependencies>\n{deps}</dependencies></project>\n')


def fetch(version: str = HADOOP_VERSION, mvn: str = "mvn", timeout: float = 1800) -> Path:
    """Download the jars unless the stamp says they are there; return the cache dir."""
    root, pom = cache_dir(version), _pom(version)
    stamp = root / f"complete-{version}-{hashlib.sha256(pom.encode()).hexdigest()[:12]}.stamp"
    if stamp.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers wait for one download
        if stamp.exists():
            return root
        if shutil.which(mvn) is None:
            raise HadoopClusterError(f"Maven ({mvn!r}) is needed to fetch the Hadoop {version} jars")
        (root / "pom.xml").write_text(pom)
        lib, tmp = root / "lib", root / "lib.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(root / "pom.xml"), f"-Dmaven.repo.local={root / 'm2'}",
               "dependency:copy-dependencies", f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"]
        log.info("fetching Hadoop %s jars into %s", version, root)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise HadoopClusterError(f"mvn did not finish within {timeout:.0f}s: {cmd}") from e
        if proc.returncode != 0:
            raise HadoopClusterError(f"mvn failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        for name in _WEBAPP_STUBS:
            (root / "webapps-stub" / "webapps" / name).mkdir(parents=True, exist_ok=True)
        for old in root.glob("complete-*.stamp"):
            old.unlink()
        stamp.write_text(f"{len(list(lib.glob('*.jar')))} jars\n")
        log.info("fetched Hadoop %s in %.0fs", version, time.monotonic() - t0)
    return root
