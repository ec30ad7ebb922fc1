"""Input helpers for InputMode.TENSORFLOW: every TF process reads its own share of the files.

Inside ``main_fun(args, ctx)``::

    from tfos import data

    files = data.rank_files(ctx, "hdfs://nn:8020/data/train", pattern="*.parquet")
    ds = data.parquet_dataset(files, columns=["features", "label"], batch_size=64)

What is here:

* **Listing** -- :func:`list_files` / :func:`list_files_with_sizes` list a directory given as
  ``hdfs://``, ``viewfs://``, ``file://``, other pyarrow URIs (``s3://``, ``gs://``) or a plain
  local path, through pyarrow's filesystem layer. Hidden entries (``_SUCCESS``, ``_temporary/``,
  ``.crc`` files: names starting with ``_`` or ``.``) are skipped. TensorFlow 2.21 itself has no
  ``hdfs://`` filesystem any more, which is why listing and reading go through pyarrow.
* **Sharding** -- :func:`shard` (round robin) and :func:`shard_by_size` (greedy by bytes) give
  each global rank a disjoint, balanced subset; :func:`rank_files` lists and shards in one call.
* **Readers** -- :func:`tfrecord_dataset`, :func:`parquet_dataset`, :func:`csv_dataset` return
  ``tf.data.Dataset`` objects. TensorFlow is imported only inside these functions: importing
  ``tfos.data`` does not import TensorFlow (Spark executors and the driver stay light).
* **Spark DataFrame <-> TFRecord** -- :func:`save_as_tfrecords` writes ``tf.train.Example``
  records (encoded in pure Python, no TensorFlow on the executors) and :func:`load_tfrecords`
  reads them back; :func:`encode_example` / :func:`decode_example` are the codec they use.

Why every dataset here has ``AutoShardPolicy.OFF``: the files are already split per rank.
Under a ``tf.distribute`` strategy, tf.data's default (AUTO) sharding would shard each worker's
dataset *again*; for generator-based datasets it falls back to sharding by element, so every
worker silently keeps only every N-th element of its own data and (N-1)/N of the data is lost
without a warning. The readers therefore set ``options.experimental_distribute.auto_shard_policy
= AutoShardPolicy.OFF``; keep it if you rebuild or wrap these datasets.

Keep the shards balanced: in synchronous training (MultiWorkerMirroredStrategy) a worker that
runs out of data first blocks the others when a fixed ``steps_per_epoch`` asks for more batches
than its shard has; iterate the distributed dataset to exhaustion, or size ``steps_per_epoch`` by
the smallest shard.
"""

from __future__ import annotations

import fnmatch
import functools
import gzip
import heapq
import importlib.util
import io
import logging
import os
import posixpath
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import quote, unquote, urlsplit

import numpy as np

from tfos.errors import ConfigError, FeedError, HadoopConfigError, TFOSError

logger = logging.getLogger(__name__)

__all__ = [
    "list_files", "list_files_with_sizes", "shard", "shard_by_size", "rank_files",
    "tfrecord_dataset", "parquet_dataset", "csv_dataset",
    "encode_example", "decode_example", "tfrecord_frame", "iter_tfrecords",
    "save_as_tfrecords", "load_tfrecords",
]

_HADOOP_SCHEMES = ("hdfs", "viewfs")
_URI_SAFE = "/:@!$&'()*+,;=-._~"


def _is_hidden(name: str) -> bool:
    return name.startswith(("_", "."))


# --------------------------------------------------------------------------- filesystems

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
        "pyarrow reaches HDFS through libhdfs, which runs Hadoop's Java client in a JVM. Set these, before the "
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


def _connect_hadoop(uri: str):
    _ensure_hadoop_classpath()
    if not _libhdfs_loadable():
        raise HadoopConfigError(_hadoop_help(uri, "pyarrow could not load the JVM and libhdfs"))
    try:
        fs, _ = _from_uri(uri)
    except OSError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise HadoopConfigError(_hadoop_help(uri, f"pyarrow: {first}")) from e
    return fs


# --------------------------------------------------------------------------- listing

def _list(uri, pattern: str, recursive: bool) -> list[tuple[str, int]]:
    from pyarrow import fs as pafs

    fs, path, prefix = _resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(f"{uri} does not exist. Check the path; inside main_fun, resolve relative paths "
                          "with ctx.absolute_path(path) (they are relative to the cluster's default filesystem).")
    if info.type == pafs.FileType.File:
        return [(_to_uri(prefix, path), int(info.size or 0))]
    found = []
    todo = [path]
    while todo:
        directory = todo.pop()
        for entry in fs.get_file_info(pafs.FileSelector(directory, recursive=False)):
            if _is_hidden(entry.base_name):
                continue
            if entry.type == pafs.FileType.Directory:
                if recursive:
                    todo.append(entry.path)
            elif entry.type == pafs.FileType.File and fnmatch.fnmatchcase(entry.base_name, pattern):
                found.append((_to_uri(prefix, entry.path), int(entry.size or 0)))
    found.sort()
    return found


def list_files(uri, pattern: str = "*", recursive: bool = False) -> list[str]:
    """Sorted files under ``uri`` whose base name matches the glob ``pattern``.

    ``uri`` is ``hdfs://host:port/dir``, ``viewfs://cluster/dir``, ``file:///dir``, another URI
    pyarrow knows (``s3://``, ``gs://``) or a plain local path. Results are full URIs in the same
    form (plain absolute paths for a plain path). Names starting with ``_`` or ``.`` (``_SUCCESS``,
    ``_temporary/``, ``.part.crc``) are skipped, and so are hidden directories when ``recursive``.
    A ``uri`` naming a file returns just that file. An empty directory returns ``[]``.

    Raises :class:`~tfos.errors.ConfigError` if ``uri`` does not exist, and
    :class:`~tfos.errors.HadoopConfigError` (a ConfigError) for hdfs:// / viewfs:// when this
    process has no Hadoop client; its message lists the environment variables to set.
    """
    return [u for u, _ in _list(uri, pattern, recursive)]


def list_files_with_sizes(uri, pattern: str = "*", recursive: bool = False) -> list[tuple[str, int]]:
    """Like :func:`list_files`, as ``(uri, size_in_bytes)`` pairs (input for :func:`shard_by_size`)."""
    return _list(uri, pattern, recursive)


# --------------------------------------------------------------------------- sharding

def _check_rank(rank, num_workers) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
        raise ConfigError(f"num_workers must be a positive int, got {num_workers!r}")
    if rank is None:
        raise ConfigError("rank is None: this node does not train (ps or evaluator), so it has no file shard. "
                          "Read data only on chief/worker nodes (ctx.rank is not None).")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_workers:
        raise ConfigError(f"rank must be an int in [0, {num_workers}), got {rank!r}")


