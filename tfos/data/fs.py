"""Paths and URIs -> pyarrow filesystems, and help when this process has no Hadoop client.

Runs in every process that touches files: the driver (listing, :func:`~tfos.data.save_as_tfrecords`),
the Spark tasks that write TFRecords, and the TF processes that list and read their shards.
Imports pyarrow lazily; never TensorFlow or pyspark.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import subprocess
import threading
from urllib.parse import quote, unquote, urlsplit

from tfos.data.hadoop_conf import (  # noqa: F401 (fs's callers use these names)
    core_site_default_fs, default_fs_of, hadoop_core_site, hadoop_default_fs, site_properties)
from tfos.errors import ConfigError, HadoopConfigError

logger = logging.getLogger(__name__)

_HADOOP_SCHEMES = ("hdfs", "viewfs")
_URI_SAFE = "/:@!$&'()*+,;=-._~"


def _is_hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def _scheme(uri: str) -> str | None:
    """The lower-cased URI scheme, or None for a plain local path."""
    if "://" in uri:
        return uri.split("://", 1)[0].lower()
    if uri.lower().startswith("file:"):
        return "file"
    return None


def _from_uri(uri: str):
    """``pyarrow.fs.FileSystem.from_uri`` (a seam for tests)."""
    from pyarrow import fs as pafs

    return pafs.FileSystem.from_uri(uri)


_hadoop_filesystems: dict = {}
_hadoop_lock = threading.Lock()


def _resolve(uri) -> tuple:
    """``(filesystem, path on it, prefix)``; ``prefix + quoted(path)`` rebuilds a URI, and an empty
    prefix means a plain local path. Hadoop filesystems are connected once per process."""
    import pyarrow as pa
    from pyarrow import fs as pafs

    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise ConfigError(f"expected a path or URI string, got {uri!r}")
    scheme = _scheme(uri)
    if scheme is None:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri)), ""
    parts = urlsplit(uri)
    if scheme in _HADOOP_SCHEMES:
        key = (scheme, parts.netloc, parts.query)
        with _hadoop_lock:
            fs = _hadoop_filesystems.get(key)
            if fs is None:
                fs = _connect_hadoop(uri)
                _hadoop_filesystems[key] = fs
        return fs, unquote(parts.path) or "/", f"{scheme}://{parts.netloc}"
    try:
        fs, path = _from_uri(uri)
    except pa.ArrowInvalid as e:
        if scheme == "file":  # not a valid URI (e.g. an unescaped space, file://localhost/): take the path as is
            raw = re.sub(r"^file:(//(localhost)?)?", "", uri, flags=re.IGNORECASE)
            if raw.startswith("/"):
                return pafs.LocalFileSystem(), os.path.normpath(raw), "file://"
        raise ConfigError(f"cannot open {uri!r}: {e}. Use an hdfs://, viewfs://, file://, s3:// or gs:// URI, "
                          "or a plain local path.") from e
    if scheme == "file":
        return fs, path, "file://"
    return fs, path, (f"{scheme}://{parts.netloc}" if path.startswith("/") else f"{scheme}://")


def filesystem(uri) -> tuple:
    """``(pyarrow.fs.FileSystem, path on it)`` for a plain path or a URI, opened the way
    ``tfos.data`` opens them: ``hdfs://``/``viewfs://`` through hdfs-native (no JVM), plain paths on
    the local filesystem. For small files of your own (a result, a manifest) next to the data."""
    fs, path, _prefix = _resolve(uri)
    return fs, path


def _to_uri(prefix: str, path: str) -> str:
    return prefix + quote(path, safe=_URI_SAFE) if prefix else path


def _join(path: str, name: str) -> str:
    return posixpath.join(path, name) if path else name


def _local_path(uri: str) -> str | None:
    """The local filesystem path of a plain path or file:// URI, else None."""
    scheme = _scheme(uri)
    if scheme is None:
        return os.path.abspath(os.path.expanduser(uri))
    if scheme == "file":
        return _resolve(uri)[1]
    return None


