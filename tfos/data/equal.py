"""Equal steps for InputMode.TENSORFLOW: every rank's reader yields the same number of batches when
the ranks' files hold unequal record counts (TF process; the policy is :mod:`tfos.data.uneven`).

The readers (:func:`~tfos.data.tfrecord_dataset`, :func:`~tfos.data.parquet_dataset`,
:func:`~tfos.data.csv_dataset`) given a ``batch_size`` and the files of :func:`~tfos.data.rank_files`
count their records, learn every rank's count through the driver (``ctx.all_gather``) and apply
``uneven``: ``"drop"`` takes ``ceil(fewest / batch)`` batches, ``"pad"`` fills every rank up to
``ceil(most / batch)`` full batches with a row of its own weighted 0 (a ``sample_weight`` entry),
``"error"`` raises UnevenDataError on every rank before the first step. Counting is cheap where it
can be: Parquet's footers; TFRecord files written by :func:`~tfos.data.save_as_tfrecords` come with
a record count per file (``_tfos_counts.json``), others are scanned (record headers only, when
uncompressed).
"""

from __future__ import annotations

import itertools
import json
import logging
import os

from tfos.data.fs import _resolve
from tfos.data import uneven

logger = logging.getLogger(__name__)

#: the record counts save_as_tfrecords writes next to its files: {file name: records}
COUNTS_FILE = "_tfos_counts.json"
_calls = itertools.count()  # every rank's readers run in the same order: the all-gather keys match


def _gather(files, own: int) -> dict[int, int]:
    """Every rank's record count, by rank, through the driver."""
    values = files.ctx.all_gather(f"tfos.data.records.{next(_calls)}", own)
    return dict(enumerate(values))


def applies(files, batch_size, policy) -> bool:
    """Equal steps apply: batched reading of rank_files' files on more than one rank, a policy."""
    return bool(batch_size) and bool(policy) and getattr(files, "ctx", None) is not None and files.num_workers > 1


def equalize(ds, files, own: int, batch_size: int, policy: str, weights_as_tuple: bool = False):
    """``ds`` (batched by ``batch_size``, ``own`` records on this rank) with every rank's step count
    made equal by ``policy``; the rows dropped or padded are logged and reported (``ctx.report``)."""
    import tensorflow as tf

    policy = uneven.check_policy(policy)
    totals = _gather(files, own)
    uneven.check_totals(policy, totals, batch_size)
    fewest, most = min(totals.values()), max(totals.values())
    if policy == "pad":
        pad = uneven.steps(most, batch_size) * batch_size - own
        real = ds.unbatch().map(lambda *e: _with_weight(e, 1.0, weights_as_tuple))
        filler = ds.unbatch().take(1).repeat(pad).map(lambda *e: _with_weight(e, 0.0, weights_as_tuple))
        out, dropped = real.concatenate(filler).batch(batch_size), 0
    else:
        steps = uneven.steps(fewest, batch_size)
        out, dropped, pad = ds.take(steps), uneven.surplus("drop", batch_size, own, totals), 0
    if dropped or pad:
        logger.warning("tfos.data: rank %d reads %d of its %d records in %d steps of %d and %s so that every rank "
                       "runs the same steps (uneven=%r; records per rank: %s)", files.rank, own - dropped, own,
                       uneven.steps(max(own - dropped + pad, 1), batch_size), batch_size,
                       f"drops {dropped}" if dropped else f"pads {pad} rows with weight 0", policy, totals)
    if hasattr(files.ctx, "report"):
        files.ctx.report(rows_dropped=dropped, rows_padded=pad)
    return out.with_options(ds.options())


def _with_weight(element, weight: float, as_tuple: bool):
    import tensorflow as tf

    one = element[0] if len(element) == 1 else element
    if isinstance(one, dict) and not as_tuple:
        return dict(one, **{uneven.WEIGHT_COLUMN: tf.constant(weight, tf.float32)})
    return (*element, tf.constant(weight, tf.float32))


# --------------------------------------------------------------------------- counting records

def count_tfrecords(files, compression: str = "auto") -> int:
    """Records in TFRecord ``files``: from ``_tfos_counts.json`` next to them when
    :func:`~tfos.data.save_as_tfrecords` wrote them, else by reading the record headers
    (uncompressed files: 12 bytes per record and a seek) or the whole stream (compressed)."""
    from tfos.data.tfrecord import _compression_of, _iter_file_records

    total, manifests = 0, {}
    for f in files:
        directory, name = f.rsplit("/", 1) if "/" in f else ("", f)
        if directory not in manifests:
            manifests[directory] = _read_counts(directory)
        known = manifests[directory].get(name)
        if known is not None:
            total += int(known)
            continue
        comp = _compression_of(f) if compression == "auto" else (compression or "")
        if comp:
            total += sum(1 for _ in _iter_file_records(f, comp, False))
        else:
            total += _count_uncompressed(f)
    return total


def _read_counts(directory: str) -> dict:
    try:
        fs, path, _ = _resolve(directory + "/" + COUNTS_FILE)
        with fs.open_input_stream(path) as f:
            counts = json.loads(f.read().decode("utf-8"))
        return counts if isinstance(counts, dict) else {}
    except (OSError, ValueError):
        return {}


def _count_uncompressed(uri: str) -> int:
    import struct

    from tfos.errors import FeedError

    fs, path, _ = _resolve(uri)
    n = 0
    with fs.open_input_file(path) as f:
        size = f.size()
        pos = 0
        while pos < size:
            header = f.read_at(8, pos)
            if len(header) < 8:
                raise FeedError(f"truncated TFRecord header in {uri} at byte {pos}")
            (length,) = struct.unpack("<Q", header)
            pos += 12 + length + 4
            n += 1
        if pos != size:
            raise FeedError(f"truncated TFRecord in {uri}: the last record ends at byte {pos} of {size}")
    return n


def count_parquet(files) -> int:
    """Rows in Parquet ``files``, from their footers."""
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        fs, path, _ = _resolve(f)
        with fs.open_input_file(path) as src:
            total += pq.ParquetFile(src).metadata.num_rows
    return total


def write_counts(fs, path: str, written: list[tuple[str, int]]) -> None:
    """``_tfos_counts.json`` in ``path``: each written file's record count, by file name."""
    counts = {os.path.basename(uri): n for uri, n in written}
    with fs.open_output_stream(path.rstrip("/") + "/" + COUNTS_FILE, compression=None) as out:
        out.write(json.dumps(counts, sort_keys=True).encode("utf-8"))