def _check_enough(n: int, num_workers: int, allow_empty: bool) -> None:
    if allow_empty or n >= num_workers:
        return
    if n == 0:
        raise ConfigError("no input files to shard. Check the directory and pattern given to list_files "
                          "(hidden names starting with '_' or '.' are skipped).")
    idle = f"rank {n}" if n == num_workers - 1 else f"ranks {n}..{num_workers - 1}"
    raise ConfigError(
        f"only {n} file(s) for {num_workers} workers: {idle} would get no data. In synchronous training "
        "(MultiWorkerMirroredStrategy) a worker without data stops stepping and the others wait in "
        "all-reduce until the collective times out. Write the data as at least "
        f"{num_workers} files (e.g. df.repartition({num_workers}) before writing; a multiple of "
        f"{num_workers} balances best), run fewer workers, or pass allow_empty=True if your training "
        "loop copes with empty shards.")


def _unique_sorted(names: list) -> list:
    out = sorted(names)
    for a, b in zip(out, out[1:]):
        if a == b:
            raise ConfigError(f"{a!r} is listed twice; each file must appear once so that the shards are disjoint")
    return out


def shard(files, rank: int, num_workers: int, allow_empty: bool = False) -> list:
    """The files of global ``rank`` among ``num_workers``: round robin over the sorted list.

    Pure and deterministic: every rank computes the same assignment from the same listing (the
    list is sorted first, so listing order does not matter). The shards are disjoint, cover all
    files, and their sizes differ by at most one file.

    Raises :class:`~tfos.errors.ConfigError` when there are fewer files than workers (a rank
    would get nothing and synchronous training would stall) unless ``allow_empty=True``; the
    message says how to fix it (repartition the data into more files, or use fewer workers).
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    _check_rank(rank, num_workers)
    files = _unique_sorted([os.fspath(f) if isinstance(f, os.PathLike) else f for f in files])
    _check_enough(len(files), num_workers, allow_empty)
    return files[rank::num_workers]


def shard_by_size(files_with_sizes, rank: int, num_workers: int, allow_empty: bool = False) -> list:
    """The files of global ``rank``, balancing total bytes across ranks.

    ``files_with_sizes`` is a mapping or an iterable of ``(file, size)`` pairs (see
    :func:`list_files_with_sizes`). Greedy longest-processing-time assignment: files in
    decreasing size go to the rank with the fewest bytes so far (ties: fewer files, then lower
    rank). Pure and deterministic; the shards are disjoint and cover all files, and the byte
    totals of any two ranks differ by at most the largest file. Returns the rank's files sorted.

    Raises :class:`~tfos.errors.ConfigError` for fewer files than workers (unless
    ``allow_empty=True``), negative sizes or duplicate names.
    """
    pairs = list(files_with_sizes.items() if isinstance(files_with_sizes, Mapping) else files_with_sizes)
    items = []
    for pair in pairs:
        try:
            name, size = pair
        except (TypeError, ValueError):
            raise ConfigError(f"shard_by_size expects (file, size) pairs, got {pair!r}") from None
        if isinstance(size, bool) or not isinstance(size, (int, float, np.integer, np.floating)) or size < 0:
            raise ConfigError(f"size of {name!r} must be a non-negative number, got {size!r}")
        items.append((name, size))
    _unique_sorted([n for n, _ in items])
    _check_rank(rank, num_workers)
    _check_enough(len(items), num_workers, allow_empty)
    heap = [(0, 0, r) for r in range(num_workers)]  # (bytes, files, rank)
    mine = []
    for name, size in sorted(items, key=lambda t: (-t[1], t[0])):
        load, count, r = heapq.heappop(heap)
        if r == rank:
            mine.append(name)
        heapq.heappush(heap, (load + size, count + 1, r))
    return sorted(mine)


def rank_files(ctx, uri, pattern: str = "*", recursive: bool = False, by_size: bool = False,
               allow_empty: bool = False) -> list[str]:
    """List ``uri`` and return this node's shard: ``shard(list_files(...), ctx.rank, ctx.num_workers)``.

    ``uri`` is resolved with ``ctx.absolute_path`` (relative paths go on the cluster's default
    filesystem). ``by_size=True`` balances bytes instead of file counts (:func:`shard_by_size`).
    Call it on chief/worker nodes only: ps and evaluator nodes have no rank (ConfigError).
    """
    if getattr(ctx, "rank", None) is None:
        _check_rank(None, 1)
    full = ctx.absolute_path(uri) if hasattr(ctx, "absolute_path") else uri
    if by_size:
        listed = list_files_with_sizes(full, pattern, recursive)
        mine = shard_by_size(listed, ctx.rank, ctx.num_workers, allow_empty)
        total = len(listed)
    else:
        listed = list_files(full, pattern, recursive)
        mine = shard(listed, ctx.rank, ctx.num_workers, allow_empty)
        total = len(listed)
    logger.info("rank %d/%d reads %d of %d files under %s", ctx.rank, ctx.num_workers, len(mine), total, full)
    return mine


# --------------------------------------------------------------------------- tf.train.Example codec
#
# tf.train.Example is a small protobuf; it is written and parsed here by hand so that Spark
# executors need neither TensorFlow nor generated protobuf classes:
#   Example   { Features features = 1; }
#   Features  { map<string, Feature> feature = 1; }   map entry: { string key = 1; Feature value = 2; }
#   Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
#   BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
#   Int64List { repeated int64 value = 1 [packed]; }

KINDS = ("bytes", "float", "int64")
_KIND_FIELD = {"bytes": 1, "float": 2, "int64": 3}
_FIELD_KIND = {v: k for k, v in _KIND_FIELD.items()}
_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise FeedError("malformed tf.train.Example: truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


def _as_values(value) -> list | np.ndarray:
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return [value]
    if isinstance(value, np.ndarray):
        return value.reshape(-1)
    if hasattr(value, "toArray"):  # pyspark.ml / mllib vectors
        return np.asarray(value.toArray()).reshape(-1)
    if isinstance(value, (bool, int, float, np.generic)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ConfigError(f"cannot store a {type(value).__name__} in a tf.train.Example feature") from None


def _infer_kind(name: str, values) -> str:
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.dtype.kind in "biu":
            return "int64"
        if values.dtype.kind == "f":
            return "float"
        if values.dtype.kind in "SU":
            return "bytes"
    if len(values) == 0:
        raise ConfigError(f"feature {name!r} is empty, so its type cannot be inferred; pass "
                          f"kinds={{{name!r}: 'int64' | 'float' | 'bytes'}}")
    kinds = set()
    for v in values:
        if isinstance(v, (bool, int, np.integer, np.bool_)):
            kinds.add("int64")
        elif isinstance(v, (float, np.floating)):
            kinds.add("float")
        elif isinstance(v, (str, bytes, bytearray, memoryview, np.str_, np.bytes_)):
            kinds.add("bytes")
        else:
            raise ConfigError(f"feature {name!r} holds a {type(v).__name__}; features hold ints, floats, "
                              "str or bytes (or lists/arrays of one of them)")
    if kinds == {"int64", "float"}:
        return "float"
    if len(kinds) > 1:
        raise ConfigError(f"feature {name!r} mixes {sorted(kinds)}; a feature holds values of one kind")
    return kinds.pop()


def _encode_feature(name: str, kind: str, values) -> bytes:
    if kind == "float":
        try:
            payload = np.asarray(values, dtype="<f4").reshape(-1).tobytes()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"feature {name!r}: values are not floats ({e})") from None
        body = _ld(1, payload) if payload else b""
    elif kind == "int64":
        parts = []
        for v in (values.tolist() if isinstance(values, np.ndarray) else values):
            if isinstance(v, float):
                if not v.is_integer():
                    raise ConfigError(f"feature {name!r} is int64 but holds {v!r}; store it as 'float'")
                v = int(v)
            elif not isinstance(v, int):
                if v is None:
                    raise ConfigError(f"feature {name!r} holds a None inside a list; drop or fill nulls first")
                try:
                    v = int(v)
                except (TypeError, ValueError):
                    raise ConfigError(f"feature {name!r} is int64 but holds {v!r}") from None
            if not -(1 << 63) <= v < (1 << 63):
                raise ConfigError(f"feature {name!r}: {v} does not fit in int64")
            parts.append(_varint(v & _U64))
        payload = b"".join(parts)
        body = _ld(1, payload) if payload else b""
    elif kind == "bytes":
        chunks = []
        for v in (values.tolist() if isinstance(values, np.ndarray) else values):
            if isinstance(v, str):
                v = v.encode("utf-8")
            elif isinstance(v, (bytearray, memoryview)):
                v = bytes(v)
            elif not isinstance(v, bytes):
                raise ConfigError(f"feature {name!r} is bytes but holds {v!r}")
            chunks.append(_ld(1, v))
        body = b"".join(chunks)
    else:
        raise ConfigError(f"feature {name!r}: unknown kind {kind!r}; use one of {KINDS}")
    return _ld(_KIND_FIELD[kind], body)


def _serialize_example(items) -> bytes:
    """``items``: iterable of ``(name, kind, values)``."""
    entries = []
    for name, kind, values in items:
        key = name.encode("utf-8")
        entries.append(_ld(1, _ld(1, key) + _ld(2, _encode_feature(name, kind, values))))
    return _ld(1, b"".join(entries))


def encode_example(features: Mapping, kinds: Mapping | None = None) -> bytes:
    """Serialize ``{name: value}`` as a ``tf.train.Example`` (bytes), without TensorFlow.

    Values are ints/bools (int64_list), floats (float_list, stored as float32), str/bytes
    (bytes_list; str is UTF-8 encoded), or lists, numpy arrays (flattened) and Spark ML vectors
    of one of these. ``None`` leaves the feature out. ``kinds`` maps names to ``'int64'``,
    ``'float'`` or ``'bytes'`` to force a kind (needed for empty lists). The result parses with
    ``tf.train.Example.FromString`` and ``tf.io.parse_single_example``.
    """
    kinds = kinds or {}
    items = []
    for name, value in features.items():
        if value is None:
            continue
        values = _as_values(value)
        kind = kinds.get(name) or _infer_kind(name, values)
        items.append((str(name), kind, values))
    return _serialize_example(items)


def _fields(buf, pos: int, end: int):
    """Yield ``(field_number, wire_type, value)`` of a protobuf message; for wire type 2 the value
    is a ``(start, end)`` span, for 0 an int, for 1/5 the raw bytes."""
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos, end)
        elif wire == 2:
            n, pos = _read_varint(buf, pos, end)
            if pos + n > end:
                raise FeedError("malformed tf.train.Example: a field runs past the end of its message")
            value, pos = (pos, pos + n), pos + n
        elif wire == 5:
            value, pos = bytes(buf[pos:pos + 4]), pos + 4
        elif wire == 1:
            value, pos = bytes(buf[pos:pos + 8]), pos + 8
        else:
            raise FeedError(f"malformed tf.train.Example: unsupported wire type {wire}")
        if pos > end:
            raise FeedError("malformed tf.train.Example: truncated field")
        yield field, wire, value


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


def _decode_list(buf, kind: str, start: int, end: int) -> list:
    out: list = []
    for field, wire, value in _fields(buf, start, end):
        if field != 1:
            continue
        if kind == "bytes" and wire == 2:
            out.append(bytes(buf[value[0]:value[1]]))
        elif kind == "float" and wire == 2:
            if (value[1] - value[0]) % 4:
                raise FeedError("malformed tf.train.Example: a packed float list is not a multiple of 4 bytes")
            out.extend(np.frombuffer(bytes(buf[value[0]:value[1]]), dtype="<f4").tolist())
        elif kind == "float" and wire == 5:
            out.append(struct.unpack("<f", value)[0])
        elif kind == "int64" and wire == 2:
            pos, stop = value
            while pos < stop:
                v, pos = _read_varint(buf, pos, stop)
                out.append(_signed(v))
        elif kind == "int64" and wire == 0:
            out.append(_signed(value))
    return out


def _decode_typed(data) -> dict:
    buf = memoryview(data)
    result: dict = {}
    for field, wire, span in _fields(buf, 0, len(buf)):
        if field != 1 or wire != 2:
            continue
        for efield, ewire, espan in _fields(buf, *span):
            if efield != 1 or ewire != 2:
                continue
            key, feature = "", None
            for mfield, mwire, mspan in _fields(buf, *espan):
                if mfield == 1 and mwire == 2:
                    key = bytes(buf[mspan[0]:mspan[1]]).decode("utf-8")
                elif mfield == 2 and mwire == 2:
                    feature = mspan
            kind, values = None, []
            if feature is not None:
                for ffield, fwire, fspan in _fields(buf, *feature):
                    if ffield in _FIELD_KIND and fwire == 2:
                        kind = _FIELD_KIND[ffield]
                        values = _decode_list(buf, kind, *fspan)
            result[key] = (kind, values)
    return result


def decode_example(data) -> dict:
    """Parse a serialized ``tf.train.Example`` into ``{name: list of values}``, without TensorFlow.

    int64 features give Python ints, float features Python floats (float32 precision), bytes
    features ``bytes`` (decode str yourself). Raises :class:`~tfos.errors.FeedError` for bytes that
    are not a tf.train.Example (check the files really hold tf.train.Example records).
    """
    return {k: v for k, (_, v) in _decode_typed(data).items()}


# --------------------------------------------------------------------------- TFRecord framing

def _crc_table() -> list:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def _crc32c_python(data) -> int:
    c = 0xFFFFFFFF
    t = _CRC_TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


@functools.lru_cache(maxsize=1)
def _fast_crc32c():
    """A C implementation of CRC-32C if one is installed (google-crc32c or crc32c), else None."""
    try:
        import google_crc32c

        if getattr(google_crc32c, "implementation", "c") == "c":
            return lambda data: google_crc32c.value(bytes(data))
    except ImportError:
        pass
    try:
        import crc32c

        return lambda data: crc32c.crc32c(bytes(data))
    except ImportError:
        return None


def _crc32c(data) -> int:
    fast = _fast_crc32c()
    return fast(data) if fast is not None else _crc32c_python(data)


def _masked_crc(data) -> int:
    c = _crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(record: bytes) -> bytes:
    """One record in TFRecord framing: length, masked CRC-32C of the length, data, masked CRC of data."""
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", _masked_crc(header)) + record + struct.pack("<I", _masked_crc(record))


def _read_exact(stream, n: int, what: str) -> bytes:
    parts = []
    left = n
    while left:
        chunk = stream.read(left)
        if not chunk:
            break
        parts.append(bytes(chunk))
        left -= len(chunk)
    data = b"".join(parts)
    if len(data) != n and (data or what != "header"):
        raise FeedError(f"truncated TFRecord {what}: expected {n} bytes, got {len(data)}; the file is "
                        "incomplete or not a TFRecord file (wrong compression_type?)")
    return data


def iter_tfrecords(stream, verify_checksums="auto", source: str = "") -> Iterator[bytes]:
    """Yield the records of an (uncompressed) TFRecord byte stream (anything with ``read(n)``).

    The length checksum is always checked. Data checksums are checked when ``verify_checksums``
    is True, or when it is ``'auto'`` and a C CRC-32C is installed (``pip install google-crc32c``);
    pure-Python checking runs at a few MB/s. Raises :class:`~tfos.errors.FeedError` on corruption.
    """
    verify = _fast_crc32c() is not None if verify_checksums == "auto" else bool(verify_checksums)
    where = f" in {source}" if source else ""
    while True:
        header = _read_exact(stream, 12, "header")
        if not header:
            return
        length_bytes = header[:8]
        (length,) = struct.unpack("<Q", length_bytes)
        (length_crc,) = struct.unpack("<I", header[8:])
        if length_crc != _masked_crc(length_bytes):
            raise FeedError(f"corrupt TFRecord length checksum{where}: the file is damaged, compressed "
                            "(pass compression_type='GZIP' or 'ZLIB'), or not a TFRecord file")
        body = _read_exact(stream, length + 4, "record")
        record = body[:length]
        if verify and struct.unpack("<I", body[length:])[0] != _masked_crc(record):
            raise FeedError(f"corrupt TFRecord data checksum{where}: the file is damaged")
        yield record


class _ZlibReader:
    """``read(n)`` over a zlib-compressed stream (TFRecord compression_type 'ZLIB')."""

    def __init__(self, raw, wbits: int = zlib.MAX_WBITS):
        self._raw = raw
        self._z = zlib.decompressobj(wbits)
        self._buf = b""
        self._eof = False

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and not self._eof:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                self._buf += self._z.flush()
                self._eof = True
            else:
                self._buf += self._z.decompress(bytes(chunk))
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _norm_compression(compression) -> str:
    c = (compression or "").upper()
    if c in ("", "NONE"):
        return ""
    if c in ("GZIP", "GZ"):
        return "GZIP"
    if c == "ZLIB":
        return "ZLIB"
    raise ConfigError(f"compression_type must be None, 'GZIP' or 'ZLIB' (or 'auto' when reading), got {compression!r}")


def _compression_of(name: str) -> str:
    lower = name.lower()
    if lower.endswith((".gz", ".gzip")):
        return "GZIP"
    if lower.endswith((".zlib", ".zz")):
        return "ZLIB"
    return ""


def _decompressing(raw, compression: str):
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "ZLIB":
        return _ZlibReader(raw)
    return raw


def _iter_file_records(uri: str, compression: str, verify) -> Iterator[bytes]:
    fs, path, _ = _resolve(uri)
    comp = _compression_of(path) if compression == "auto" else compression
    with fs.open_input_stream(path, compression=None, buffer_size=1 << 20) as raw:
        yield from iter_tfrecords(_decompressing(raw, comp), verify, source=uri)


def _write_records_python(out, records: Iterable[bytes], compression: str) -> int:
    """Frame ``records`` into the binary stream ``out`` (compressing if asked); returns the count."""
    z = None
    if compression == "GZIP":
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    elif compression == "ZLIB":
        z = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    buf = bytearray()
    count = 0

    def flush():
        data = bytes(buf)
        buf.clear()
        if z is not None:
            data = z.compress(data)
        if data:
            out.write(data)

    for record in records:
        buf += tfrecord_frame(record)
        count += 1
        if len(buf) >= 1 << 20:
            flush()
    flush()
    if z is not None:
        out.write(z.flush())
    return count


def _write_records_tensorflow(local_path: str, records: Iterable[bytes], compression: str) -> int:
    import tensorflow as tf

    count = 0
    with tf.io.TFRecordWriter(local_path, tf.io.TFRecordOptions(compression_type=compression)) as w:
        for record in records:
            w.write(record)
            count += 1
    return count


def _choose_engine(engine: str) -> str:
    if engine not in ("auto", "python", "tensorflow"):
        raise ConfigError(f"engine must be 'auto', 'python' or 'tensorflow', got {engine!r}")
    if engine != "auto":
        return engine
    if _fast_crc32c() is not None or importlib.util.find_spec("tensorflow") is None:
        return "python"
    return "tensorflow"  # TF's C++ writer: much faster checksums than pure Python


_warned_slow_crc = False


def _write_tfrecord_file(fs, path: str, records: Iterable[bytes], compression: str, engine: str) -> int:
    """Write a TFRecord file at ``path`` on pyarrow filesystem ``fs``; returns the record count."""
    from pyarrow import fs as pafs

    global _warned_slow_crc
    engine = _choose_engine(engine)
    if engine == "python":
        if _fast_crc32c() is None and not _warned_slow_crc:
            _warned_slow_crc = True
            logger.warning("writing TFRecords with pure-Python CRC-32C (a few MB/s); pip install google-crc32c "
                           "on the executors to speed this up")
        with fs.open_output_stream(path, compression=None) as out:
            return _write_records_python(out, records, compression)
    if isinstance(fs, pafs.LocalFileSystem):
        return _write_records_tensorflow(path, records, compression)
    fd, local = tempfile.mkstemp(prefix="tfos-", suffix=".tfrecord")
    os.close(fd)
    try:
        count = _write_records_tensorflow(local, records, compression)
        pafs.copy_files(local, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    finally:
        os.remove(local)
    return count


# --------------------------------------------------------------------------- tf.data readers

def _file_list(files) -> list[str]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out = []
    for f in files:
        f = os.fspath(f) if isinstance(f, os.PathLike) else f
        if not isinstance(f, str):
            raise ConfigError(f"files must be paths or URIs (str), got {f!r}")
        out.append(f)
    return out


def _no_autoshard(ds):
    """Files are already sharded per rank: stop tf.distribute from sharding each worker's data again."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def tfrecord_dataset(files, compression_type="auto", features=None, reader: str = "auto",
                     buffer_size: int | None = None, num_parallel_reads: int | None = None,
                     verify_checksums="auto"):
    """A ``tf.data.Dataset`` of the serialized records in ``files`` (a list of paths/URIs).

    ``compression_type``: ``'auto'`` (from the extension: ``.gz`` -> GZIP, ``.zlib`` -> ZLIB),
    ``None``/``''``, ``'GZIP'`` or ``'ZLIB'``. ``features``: a dict of ``tf.io`` feature specs
    (e.g. ``{"x": tf.io.FixedLenFeature([784], tf.float32)}``); when given, each element is the
    parsed dict instead of the serialized bytes.

    ``reader``: ``'tensorflow'`` uses ``tf.data.TFRecordDataset`` (local and file:// paths, gs://);
    ``'arrow'`` reads through pyarrow (any filesystem pyarrow knows, including hdfs://, which TF
    2.21 cannot open); ``'auto'`` picks tensorflow when every file is local, else arrow.
    ``buffer_size`` / ``num_parallel_reads`` go to TFRecordDataset; ``verify_checksums`` to the
    arrow reader (see :func:`iter_tfrecords`). The dataset has AutoShardPolicy.OFF.
    """
    import tensorflow as tf

    files = _file_list(files)
    if reader not in ("auto", "tensorflow", "arrow"):
        raise ConfigError(f"reader must be 'auto', 'tensorflow' or 'arrow', got {reader!r}")
    if compression_type == "auto":
        comps = {_compression_of(f) for f in files}
        if len(comps) > 1:
            raise ConfigError(f"files mix compressions {sorted(comps)}; read them as separate datasets "
                              "or pass compression_type explicitly")
        compression = comps.pop() if comps else ""
    else:
        compression = _norm_compression(compression_type)
    local = [_local_path(f) for f in files]
    if reader == "auto":
        reader = "tensorflow" if all(p is not None for p in local) else "arrow"
    if reader == "tensorflow":
        names = [p if p is not None else f for p, f in zip(local, files)]
        ds = tf.data.TFRecordDataset(tf.constant(names, dtype=tf.string), compression_type=compression,
                                     buffer_size=buffer_size, num_parallel_reads=num_parallel_reads)
    else:
        def records():
            chunk = []
            for f in files:
                for record in _iter_file_records(f, compression, verify_checksums):
                    chunk.append(record)
                    if len(chunk) == 256:
                        yield np.array(chunk, dtype=object)
                        chunk = []
            if chunk:
                yield np.array(chunk, dtype=object)

        ds = tf.data.Dataset.from_generator(
            records, output_signature=tf.TensorSpec(shape=(None,), dtype=tf.string)).unbatch()
    if features is not None:
        ds = ds.map(lambda r: tf.io.parse_single_example(r, features), num_parallel_calls=tf.data.AUTOTUNE)
    return _no_autoshard(ds)


