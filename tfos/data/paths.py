"""Path resolution against the cluster's default filesystem (TF process; pure, tested)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def context_default_fs(default_fs: str) -> str:
    """Pure: ``ctx.defaultFS`` as TensorFlowOnSpark gave it: Hadoop's ``fs.defaultFS`` with the
    root slash of ``file:///`` stripped (``file://``), so ``ctx.defaultFS + "/abs/path"`` works."""
    fs = default_fs or "file:///"
    if fs.startswith("file://") and len(fs) > 7 and fs.endswith("/"):
        fs = fs[:-1]
    return fs


def absolute_path(path: str, default_fs: str, working_dir: str, user: str = "") -> str:
    """Resolve ``path`` as TensorFlowOnSpark's ``TFNode.hdfs_path`` did (well-formed where it was not).

    * a URI (``scheme://...``) is returned as it is;
    * an absolute path goes on the default filesystem: ``<defaultFS><path>``, so a defaultFS
      without an authority gives ``hdfs:///foo``;
    * a relative path goes under ``/user/<user>`` on hdfs:// and viewfs://, under ``working_dir``
      on file://, and right under the root of any other filesystem.

    ``default_fs`` may end in a slash (Hadoop's ``file:///``) or not (TensorFlowOnSpark's
    ``file://``); both give the same results. Paths are joined, not normalised.
    """
    if "://" in path:
        return path
    fs = default_fs or "file:///"
    if fs.endswith("/") and not fs.endswith("://"):
        fs = fs[:-1]
    if path.startswith("/"):
        return fs + path
    if fs.startswith(("hdfs://", "viewfs://")):
        return f"{fs}/user/{user}/{path}"
    if fs.startswith("file://"):
        return f"{fs}/{working_dir.lstrip('/')}/{path}"
    logger.warning("relative path %r on the default filesystem %s: resolved to its root", path, fs)
    return f"{fs}/{path}"
