"""save / load of TFEstimator and TFModel (Spark ML metadata, plus the estimator's train_fn).

Runs on the driver only. Loading an estimator unpickles its train_fn, which is code: the saved
files must belong to this user and be writable by nobody else (no links), else load refuses them.
That holds on a local filesystem and on HDFS (``hdfs://``, ``viewfs://``: checked through the Spark
session's Hadoop client, as the user HDFS knows this process by: ``UserGroupInformation``). Object stores
(``s3a://``, ``gs://``, ...) have no owners to check; their access policies are the store's to
enforce, as for any saved Spark ML pipeline with Python code.
"""

from __future__ import annotations

import os
import stat
from urllib.parse import urlparse

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from tfos.errors import ConfigError

_TRAIN_FN_DIR = "train_fn"


class TFReadWrite(MLReadable, MLWritable):
    """``save`` / ``load`` of TFEstimator and TFModel: the Params, and an estimator's train_fn (TFWriter)."""

    def write(self) -> MLWriter:
        return TFWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return TFReader(cls)


class TFWriter(MLWriter):
    """Writes the Params and, for an estimator with a train_fn (unless option saveTrainFn=false),
    ``(train_fn, tf_args)`` pickled with cloudpickle under ``path/train_fn``."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        train_fn = getattr(self.instance, "train_fn", None)  # TFModel has none
        save_fn = self.optionMap.get("savetrainfn", "true").lower() not in ("false", "0", "no")
        blob = _pickle_train_fn(train_fn, self.instance.tf_args) if save_fn and train_fn is not None else None
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"tfos": {"trainFn": blob is not None}})
        if blob is not None:
            self.sparkSession.createDataFrame([(bytearray(blob),)], "value binary").coalesce(1) \
                .write.parquet(os.path.join(path, _TRAIN_FN_DIR))


def _pickle_train_fn(train_fn, tf_args) -> bytes:
    from pyspark import cloudpickle

    try:
        return cloudpickle.dumps((train_fn, tf_args))
    except Exception as e:
        raise ConfigError(f"cannot serialise train_fn/tf_args with cloudpickle ({e}); save without it: "
                          "estimator.write().option('saveTrainFn', 'false').save(path), then "
                          "setTrainFn(fn) after loading") from e


class TFReader(MLReader):
    """Loads what TFWriter saved, into an instance of ``cls`` (which must be the saved class)."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = self.cls.__module__ + "." + self.cls.__name__
        if metadata["class"] != expected:
            raise ConfigError(f"{path} holds a {metadata['class']}, not a {expected}: load it with that class")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if (metadata.get("tfos") or {}).get("trainFn"):
            from pyspark import cloudpickle

            check_owned_by_me(os.path.join(path, _TRAIN_FN_DIR), self.sparkSession)
            row = self.sparkSession.read.parquet(os.path.join(path, _TRAIN_FN_DIR)).first()
            instance.train_fn, instance.tf_args = cloudpickle.loads(bytes(row[0]))
        return instance


_REFUSE = ("Save the estimator again to a directory only you can write, or load it with "
           "saveTrainFn=false and setTrainFn(fn)")


def check_owned_by_me(path: str, spark=None) -> None:
    """ConfigError unless every entry under ``path`` is this user's, not a link, and not group/other
    writable: local paths with ``os.lstat``; ``hdfs://``/``viewfs://`` through ``spark``'s Hadoop
    client (a classic session's JVM; without one the check cannot run and the load is refused).
    URIs of object stores are not checked."""
    parsed = urlparse(path)
    if parsed.scheme in ("hdfs", "viewfs"):
        return _check_hadoop_owned_by_me(path, spark)
    if parsed.scheme not in ("", "file"):
        return
    local = parsed.path if parsed.scheme else path
    entries = [local]
    for root, dirs, files in os.walk(local, followlinks=False):
        entries += [os.path.join(root, n) for n in dirs + files]
    for entry in entries:
        st = os.lstat(entry)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ConfigError(f"refusing to load the pickled train_fn: {entry} is a link, belongs to another user or "
                              f"is writable by others. {_REFUSE}")


def hadoop_filesystem(spark, path: str):
    """``(org.apache.hadoop package, FileSystem, Path)`` of ``path`` through a classic session's
    Hadoop client (its JVM); None when the session has none (Spark Connect)."""
    try:
        sc = spark.sparkContext
        jvm = sc._jvm
    except Exception:  # a Connect session: no SparkContext
        return None
    if jvm is None:
        return None
    hadoop = jvm.org.apache.hadoop
    p = hadoop.fs.Path(path)
    return hadoop, p.getFileSystem(sc._jsc.hadoopConfiguration()), p


def _check_hadoop_owned_by_me(path: str, spark) -> None:
    found = hadoop_filesystem(spark, path)
    if found is None:
        raise ConfigError(f"refusing to load the pickled train_fn from {path}: who may write it can only be checked "
                          f"through a classic Spark session's Hadoop client (this session has no JVM). {_REFUSE}")
    hadoop, fs, root = found
    me = hadoop.security.UserGroupInformation.getCurrentUser().getShortUserName()
    write = hadoop.fs.permission.FsAction.WRITE
    pending = [fs.getFileLinkStatus(root)]
    while pending:
        st = pending.pop()
        perm = st.getPermission()
        if (st.isSymlink() or st.getOwner() != me or perm.getGroupAction().implies(write)
                or perm.getOtherAction().implies(write)):
            raise ConfigError(f"refusing to load the pickled train_fn: {st.getPath().toString()} is a link, belongs to "
                              f"{st.getOwner()} (not {me}) or is writable by others ({perm.toString()}). {_REFUSE}")
        if st.isDirectory():
            pending.extend(fs.listStatus(st.getPath()))
