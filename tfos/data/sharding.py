"""Listing a directory and splitting its files among the training ranks.

Runs in the TF process of every chief/worker (:func:`rank_files` inside ``main_fun``) and on the
driver (:func:`list_files` for planning). :func:`shard` and :func:`shard_by_size` are pure and
deterministic, so every rank computes the same assignment from the same listing.
"""

from __future__ import annotations

import fnmatch
import heapq
import logging
import os
from collections.abc import Mapping

import numpy as np

from tfos.data.fs import _is_hidden, _resolve, _to_uri
from tfos.errors import ConfigError

logger = logging.getLogger(__name__)


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


class RankFiles(list):
    """This rank's files (a list of URIs), remembering the node's ``ctx``: the tfos.data readers
    given them with a ``batch_size`` make every rank run the same number of steps (tfos.data.equal)."""

    def __init__(self, files, ctx):
        super().__init__(files)
        self.ctx = ctx
        self.rank = ctx.rank
        self.num_workers = ctx.num_workers


def rank_files(ctx, uri, pattern: str = "*", recursive: bool = False, by_size: bool = False,
               allow_empty: bool = False) -> list[str]:
    """List ``uri`` and return this node's shard: ``shard(list_files(...), ctx.rank, ctx.num_workers)``.

    ``uri`` is resolved with ``ctx.absolute_path`` (relative paths go on the cluster's default
    filesystem). ``by_size=True`` balances bytes instead of file counts (:func:`shard_by_size`).
    Call it on chief/worker nodes only: ps and evaluator nodes have no rank (ConfigError). The
    list remembers ``ctx``, so that the readers can give every rank the same number of steps.
    """
    if getattr(ctx, "rank", None) is None:
        _check_rank(None, 1)
    full = ctx.absolute_path(uri) if hasattr(ctx, "absolute_path") else uri
    if by_size:
        listed = list_files_with_sizes(full, pattern, recursive)
        mine = shard_by_size(listed, ctx.rank, ctx.num_workers, allow_empty)
    else:
        listed = list_files(full, pattern, recursive)
        mine = shard(listed, ctx.rank, ctx.num_workers, allow_empty)
    logger.info("rank %d/%d reads %d of %d files under %s", ctx.rank, ctx.num_workers, len(mine), len(listed),
                full)
    return RankFiles(mine, ctx) if hasattr(ctx, "all_gather") else mine
