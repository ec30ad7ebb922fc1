"""hdfs:// and viewfs:// for tfos's filesystem layer through hdfs-native (HDFS's RPC protocol in
Rust: no JVM, no libhdfs, no Hadoop install; Kerberos and NameNode HA from the Hadoop
configuration in ``$HADOOP_CONF_DIR``).

:func:`hdfs_filesystem` returns a ``pyarrow.fs.PyFileSystem`` over :class:`HdfsNativeHandler`, so
everything in :mod:`tfos.data` (listing, sharding, the readers, TFRecord writing) and the TF
process's staging mirror (:mod:`tfos.cluster.node.staging`) use one code path for every scheme.
Reads stream, never whole into memory: a stream read front to back (``open_input_stream``: the
TFRecord and CSV readers, record counts, the mirror's restore, ``copy_file``) goes through
hdfs-native's range stream; ``open_input_file`` (Parquet) gets the seekable reader. Runs in every
process that touches files; imports hdfs-native and pyarrow lazily.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from tfos.errors import HadoopConfigError

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'tfos[hdfs]' (hdfs-native) on the driver and every executor"


def installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("hdfs_native") is not None


def hdfs_filesystem(uri: str) -> pafs.PyFileSystem:
    """A pyarrow filesystem for the cluster named by ``uri`` (``hdfs://nn:port/...``,
    ``hdfs:///...`` for fs.defaultFS, or ``viewfs://...``)."""
    parts = urlsplit(uri)
    return pafs.PyFileSystem(HdfsNativeHandler(f"{parts.scheme}://{parts.netloc}"))


def client_url(base: str, core: dict, token_file: str | None, resolve=socket.gethostbyname) -> str | None:
    """The URL hdfs-native connects to for ``base`` (None: fs.defaultFS, as it reads it).

    hdfs-native authenticates with the delegation token whose service is its URL's ``host:port``,
    character for character. Hadoop names a non-HA NameNode's tokens by IP (``ip:port``, unless
    ``hadoop.security.token.service.use_ip`` is false), so on a YARN container (tokens in
    ``HADOOP_TOKEN_FILE_LOCATION``, no Kerberos ticket) a NameNode named by host name would not
    find its token: with a token file, a host name becomes its address. An HA nameservice, a
    ``viewfs://`` URL or an address is left as it is. Pure but for ``resolve``."""
    from tfos.data.hadoop_conf import default_fs_of

    parts = urlsplit(base)
    url = base if parts.netloc else None
    default = urlsplit(default_fs_of(core) or "")
    target = parts if parts.netloc else default
    if (not token_file or target.scheme != "hdfs" or target.port is None or not target.hostname
            or core.get("hadoop.security.token.service.use_ip", "true").strip().lower() == "false"):
        return url
    try:
        ipaddress.ip_address(target.hostname)
        return url
    except ValueError:
        pass
    try:
        address = resolve(target.hostname)
    except OSError:
        return url  # hdfs-native reports the name it cannot reach
    return f"hdfs://{address}:{target.port}"


#: what a user does about an HDFS that asks for Kerberos when this process has no credentials
KERBEROS_FIX = ("this process has no Kerberos credentials for HDFS: run kinit (or point KRB5_CLIENT_KTNAME at a "
                "keytab) where the driver runs; on YARN give spark-submit --principal and --keytab (or kinit "
                "before it) so that Spark puts HDFS delegation tokens in every container "
                "(HADOOP_TOKEN_FILE_LOCATION), which the TF processes inherit")


def _hadoop_error(e: BaseException, base: str) -> BaseException:
    """An hdfs-native error as the user should see it: missing Kerberos credentials name the fix."""
    text = str(e)
    if "GSS_S_NO_CRED" in text or "NoSASLMechanism" in text:
        return HadoopConfigError(f"{base}: {KERBEROS_FIX}. hdfs-native said: {text[:500]}")
    return e


class _Client:
    """An ``hdfs_native.Client`` whose calls raise :func:`_hadoop_error`'s errors. ``list_status``
    returns a list: hdfs-native's iterator makes its first RPC on the first ``next()``."""

    def __init__(self, client, base: str):
        self._client, self._base = client, base

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                result = attr(*args, **kwargs)
                return list(result) if name == "list_status" else result
            except RuntimeError as e:
                raise _hadoop_error(e, self._base) from e
        return call


class HdfsNativeHandler(pafs.FileSystemHandler):
    """``pyarrow.fs.FileSystemHandler`` over an ``hdfs_native.Client`` (paths are absolute HDFS paths)."""

    def __init__(self, base: str):
        import hdfs_native

        from tfos.data.hadoop_conf import hadoop_core_site

        self.base = base
        tokens = os.environ.get("HADOOP_TOKEN_FILE_LOCATION")  # only then does the address matter
        url = client_url(base, hadoop_core_site() if tokens else {}, tokens)
        try:  # no authority (hdfs:///path): fs.defaultFS of the configuration
            self.client = _Client(hdfs_native.Client(url), base)
        except Exception as e:  # no fs.defaultFS for hdfs:///, an unknown nameservice, ...
            raise HadoopConfigError(f"cannot connect to {base}: {e}. Set HADOOP_CONF_DIR to the cluster's "
                                    "configuration (core-site.xml with fs.defaultFS, hdfs-site.xml)") from e

    def __eq__(self, other):
        return isinstance(other, HdfsNativeHandler) and other.base == self.base

    def __ne__(self, other):
        return not self == other

    def get_type_name(self) -> str:
        return "hdfs"

    def normalize_path(self, path: str) -> str:
        return path

    # -- metadata
    def _info(self, path: str, status):
        kind = pafs.FileType.Directory if status.isdir else pafs.FileType.File
        return pafs.FileInfo(path, kind, size=None if status.isdir else status.length,
                             mtime_ns=int(status.modification_time) * 1_000_000)

    def get_file_info(self, paths):
        out = []
        for p in paths:
            try:
                out.append(self._info(p, self.client.get_file_info(p)))
            except FileNotFoundError:
                out.append(pafs.FileInfo(p, pafs.FileType.NotFound))
        return out

    def get_file_info_selector(self, selector):
        base = selector.base_dir.rstrip("/") or "/"
        try:
            statuses = list(self.client.list_status(base, recursive=selector.recursive))
        except FileNotFoundError:
            if selector.allow_not_found:
                return []
            raise
        return [self._info(_full(base, s.path), s) for s in statuses]

    # -- changes
    def create_dir(self, path: str, recursive: bool) -> None:
        self.client.mkdirs(path, create_parent=recursive)

    def delete_dir(self, path: str) -> None:
        self.client.delete(path, recursive=True)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        try:
            children = list(self.client.list_status(path))
        except FileNotFoundError:
            if missing_dir_ok:
                return
            raise
        for s in children:
            self.client.delete(_full(path, s.path), recursive=True)

    def delete_root_dir_contents(self) -> None:
        self.delete_dir_contents("/")

    def delete_file(self, path: str) -> None:
        if not self.client.delete(path):
            raise FileNotFoundError(path)

    def move(self, src: str, dest: str) -> None:
        self.client.rename(src, dest, overwrite=True)

    def copy_file(self, src: str, dest: str) -> None:
        with SequentialReader(self.client.read(src)) as r, self._create(dest) as w:
            shutil.copyfileobj(r, w, 8 << 20)

    # -- streams
    def open_input_stream(self, path: str):
        return pa.PythonFile(SequentialReader(self.client.read(path)), mode="r")

    def open_input_file(self, path: str):  # random access (Parquet's footer first): the seekable reader
        return pa.PythonFile(self.client.read(path), mode="r")

    def _create(self, path: str):
        from hdfs_native import WriteOptions

        return self.client.create(path, WriteOptions(overwrite=True, create_parent=True))

    def open_output_stream(self, path: str, metadata=None):
        return pa.PythonFile(_BytesWriter(self._create(path)), mode="w")

    def open_append_stream(self, path: str, metadata=None):
        return pa.PythonFile(_BytesWriter(self.client.append(path)), mode="w")


class SequentialReader:
    """An hdfs-native file read front to back through its range stream: the DataNode's next packets
    (64 KB pieces) are in flight while the caller handles the last ones, about twice the speed of
    ``read(n)`` calls on this machine's test cluster (bench/hdfs_io.py). ``read(n)`` joins pieces
    (one copy); memory holds one piece beyond what was asked."""

    def __init__(self, reader):
        self._reader = reader
        self._pieces = iter(reader.read_range_stream(0, len(reader)))
        self._head = memoryview(b"")
        self._pos = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        parts, got = [], 0
        while size is None or size < 0 or got < size:
            if not len(self._head):
                piece = next(self._pieces, None)
                if piece is None:
                    break
                self._head = memoryview(piece)
            k = len(self._head) if size is None or size < 0 else min(size - got, len(self._head))
            parts.append(self._head[:k])
            self._head = self._head[k:]
            got += k
        self._pos += got
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self.closed = True
        self._pieces = iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _BytesWriter:
    """An hdfs-native writer fed ``bytes``: pyarrow hands ``write`` buffer objects, which the binding
    takes ~15x slower than bytes (measured: 6.5 against 109 MB/s); one copy per block is cheaper."""

    def __init__(self, writer):
        self._w = writer

    def write(self, data) -> int:
        return self._w.write(data if isinstance(data, bytes) else bytes(data))

    def __getattr__(self, name):
        return getattr(self._w, name)


def _full(base: str, path: str) -> str:
    """hdfs-native lists children by absolute path or by name (depending on the call): absolute."""
    return path if path.startswith("/") else f"{base.rstrip('/')}/{path}"
