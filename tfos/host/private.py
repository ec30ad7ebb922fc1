"""Per-user private directories for host-local state (barrier task, node agent, TF process).

Executors of several users share ``/tmp`` on real clusters, so nothing tfos reads back - the
pickled ``main_fun``, the claim registry - may live where another user can write. Everything
goes under ``<tmp>/tfos-<uid>/`` (mode 0700), and every directory tfos uses there is checked
without following symlinks: it must be a real directory, owned by this user, with no group or
other permissions. A directory that fails the check is an error naming it; nothing is trusted.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading

from tfos.errors import TFOSError


class UnsafeDirectoryError(TFOSError):
    """A directory tfos would use for private state is a symlink, foreign-owned or group/world-accessible."""


def check_private(path: str) -> None:
    """Raise UnsafeDirectoryError unless ``path`` is a directory (not a symlink) owned by this user
    with mode 0700 or stricter. Opened with O_NOFOLLOW, checked with fstat: no race with a swap."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise UnsafeDirectoryError(f"{path} cannot be used for tfos's private files ({e.strerror}: a symlink or "
                                   "not a directory?); remove it, or point TMPDIR elsewhere") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.getuid():
        raise UnsafeDirectoryError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}); "
                                   "tfos will not use it: remove it, or point TMPDIR elsewhere")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UnsafeDirectoryError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}; tfos needs 0700 for its private "
                                   "files: remove it (or chmod 700 it), or point TMPDIR elsewhere")


def private_dir(*parts: str, create: bool = True) -> str:
    """``<tmp>/tfos-<uid>/<parts...>``, each level created 0700 or checked (see check_private)."""
    path = os.path.join(tempfile.gettempdir(), f"tfos-{os.getuid()}")
    for part in ("",) + parts:
        if part:
            path = os.path.join(path, part)
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        check_private(path)
    return path


def user_cache_root() -> str:
    """``$TFOS_CACHE_DIR`` (default ``~/.cache/tfos``), this user's cache of downloads and builds:
    its path only, nothing created (a lookup must not write where a process's HOME may be foreign)."""
    return os.environ.get("TFOS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfos")


def user_cache_dir(*parts: str) -> str:
    """:func:`user_cache_root` and ``parts`` below it, each level created 0700 or checked like
    :func:`check_private`."""
    path = user_cache_root()
    for part in ("",) + parts:
        path = os.path.join(path, part) if part else path
        os.makedirs(path, mode=0o700, exist_ok=True)
        check_private(path)
    return path


def check_trusted_file(path: str) -> None:
    """Raise UnsafeDirectoryError unless ``path`` is a regular file (not a symlink) that only this
    user or root can change, in a directory only they can change: what tfos loads as code."""
    for p, kind in ((os.path.dirname(os.path.abspath(path)), "directory"), (path, "file")):
        try:
            st = os.lstat(p)
        except OSError as e:
            raise UnsafeDirectoryError(f"{path}: cannot check its {kind} {p} ({e.strerror})") from None
        if stat.S_ISLNK(st.st_mode) and kind == "file":
            raise UnsafeDirectoryError(f"{path} is a symlink; tfos loads code only from the file itself")
        if st.st_uid not in (os.getuid(), 0) or stat.S_IMODE(st.st_mode) & 0o022:
            raise UnsafeDirectoryError(f"{p} can be changed by another user (owner uid {st.st_uid}, mode "
                                       f"{stat.S_IMODE(st.st_mode):o}); tfos will not load code from it: "
                                       "make it yours and not group/other-writable")


def fresh_dir(parent: str, name: str) -> str:
    """Create ``parent/name`` (0700) that must not exist yet: an existing one is never reused."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise UnsafeDirectoryError(f"{path} already exists; tfos creates node directories fresh and does not "
                                   "reuse one (a retried task, or a planted directory): remove it") from None
    check_private(path)
    return path


def write_private_file(path: str, data: bytes) -> None:
    """Write a new 0600 file; refuses to follow a symlink or to open an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


#: The file in a cluster's private directory (``<tmp>/tfos-<uid>/<cluster_id>/``) that holds its
#: secret for the Spark tasks of this host that feed the cluster: they find it there, not in their
#: closures, which Spark serves to anyone without spark.authenticate (docs/security.md).
SECRET_FILE = "cluster.secret"

#: The Spark local property that carries the secret to the feeding tasks of a classic Spark
#: application (in the task launch messages; a node-less executor has no file to read). Its name is
#: also set in the SparkConf, so that Spark's event log redacts it (spark.redaction.regex: "secret").
#: It does not start with "spark": Spark SQL sets each conf of a session whose name does as a local
#: property of the session's jobs, and a session made after the name was registered holds its
#: placeholder, which would then replace the secret in a DataFrame's feeding tasks.
SECRET_PROPERTY = "tfos.cluster.secret"


def store_cluster_secret(cluster_id: str, secret: str) -> None:
    """Put ``secret`` in the cluster's private directory on this host (0600, replaced atomically:
    the nodes of one host write the same secret)."""
    directory = private_dir(cluster_id)
    tmp = os.path.join(directory, f".{SECRET_FILE}.{os.getpid()}.{threading.get_ident()}")
    write_private_file(tmp, secret.encode())
    os.replace(tmp, os.path.join(directory, SECRET_FILE))


def read_private_file(path: str, limit: int = -1) -> bytes:
    """Up to ``limit`` bytes of ``path``, which must be a regular file of this user with no group or
    other permission: opened without following a symlink, checked with fstat (no race with a
    swap). UnsafeDirectoryError when it is not private; the open's OSError (FileNotFoundError,
    ELOOP for a symlink) passes through."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafeDirectoryError(f"{path} is not a private file of this user (uid {st.st_uid}, mode "
                                       f"{stat.S_IMODE(st.st_mode):o}); tfos will not use it: remove it")
        return f.read(limit)


def load_cluster_secret(cluster_id: str) -> str | None:
    """The secret a node of the cluster left on this host, or None when none did (a private file:
    :func:`read_private_file`)."""
    base = os.path.join(tempfile.gettempdir(), f"tfos-{os.getuid()}")
    if not os.path.isdir(os.path.join(base, cluster_id)):
        return None
    path = os.path.join(private_dir(cluster_id, create=False), SECRET_FILE)
    try:
        return read_private_file(path, 256).decode()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafeDirectoryError(f"{path} cannot be read as tfos's cluster secret ({e.strerror})") from None


def release_cluster_secret(cluster_dir: str) -> None:
    """Remove the cluster's secret from this host once no node directory is left in ``cluster_dir``
    (a node that ended cleanly removes its own; a failed one keeps it, and the secret, for
    debugging), and the directory with it when that is then empty."""
    try:
        if any(name.startswith("node-") for name in os.listdir(cluster_dir)):
            return
        os.unlink(os.path.join(cluster_dir, SECRET_FILE))
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        os.rmdir(cluster_dir)
    except OSError:
        pass


def remove_tree(path: str) -> None:
    """Remove a private directory tree (best effort); removes its parent too when that is left empty."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass
