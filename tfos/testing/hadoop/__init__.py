"""A real Hadoop test cluster (HDFS and YARN daemons as JVMs on this machine), for tests and the
Hadoop walk-through. Jars come from Maven Central into this user's cache (no Hadoop install)::

    python -m tfos.testing.hadoop up --dir DIR    # last line: export HADOOP_CONF_DIR=DIR/conf
    python -m tfos.testing.hadoop down --dir DIR  # stops every daemon and its containers
    python -m tfos.testing.hadoop up --dir DIR --kerberos [--no-yarn]   # a MiniKdc first, Kerberos daemons

    with HadoopCluster(tmp_dir) as cluster:       # or HadoopCluster.attach(DIR) after `up`
        cluster.fs("-ls", "/")                     # Hadoop's own FsShell, not a tfos client

DIR holds ``conf/`` (the client HADOOP_CONF_DIR), ``daemons/worker-<i>/conf``, ``data/``,
``logs/<daemon>.log``, ``pids`` (JSON) and ``cluster.json`` (ports), and with Kerberos ``kdc/``
(:mod:`tfos.testing.hadoop.kerberos`).
"""

from tfos.testing.hadoop.artifacts import (FS_SHELL, HADOOP_VERSION, YARN_APPLICATION, YARN_LOGS, YARN_NODE,
                                           HadoopClusterError, cache_dir, fetch)
from tfos.testing.hadoop.cluster import HadoopCluster

__all__ = ["HadoopCluster", "HadoopClusterError", "fetch", "cache_dir", "HADOOP_VERSION", "FS_SHELL", "YARN_LOGS",
           "YARN_APPLICATION", "YARN_NODE"]