def _column_to_numpy(arr, name: str) -> np.ndarray:
    """An Arrow array -> numpy of shape (rows, ...); strings/binaries become object arrays of bytes."""
    import pyarrow as pa

    t = arr.type
    if arr.null_count:
        raise FeedError(f"column {name!r} has {arr.null_count} null value(s); tensors cannot hold nulls. "
                        "Fill or drop them before writing (df.fillna / df.dropna), or leave the column out.")
    if pa.types.is_dictionary(t):
        return _column_to_numpy(arr.dictionary_decode(), name)
    if pa.types.is_fixed_size_list(t):
        inner = _column_to_numpy(arr.flatten(), name)
        return inner.reshape((len(arr), t.list_size) + inner.shape[1:])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.diff(np.asarray(arr.offsets))
        if len(lengths) and not np.all(lengths == lengths[0]):
            raise FeedError(f"column {name!r} holds lists of different lengths ({int(lengths.min())}.."
                            f"{int(lengths.max())}); a batch of them is not a tensor. Pad or cut them to one "
                            "length before writing, or store them as TFRecords and parse with "
                            "tf.io.VarLenFeature / RaggedFeature.")
        inner = _column_to_numpy(arr.flatten(), name)
        width = int(lengths[0]) if len(lengths) else 0
        return inner.reshape((len(arr), width) + inner.shape[1:])
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.cast(pa.large_binary() if pa.types.is_large_string(t) else pa.binary()).to_numpy(
            zero_copy_only=False)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return arr.to_numpy(zero_copy_only=False)
    raise ConfigError(f"column {name!r} has Arrow type {t}, which has no tensor equivalent here. Cast it before "
                      "writing (timestamps/dates to long, decimals to double, Spark ML vectors to arrays with "
                      "pyspark.ml.functions.vector_to_array, structs to separate columns) or select other "
                      "columns with columns=[...].")


