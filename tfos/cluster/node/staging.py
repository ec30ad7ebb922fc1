"""Node-local staging for directories TensorFlow cannot open: hdfs://, viewfs://, s3:// (TF process).

TensorFlow 2.21 has no filesystem for these schemes (tensorflow-io, which added them, stopped at
TF 2.16). When ``checkpoint_dir`` or ``log_dir`` names one, main_fun gets a local directory in
the node's private directory instead (``ctx.checkpoint_dir``, ``ctx.log_dir``; the remote URIs
stay in ``ctx.checkpoint_uri`` and ``ctx.log_uri``), and a :class:`Mirror` keeps the two in step
through tfos's filesystem layer (:mod:`tfos.data.fs`; hdfs-native for HDFS):

* before main_fun, the remote directory is copied down, so every rank restores the same files;
* while main_fun runs, a thread uploads each finished file (unchanged for one poll) under a
  temporary name and renames it into place, so a reader never sees half a file; a checkpoint's
  state file (``checkpoint``) goes up only after the files it names, and files main_fun deleted
  (``max_to_keep``) are deleted remotely after that;
* after main_fun, also when it raised, a last pass uploads everything left before the node
  reports its exit; if it fails, the node fails with the cause.

Checkpoints are uploaded by rank 0 only (every rank restores); TensorBoard logs by every node
(their file names differ per host and process). Copies stream in 8 MiB blocks: memory stays
bounded whatever the file size.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tfos.data.fs import _resolve, _scheme
from tfos.errors import TFOSError
from tfos.host.deadline import Deadline

logger = logging.getLogger(__name__)

#: Schemes TensorFlow 2.21 cannot open; a directory on one of them is staged.
STAGED_SCHEMES = ("hdfs", "viewfs", "s3")
BLOCK = 8 << 20


def needs_staging(uri: str | None) -> bool:
    """Pure: whether TensorFlow needs a local stand-in for ``uri``."""
    return bool(uri) and _scheme(uri) in STAGED_SCHEMES


def upload_order(names) -> list[str]:
    """Pure: checkpoint data first, then indexes, then state files (``checkpoint``), so a state file
    on the remote side only names files already there."""
    def key(rel):
        base = rel.rsplit("/", 1)[-1]
        return (base == "checkpoint", base.endswith(".index"), rel)

    return sorted(names, key=key)


class Mirror:
    """Keeps ``local_dir`` and the remote directory ``uri`` in step (see the module)."""

    def __init__(self, uri: str, local_dir: str, upload: bool = True, delete: bool = True, interval: float = 1.0,
                 exclude: str = ""):
        self.uri = uri.rstrip("/")
        self.exclude = exclude.strip("/")  # a subdirectory another mirror owns
        self.local_dir = local_dir
        self.upload = upload
        self.delete = delete
        self.interval = interval
        self.fs, self.root, _ = _resolve(self.uri)
        self._seen: dict[str, tuple] = {}  # rel -> stat at the previous pass
        self._sent: dict[str, tuple] = {}  # rel -> stat when uploaded (or restored)
        self._made: set[str] = set()  # remote directories known to exist
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one pass at a time
        self.error: BaseException | None = None
        os.makedirs(local_dir, mode=0o700, exist_ok=True)

    # -- before main_fun
    def restore(self) -> int:
        """Copy the remote files down; returns how many. A missing remote directory is created."""
        from pyarrow import fs as pafs

        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.NotFound:
            if self.upload:
                self.fs.create_dir(self.root, recursive=True)
            return 0
        n = 0
        for f in self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True)):
            rel = os.path.relpath(f.path, self.root)
            if f.type != pafs.FileType.File or rel.split("/")[-1].startswith(".tfos-upload-") or self._excluded(rel):
                continue
            dest = os.path.join(self.local_dir, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with self.fs.open_input_stream(f.path) as src, open(dest, "wb") as out:
                while block := src.read(BLOCK):
                    out.write(block)
            st = os.stat(dest)
            self._sent[rel] = self._seen[rel] = (st.st_size, st.st_mtime_ns)
            n += 1
        logger.info("restored %d file(s) from %s into %s", n, self.uri, self.local_dir)
        return n

    # -- while main_fun runs
    def start(self) -> "Mirror":
        if self.upload:
            self._thread = threading.Thread(target=self._loop, name="tfos-mirror", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as e:  # retried next pass; the final pass raises it
                logger.warning("uploading %s to %s failed (will retry): %s", self.local_dir, self.uri, e)

    def _excluded(self, rel: str) -> bool:
        return bool(self.exclude) and (rel == self.exclude or rel.startswith(self.exclude + "/"))

    def _local_files(self) -> dict[str, tuple]:
        found = {}
        for d, _, files in os.walk(self.local_dir):
            for name in files:
                path = os.path.join(d, name)
                if self._excluded(os.path.relpath(path, self.local_dir)):
                    continue
                try:
                    st = os.stat(path)
                except FileNotFoundError:  # deleted meanwhile
                    continue
                found[os.path.relpath(path, self.local_dir)] = (st.st_size, st.st_mtime_ns)
        return found

    def sync(self, final: bool = False) -> int:
        """One pass: upload finished files (all changed files when ``final``), then delete what
        main_fun deleted. Returns the number of files uploaded."""
        with self._lock:
            now = self._local_files()
            ready = [rel for rel, st in now.items() if self._sent.get(rel) != st
                     and (final or self._seen.get(rel) == st)]
            self._seen = now
            for rel in upload_order(ready):
                self._put(rel, now[rel])
            if self.delete:
                for rel in [r for r in self._sent if r not in now]:
                    self.fs.delete_file(f"{self.root}/{rel}")
                    del self._sent[rel]
            return len(ready)

    def _put(self, rel: str, st: tuple) -> None:
        target = f"{self.root}/{rel}"
        parent, base = target.rsplit("/", 1)
        tmp = f"{parent}/.tfos-upload-{base}-{os.getpid()}"
        if parent not in self._made:
            self.fs.create_dir(parent, recursive=True)
            self._made.add(parent)
        try:
            with open(os.path.join(self.local_dir, rel), "rb") as src, self.fs.open_output_stream(tmp) as out:
                while block := src.read(BLOCK):
                    out.write(block)
        except FileNotFoundError:  # deleted before we got to it (max_to_keep): nothing to send
            return
        self.fs.move(tmp, target)
        self._sent[rel] = st

    # -- after main_fun
    def close(self, timeout: float = 600.0) -> None:
        """Stop the thread and upload what is left; raises TFOSError naming the URI if that fails."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if not self.upload:
            return
        deadline = Deadline(timeout)
        while True:
            try:
                n = self.sync(final=True)
                logger.info("staging: %s is on %s (%d file(s) in the last pass)", self.local_dir, self.uri, n)
                return
            except Exception as e:
                if deadline.expired():
                    raise TFOSError(f"could not upload {self.local_dir} to {self.uri}: {e}") from e
                logger.warning("last upload to %s failed, retrying: %s", self.uri, e)
                time.sleep(1.0)


def stage(ctx, node_dir: str, interval: float = 1.0) -> list[Mirror]:
    """Stage ``ctx.checkpoint_dir`` and ``ctx.log_dir`` when TensorFlow cannot open them: point
    ``ctx`` at local directories, restore, start the uploads. Returns the mirrors to close."""
    mirrors = []
    ctx.checkpoint_uri, ctx.log_uri = ctx.checkpoint_dir, ctx.log_dir
    log = None
    if needs_staging(ctx.log_dir):
        log = Mirror(ctx.log_dir, os.path.join(node_dir, "staging", "log_dir"), delete=False, interval=interval)
        mirrors.append(log)
        ctx.log_dir = log.local_dir
    if needs_staging(ctx.checkpoint_dir):
        local = os.path.join(node_dir, "staging", "checkpoint")
        if log is not None and ctx.checkpoint_dir.startswith(log.uri + "/"):  # <log_dir>/checkpoint: its own mirror
            log.exclude = ctx.checkpoint_dir[len(log.uri) + 1:]
            local = os.path.join(log.local_dir, log.exclude)
        mirrors.append(Mirror(ctx.checkpoint_dir, local, upload=ctx.is_chief, interval=interval))
        ctx.checkpoint_dir = local
    for m in mirrors:
        m.restore()
        m.start()
    return mirrors