def _file_list(files) -> list[str]:
    """A path/URI or an iterable of them -> a list of str."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out = []
    for f in files:
        f = os.fspath(f) if isinstance(f, os.PathLike) else f
        if not isinstance(f, str):
            raise ConfigError(f"files must be paths or URIs (str), got {f!r}")
        out.append(f)
    return out


# --------------------------------------------------------------------------- Hadoop client

def _hadoop_command() -> str | None:
    home = os.environ.get("HADOOP_HOME")
    if home:
        cand = os.path.join(home, "bin", "hadoop")
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("hadoop")


def _ensure_hadoop_classpath() -> None:
    """libhdfs needs the Hadoop jars on CLASSPATH (wildcards are not expanded by the JVM it starts).
    If CLASSPATH has none and a ``hadoop`` command is found, set it from ``hadoop classpath --glob``
    before the JVM starts."""
    current = os.environ.get("CLASSPATH", "")
    if "hadoop" in current.lower():
        return
    cmd = _hadoop_command()
    if not cmd:
        return
    try:
        out = subprocess.run([cmd, "classpath", "--glob"], capture_output=True, text=True, timeout=120,
                             check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("could not run '%s classpath --glob' to set CLASSPATH for libhdfs: %s", cmd, e)
        return
    if out:
        os.environ["CLASSPATH"] = out + (os.pathsep + current if current else "")
        logger.info("CLASSPATH set from '%s classpath --glob' (%d entries) for libhdfs", cmd,
                    out.count(os.pathsep) + 1)


def _libhdfs_loadable() -> bool:
    """Whether pyarrow can load the JVM and libhdfs in this process (True when unknown)."""
    try:
        from pyarrow._hdfs import _have_libhdfs
    except ImportError:
        return True
    return bool(_have_libhdfs())


def _java_home_hint() -> str:
    java = shutil.which("java")
    if not java:
        return "not set, and no `java` on PATH: install a JDK"
    home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
    return f"not set; `java` on PATH suggests: export JAVA_HOME={home}"


def _hadoop_help(uri: str, cause: str) -> str:
    env = os.environ

    def state(name: str) -> str:
        value = env.get(name)
        return f"currently {value!r}" if value else "not set"

    classpath = env.get("CLASSPATH", "")
    cp_state = ("has Hadoop jars" if "hadoop" in classpath.lower()
                else ("set but has no Hadoop jars" if classpath else "not set"))
    lines = [
        f"Cannot open {uri}: no working Hadoop client in this process ({cause}).",
        f"The simplest client needs no JVM: {_hdfs_install_hint()}, with HADOOP_CONF_DIR set for hdfs:/// and HA "
        "nameservices.",
        "Without it, pyarrow reaches HDFS through libhdfs, which runs Hadoop's Java client in a JVM. Set these, before the "
        "process starts, on every host that touches hdfs:// (the driver for list_files / save_as_tfrecords, "
        "the executors and TF nodes for the readers and writers):",
        f"  JAVA_HOME=<JDK directory>  ({state('JAVA_HOME') if env.get('JAVA_HOME') else _java_home_hint()})",
        f"  HADOOP_HOME=<Hadoop installation>  ({state('HADOOP_HOME')})",
        f"  CLASSPATH=$($HADOOP_HOME/bin/hadoop classpath --glob)  ({cp_state})",
        f"  ARROW_LIBHDFS_DIR=<directory holding libhdfs.so>, if it is not in $HADOOP_HOME/lib/native  "
        f"({state('ARROW_LIBHDFS_DIR')})",
        "  HADOOP_CONF_DIR=<directory with core-site.xml/hdfs-site.xml> for hdfs:/// and HA nameservices  "
        f"({state('HADOOP_CONF_DIR')})",
        "For Spark executors pass them as spark.executorEnv.<NAME> (spark.yarn.appMasterEnv.<NAME> on YARN). "
        "If the client is set up, check the namenode host:port in the URI.",
        "Or avoid HDFS in Python: use file:// paths on a shared mount (NFS, an HDFS FUSE or NFS gateway mount). "
        "(load_tfrecords needs none of this: it reads through Spark's own Hadoop client.)",
    ]
    return "\n".join(lines)


def _hdfs_install_hint() -> str:
    from tfos.data.hdfs import INSTALL_HINT

    return INSTALL_HINT


def _hdfs_native_installed() -> bool:
    from tfos.data import hdfs

    return hdfs.installed()


def _connect_hadoop(uri: str):
    """hdfs-native when it is installed (``tfos[hdfs]``: no JVM, chosen by measurement, see
    docs/hadoop.md), else pyarrow's libhdfs with the set-up it needs."""
    if _hdfs_native_installed():
        from tfos.data.hdfs import hdfs_filesystem

        return hdfs_filesystem(uri)
    _ensure_hadoop_classpath()
    if not _libhdfs_loadable():
        raise HadoopConfigError(_hadoop_help(uri, "pyarrow could not load the JVM and libhdfs"))
    try:
        fs, _ = _from_uri(uri)
    except OSError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise HadoopConfigError(_hadoop_help(uri, f"pyarrow: {first}")) from e
    return fs


def spark_default_fs(sc) -> str:
    """``fs.defaultFS`` of a SparkContext's Hadoop configuration (the driver's), ``file:///`` when unset."""
    try:
        return sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    except Exception:
        return "file:///"