def _batch_to_numpy(batch, source: str) -> dict:
    try:
        return {name: _column_to_numpy(batch.column(i), name) for i, name in enumerate(batch.schema.names)}
    except TFOSError as e:
        raise type(e)(f"{e} (in {source})") from None


def _rows(cols: dict) -> int:
    return len(next(iter(cols.values()))) if cols else 0


def _signature_of(cols: dict, batch_size: int, drop_remainder: bool) -> dict:
    import tensorflow as tf

    sig = {}
    for name, arr in cols.items():
        dtype = tf.string if arr.dtype == object or arr.dtype.kind in "SU" else tf.as_dtype(arr.dtype)
        sig[name] = tf.TensorSpec(shape=(batch_size if drop_remainder else None,) + arr.shape[1:], dtype=dtype,
                                  name=None)
    return sig


def _conform(cols: dict, sig: dict, source: str) -> dict:
    out = {}
    for name, spec in sig.items():
        if name not in cols:
            raise FeedError(f"column {name!r} is missing in {source}; all files must have the same columns")
        arr = cols[name]
        want = tuple(spec.shape[1:])
        if tuple(arr.shape[1:]) != want:
            raise FeedError(f"column {name!r} has shape {tuple(arr.shape[1:])} per row in {source} but {want} in "
                            "the first batch; make the lists one length across all files")
        if spec.dtype.name != "string":
            arr = arr.astype(spec.dtype.as_numpy_dtype, copy=False)
        out[name] = arr
    return out


