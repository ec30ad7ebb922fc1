"""Path resolution against the cluster's default filesystem (TF process; pure, tested)."""

from __future__ import annotations

import posixpath


def absolute_path(path: str, default_fs: str, working_dir: str, user: str = "") -> str:
    """Resolve ``path`` as TensorFlowOnSpark did: URIs stay as they are; on a local default
    filesystem relative paths are relative to ``working_dir``; on a distributed one (hdfs://,
    viewfs://, ...) absolute paths go on it and relative ones under ``/user/<user>``."""
    if "://" in path:
        return path
    fs = (default_fs or "file:///").rstrip("/")
    if fs.startswith("file:"):
        full = path if path.startswith("/") else posixpath.join(working_dir, path)
        return "file://" + posixpath.normpath(full)
    if path.startswith("/"):
        return fs + posixpath.normpath(path)
    return fs + posixpath.normpath(posixpath.join("/user", user or "", path))