def _rebatch(pieces: Iterator, batch_size: int, drop_remainder: bool) -> Iterator[dict]:
    """Numpy column dicts of any size -> dicts of exactly ``batch_size`` rows (last one smaller
    unless ``drop_remainder``)."""
    pending: list = []
    n = 0
    for cols in pieces:
        rows = _rows(cols)
        if not rows:
            continue
        pending.append(cols)
        n += rows
        while n >= batch_size:
            merged = pending[0] if len(pending) == 1 else {
                k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
            yield {k: v[:batch_size] for k, v in merged.items()}
            rest = {k: v[batch_size:] for k, v in merged.items()}
            n -= batch_size
            pending = [rest] if n else []
    if n and not drop_remainder:
        yield pending[0] if len(pending) == 1 else {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}


def _arrow_dataset(make_batches, batch_size: int, drop_remainder: bool, output_signature, what: str):
    """``make_batches()`` yields ``(source, pyarrow.RecordBatch)``; build a batched dataset of column dicts."""
    import tensorflow as tf

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    if output_signature is None:
        first = None
        gen = make_batches()
        try:
            for source, batch in gen:
                if batch.num_rows:
                    first = _batch_to_numpy(batch, source)
                    break
        finally:
            gen.close()
        if first is None:
            raise ConfigError(f"cannot infer the {what} dataset's output signature: the files hold no rows. "
                              "Pass output_signature={name: tf.TensorSpec(...)} (e.g. on a rank whose shard "
                              "may be empty), or check the file list.")
        output_signature = _signature_of(first, batch_size, drop_remainder)

    sig = dict(output_signature)

    def pieces():
        for source, batch in make_batches():
            if batch.num_rows:
                yield _conform(_batch_to_numpy(batch, source), sig, source)

    def generate():
        yield from _rebatch(pieces(), batch_size, drop_remainder)

    ds = tf.data.Dataset.from_generator(generate, output_signature=sig)
    return _no_autoshard(ds)


def parquet_dataset(files, columns=None, batch_size: int = 1024, drop_remainder: bool = False,
                    output_signature=None):
    """A ``tf.data.Dataset`` of ``{column: batch tensor}`` dicts read from Parquet ``files`` by pyarrow.

    ``files``: paths/URIs (any filesystem pyarrow knows, including hdfs://). ``columns``: the
    columns to read (default: all, in file order). Batches hold exactly ``batch_size`` rows across
    file boundaries (the last one fewer unless ``drop_remainder``). Column mapping: numbers and
    bools -> tensors of that dtype, strings/binaries -> tf.string, fixed-size lists and lists of one
    uniform length -> 2-D (or N-D for nested lists) tensors. The output signature is inferred from
    the first batch; pass ``output_signature`` for a shard that may be empty. The dataset has
    AutoShardPolicy.OFF.

    Bad data raises :class:`~tfos.errors.FeedError` naming the column and file -- when the dataset
    is built if it is in the first batch, else while iterating (wrapped in TF's error): nulls,
    lists of varying length, or a column whose per-row shape changes between files. Unsupported
    types (timestamps, decimals, structs, ML vectors) raise ConfigError: cast them before writing.
    """
    import pyarrow.parquet as pq

    files = _file_list(files)
    columns = list(columns) if columns is not None else None

    def batches():
        for f in files:
            fs, path, _ = _resolve(f)
            with fs.open_input_file(path) as fh:
                pf = pq.ParquetFile(fh)
                if columns is not None:
                    missing = [c for c in columns if c not in pf.schema_arrow.names]
                    if missing:
                        raise ConfigError(f"{f} has no column(s) {missing}; it has {pf.schema_arrow.names}")
                for batch in pf.iter_batches(batch_size=batch_size, columns=columns, use_threads=False):
                    if columns is not None:
                        batch = batch.select(columns)
                    yield f, batch

    return _arrow_dataset(batches, batch_size, drop_remainder, output_signature, "parquet")


def _arrow_type(value):
    import pyarrow as pa

    if isinstance(value, pa.DataType):
        return value
    if value is str or (isinstance(value, str) and value.lower() in ("str", "string", "utf8")):
        return pa.string()
    if value is bytes or (isinstance(value, str) and value.lower() in ("bytes", "binary")):
        return pa.binary()
    try:
        return pa.from_numpy_dtype(np.dtype(value))
    except TypeError:
        raise ConfigError(f"unknown column type {value!r}; use a pyarrow type, a numpy dtype or 'string'") from None


def csv_dataset(files, batch_size: int = 1024, columns=None, column_names=None, header=None, column_types=None,
                delimiter: str = ",", drop_remainder: bool = False, output_signature=None):
    """A ``tf.data.Dataset`` of ``{column: batch tensor}`` dicts read from CSV ``files`` by pyarrow.

    ``header``: whether each file starts with a header line (default: True unless
    ``column_names`` is given). Without a header and without ``column_names`` the columns are
    named ``f0``, ``f1``, ... ``columns`` selects columns. ``column_types`` maps names to types
    (pyarrow types, numpy dtypes such as ``'float32'``, or ``'string'``); the types of the other
    columns are inferred once from the start of the first file and then used for every file, so
    that all batches agree. Compressed files (``.gz``, ``.bz2``, ...) are detected by extension.
    Batches, signature and AutoShardPolicy.OFF as in :func:`parquet_dataset`.

    If a column is inferred as integer from the first rows but later holds decimals, iterating
    raises an error naming the value: pass ``column_types={"col": "float32"}``.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    files = _file_list(files)
    if header is None:
        header = column_names is None
    types = {k: _arrow_type(v) for k, v in (column_types or {}).items()}
    read_options = pacsv.ReadOptions(
        column_names=list(column_names) if column_names is not None else None,
        autogenerate_column_names=(column_names is None and not header),
        skip_rows=1 if (header and column_names is not None) else 0, use_threads=False)
    parse_options = pacsv.ParseOptions(delimiter=delimiter)
    include = list(columns) if columns is not None else None
    hint = (" If a column's type was inferred wrongly from the first rows, pass "
            "column_types={name: 'float32' | 'int64' | 'string'}.")

    def open_reader(f, col_types):
        fs, path, _ = _resolve(f)
        stream = fs.open_input_stream(path, compression="detect")
        try:
            convert = pacsv.ConvertOptions(column_types=col_types, include_columns=include or [])
            return stream, pacsv.open_csv(stream, read_options=read_options, parse_options=parse_options,
                                          convert_options=convert)
        except pa.ArrowInvalid as e:
            stream.close()
            if "Empty CSV file" in str(e):
                return None, None
            raise FeedError(f"cannot parse {f}: {e}.{hint}") from e
        except BaseException:
            stream.close()
            raise

    # Fix every column's type from the first file, so that all files and blocks agree.
    resolved = dict(types)
    for f in files:
        stream, reader = open_reader(f, types)
        if reader is None:
            continue
        try:
            for field in reader.schema:
                resolved.setdefault(field.name, field.type)
        finally:
            stream.close()
        break

    def batches():
        for f in files:
            stream, reader = open_reader(f, resolved)
            if reader is None:
                continue
            try:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                    except pa.ArrowInvalid as e:
                        raise FeedError(f"cannot parse {f}: {e}.{hint}") from e
                    yield f, batch
            finally:
                stream.close()

    return _arrow_dataset(batches, batch_size, drop_remainder, output_signature, "csv")


# --------------------------------------------------------------------------- Spark DataFrame <-> TFRecord

def _encode_plan(schema) -> list[tuple[str, str, str]]:
    """``[(name, kind, mode)]`` for a Spark StructType; mode is 'scalar', 'list' or 'vector'."""
    from pyspark.sql import types as T

    def kind_of(dt):
        if isinstance(dt, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return "int64"
        if isinstance(dt, (T.FloatType, T.DoubleType)):
            return "float"
        if isinstance(dt, (T.StringType, T.BinaryType)):
            return "bytes"
        return None

    plan = []
    for field in schema.fields:
        dt = field.dataType
        kind = kind_of(dt)
        if kind:
            plan.append((field.name, kind, "scalar"))
            continue
        if isinstance(dt, T.ArrayType) and kind_of(dt.elementType):
            plan.append((field.name, kind_of(dt.elementType), "list"))
            continue
        if type(dt).__name__ == "VectorUDT":
            plan.append((field.name, "float", "vector"))
            continue
        raise ConfigError(f"column {field.name!r} has type {dt.simpleString()}, which has no tf.train.Example "
                          "feature. Cast it first (timestamps/dates to long, decimals to double, nested arrays "
                          "and structs to flat columns) or drop it.")
    return plan


def _encode_row(row, plan) -> bytes:
    items = []
    for i, (name, kind, mode) in enumerate(plan):
        value = row[i]
        if value is None:
            continue
        if mode == "scalar":
            values = [value]
        elif mode == "vector":
            values = np.asarray(value.toArray()).reshape(-1)
        else:
            values = value
            if any(v is None for v in values):
                raise ConfigError(f"column {name!r} holds an array with a null element; fill or drop those first")
        items.append((name, kind, values))
    return _serialize_example(items)


def _task_attempt() -> str:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None:
            return str(tc.taskAttemptId())
    except ImportError:
        pass
    return uuid.uuid4().hex[:12]


def _write_partition(spec: dict, index: int, rows) -> list[tuple[str, int]]:
    """Spark task body of :func:`save_as_tfrecords`: one TFRecord file per non-empty partition.
    Writes ``_temporary/<attempt>-part-NNNNN`` then renames it, so retries do not leave torn files."""
    from pyarrow import fs as pafs

    fs, base, prefix = _resolve(spec["uri"])
    compression = spec["compression"]
    name = f"part-{index:05d}.tfrecord" + {"GZIP": ".gz", "ZLIB": ".zlib"}.get(compression, "")
    tmp_dir = _join(base, "_temporary")
    fs.create_dir(tmp_dir, recursive=True)
    tmp = _join(tmp_dir, f"{_task_attempt()}-{name}")
    records = (_encode_row(row, spec["plan"]) for row in rows)
    count = _write_tfrecord_file(fs, tmp, records, compression, spec["engine"])
    if not count:
        fs.delete_file(tmp)
        return []
    final = _join(base, name)
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        fs.delete_file(final)
    fs.move(tmp, final)
    return [(_to_uri(prefix, final), count)]


def _prepare_output(fs, path: str, uri: str, mode: str) -> None:
    from pyarrow import fs as pafs

    if mode not in ("error", "errorifexists", "overwrite"):
        raise ConfigError(f"mode must be 'error' or 'overwrite', got {mode!r}")
    if path.rstrip("/") in ("", "/"):
        raise ConfigError(f"refusing to write TFRecords into the root directory {uri!r}; choose a subdirectory")
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.NotFound:
        if mode == "overwrite":
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(path)
            else:
                fs.delete_file(path)
        elif info.type != pafs.FileType.Directory or fs.get_file_info(pafs.FileSelector(path)):
            raise ConfigError(f"{uri} already exists; pass mode='overwrite' to replace it, or choose another path")
    fs.create_dir(path, recursive=True)


def _commit_output(fs, path: str) -> None:
    from pyarrow import fs as pafs

    tmp = _join(path, "_temporary")
    if fs.get_file_info(tmp).type == pafs.FileType.Directory:
        fs.delete_dir(tmp)
    with fs.open_output_stream(_join(path, "_SUCCESS"), compression=None):
        pass


def _tfos_error_from(e: BaseException) -> BaseException:
    """The tfos error a Spark task raised (found in the Py4J error text), else ``e`` itself."""
    text = str(e)
    for cls in (HadoopConfigError, ConfigError, FeedError):
        marker = f"tfos.errors.{cls.__name__}: "
        if marker in text:
            return cls(text.split(marker, 1)[1].split("\n", 1)[0] + " (raised in a Spark task)")
    return e


def _warn_if_node_local(spark_context, uri: str) -> None:
    master = getattr(spark_context, "master", "") or ""
    if _local_path(uri) is not None and not master.startswith("local"):
        logger.warning("%s is a local path and the Spark master is %s: every executor uses its own disk unless "
                       "the path is a shared mount (NFS); use an hdfs:// URI otherwise", uri, master)


def save_as_tfrecords(df, uri, mode: str = "error", compression=None, engine: str = "auto") -> list[tuple[str, int]]:
    """Write Spark DataFrame ``df`` as TFRecord files of ``tf.train.Example`` under directory ``uri``.

    One file ``part-NNNNN.tfrecord[.gz|.zlib]`` per non-empty partition (repartition first to
    choose the file count: at least, ideally a multiple of, the number of TF workers), plus a
    ``_SUCCESS`` marker. Column types: boolean/integral -> int64 feature, float/double -> float
    feature (float32), string/binary -> bytes feature, arrays of these -> lists, Spark ML vectors
    -> dense float lists; nulls leave the feature out. Examples are encoded in pure Python (no
    TensorFlow on executors); files go through pyarrow, so hdfs:// needs a Hadoop client on the
    driver and executors (see :class:`~tfos.errors.HadoopConfigError`). ``engine='auto'`` frames
    records in Python when a C CRC-32C is installed (google-crc32c), else with TensorFlow's writer
    if TF is importable, else in pure Python (slow).

    ``mode``: ``'error'`` (default; raise ConfigError if ``uri`` exists and is not empty) or
    ``'overwrite'``. ``compression``: None, ``'GZIP'`` or ``'ZLIB'``. Returns
    ``[(file_uri, num_records)]`` sorted by file. Plain paths are local paths (as in pyarrow),
    not paths on Spark's default filesystem: use explicit URIs for HDFS.
    """
    plan = _encode_plan(df.schema)
    compression = _norm_compression(compression)
    _choose_engine(engine)
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    fs, path, prefix = _resolve(uri)
    target = _to_uri(prefix, path)
    _prepare_output(fs, path, target, mode)
    _warn_if_node_local(df.sparkSession.sparkContext, target)
    spec = {"uri": target, "plan": plan, "compression": compression, "engine": engine}
    try:
        written = df.rdd.mapPartitionsWithIndex(functools.partial(_write_partition, spec)).collect()
    except Exception as e:
        try:
            from pyarrow import fs as pafs

            tmp = _join(path, "_temporary")
            if fs.get_file_info(tmp).type == pafs.FileType.Directory:
                fs.delete_dir(tmp)
        except Exception:  # best effort: the original error matters more
            logger.debug("could not remove %s/_temporary", target, exc_info=True)
        err = _tfos_error_from(e)
        if err is e:
            raise
        raise err from e
    _commit_output(fs, path)
    written.sort()
    logger.info("wrote %d records in %d TFRecord files under %s", sum(n for _, n in written), len(written), target)
    return written


def _decode_plan(schema) -> list[tuple[str, str, str]]:
    """``[(name, target, mode)]``; target is int, bool, float, str or bytes; mode scalar/list/vector."""
    from pyspark.sql import types as T

    def target_of(dt):
        if isinstance(dt, T.BooleanType):
            return "bool"
        if isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return "int"
        if isinstance(dt, (T.FloatType, T.DoubleType)):
            return "float"
        if isinstance(dt, T.StringType):
            return "str"
        if isinstance(dt, T.BinaryType):
            return "bytes"
        return None

    plan = []
    for field in schema.fields:
        dt = field.dataType
        if target_of(dt):
            plan.append((field.name, target_of(dt), "scalar"))
        elif isinstance(dt, T.ArrayType) and target_of(dt.elementType):
            plan.append((field.name, target_of(dt.elementType), "list"))
        elif type(dt).__name__ == "VectorUDT":
            plan.append((field.name, "float", "vector"))
        else:
            raise ConfigError(f"column {field.name!r}: type {dt.simpleString()} cannot be read from a "
                              "tf.train.Example; use boolean, integral, float/double, string, binary, arrays of "
                              "these, or ml VectorUDT")
    return plan


def _cast(name: str, target: str, v):
    if target == "int" or target == "bool":
        if not isinstance(v, int):
            raise ConfigError(f"feature {name!r} holds {type(v).__name__} values but the schema declares an "
                              "integral type; declare float/double instead")
        return bool(v) if target == "bool" else v
    if target == "float":
        if isinstance(v, bytes):
            raise ConfigError(f"feature {name!r} holds bytes but the schema declares a float type")
        return float(v)
    if not isinstance(v, bytes):
        raise ConfigError(f"feature {name!r} holds {type(v).__name__} values but the schema declares "
                          f"{'string' if target == 'str' else 'binary'}")
    return v.decode("utf-8") if target == "str" else v


def _example_to_row(features: dict, plan) -> tuple:
    out = []
    for name, target, mode in plan:
        values = features.get(name)
        if values is None:
            out.append(None)
        elif mode == "scalar":
            if len(values) > 1:
                raise ConfigError(f"feature {name!r} has {len(values)} values but the schema declares a single "
                                  "value; declare it as an array (ArrayType) instead")
            out.append(_cast(name, target, values[0]) if values else None)
        elif mode == "vector":
            from pyspark.ml.linalg import DenseVector

            out.append(DenseVector([_cast(name, "float", v) for v in values]))
        else:
            out.append([_cast(name, target, v) for v in values])
    return tuple(out)


def _decode_file(plan, compression: str, item) -> Iterator[tuple]:
    """Spark task body of :func:`load_tfrecords`: ``(path, file bytes)`` -> rows."""
    path, content = item
    if _is_hidden(posixpath.basename(path.rstrip("/"))):
        return
    comp = _compression_of(path) if compression == "auto" else compression
    stream = _decompressing(io.BytesIO(content), comp)
    for record in iter_tfrecords(stream, verify_checksums="auto", source=path):
        yield _example_to_row(decode_example(record), plan)


def load_tfrecords(spark, uri, schema, compression="auto", min_partitions: int | None = None):
    """Read TFRecord files of ``tf.train.Example`` (a directory, file, glob, or list of them) into a
    DataFrame with ``schema`` (a StructType or DDL string such as ``"x array<float>, y long"``).

    Files are read by Spark's own Hadoop filesystem layer (``SparkContext.binaryFiles``), so
    hdfs:// works wherever Spark can read it, without libhdfs; each file is loaded into memory
    whole, so keep files well below the executor memory. Names starting with ``_`` or ``.`` are
    skipped. Plain paths are local paths (made ``file://`` URIs), as in :func:`save_as_tfrecords`.
    Features missing from an Example become null; a feature with several values needs an
    ArrayType column (ConfigError otherwise). ``compression``: ``'auto'`` (by extension), None,
    ``'GZIP'`` or ``'ZLIB'``. The read is lazy: errors surface when the DataFrame is evaluated.
    """
    from pyspark.sql import types as T

    struct = schema if isinstance(schema, T.StructType) else spark.createDataFrame([], schema).schema
    plan = _decode_plan(struct)
    compression = compression if compression == "auto" else _norm_compression(compression)
    uris = _file_list(uri)
    if not uris:
        raise ConfigError("load_tfrecords needs at least one path")
    paths = []
    for u in uris:
        local = _local_path(u) if _scheme(u) is None else None
        paths.append("file://" + local if local else u)  # Hadoop paths are not percent-decoded
    rdd = spark.sparkContext.binaryFiles(",".join(paths), minPartitions=min_partitions)
    rows = rdd.flatMap(functools.partial(_decode_file, plan, compression))
    return spark.createDataFrame(rows, struct)
