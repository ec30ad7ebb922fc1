"""``tf.data`` readers of a rank's files: TFRecord, Parquet and CSV.

Runs in the TF process (inside ``main_fun``). TensorFlow is imported only when a reader is
called; files are opened through pyarrow (so hdfs:// works without TF's own filesystems), and
Arrow columns become numpy with :func:`tfos.wire.arrow.column_to_numpy`.

Every dataset here has ``AutoShardPolicy.OFF``: the files are already split per rank (see the
:mod:`tfos.data` docstring for why tf.distribute must not shard them again).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tfos.data import equal, tfhdfs
from tfos.data.fs import _file_list, _local_path, _resolve, _scheme
from tfos.data.spool import spool_paths
from tfos.data.tfrecord import _compression_of, _norm_compression
from tfos.errors import ConfigError, FeedError, TFOSError
from tfos.data.datasets import no_autoshard


#: TFRecordDataset's read size on hdfs:// through the plugin (TF's default, 256 KB, costs more CPU per byte)
PLUGIN_READ_BUFFER = 4 << 20


def tfrecord_dataset(files, compression_type="auto", features=None, reader: str = "auto",
                     buffer_size: int | None = None, num_parallel_reads: int | None = None,
                     verify_checksums="auto", batch_size: int | None = None, uneven: str | None = "drop"):
    """A ``tf.data.Dataset`` of the serialized records in ``files`` (a list of paths/URIs).

    ``compression_type``: ``'auto'`` (from the extension: ``.gz`` -> GZIP, ``.zlib`` -> ZLIB),
    ``None``/``''``, ``'GZIP'`` or ``'ZLIB'``. ``features``: a dict of ``tf.io`` feature specs
    (e.g. ``{"x": tf.io.FixedLenFeature([784], tf.float32)}``); when given, each element is the
    parsed dict instead of the serialized bytes.

    ``reader``: ``'tensorflow'`` uses ``tf.data.TFRecordDataset`` on the paths (local and file://
    paths, gs://, and hdfs:// with tfos's plugin: :mod:`tfos.data.tfhdfs`); ``'arrow'`` reads the
    bytes through tfos's fs layer (any filesystem pyarrow knows, and hdfs://) and hands them to
    ``TFRecordDataset`` in blocks of whole records (:mod:`tfos.data.spool`: bounded memory, records
    parsed and checksums checked in TF's C++); ``'auto'`` picks tensorflow when TF opens every file
    itself (local, or hdfs:// with the plugin registered), else arrow.
    ``buffer_size`` / ``num_parallel_reads`` go to TFRecordDataset (``num_parallel_reads`` only with
    the tensorflow reader; ``verify_checksums`` is kept for compatibility: TF always checks them).
    The dataset has AutoShardPolicy.OFF.

    ``batch_size``: batch the records (the last batch smaller). With the files of
    :func:`~tfos.data.rank_files` every rank then yields the same number of batches whatever its
    files hold (``uneven``: ``"drop"``, ``"pad"``, ``"error"`` or None; see :mod:`tfos.data.equal`).
    """
    import tensorflow as tf

    rank_shard, files = files, _file_list(files)
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
    remote = [f for p, f in zip(local, files) if p is None]
    on_plugin = [f for f in remote if _scheme(f) in ("hdfs", "viewfs")]  # what TF opens through tfos's plugin
    if reader == "auto":
        reader = "tensorflow" if len(on_plugin) == len(remote) and (not on_plugin or tfhdfs.register()) else "arrow"
    if reader == "tensorflow" and on_plugin:
        tfhdfs.register(required=True)  # a no-op once registered; else HadoopConfigError names the fix
        if buffer_size is None:  # fewer, larger reads of the plugin's stream (bench/README, HDFS)
            buffer_size = PLUGIN_READ_BUFFER
    if reader == "tensorflow":
        names = [p if p is not None else f for p, f in zip(local, files)]
        ds = tf.data.TFRecordDataset(tf.constant(names, dtype=tf.string), compression_type=compression,
                                     buffer_size=buffer_size, num_parallel_reads=num_parallel_reads)
    else:  # pyarrow reads each file; TF's own reader parses it block by block (tfos.data.spool)
        paths = tf.data.Dataset.from_generator(lambda: spool_paths(files, compression),
                                               output_signature=tf.TensorSpec(shape=(), dtype=tf.string))
        # one file after another (TFRecordDataset's own flat_map over a dataset of paths). No prefetch
        # per record: the reader process already reads ahead, and a per-record prefetch doubled TF's
        # CPU per byte (bench/README, HDFS)
        ds = tf.data.TFRecordDataset(paths, buffer_size=buffer_size or (1 << 20))
    if features is not None:
        ds = ds.map(lambda r: tf.io.parse_single_example(r, features), num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size:
        ds = ds.batch(batch_size)
        if equal.applies(rank_shard, batch_size, uneven):
            ds = equal.equalize(ds, rank_shard, equal.count_tfrecords(files, compression), batch_size, uneven,
                                weights_as_tuple=features is None)
    return no_autoshard(ds)


# --------------------------------------------------------------------------- Arrow batches -> tf.data

def _batch_to_numpy(batch, source: str) -> dict:
    from tfos.wire.arrow import column_to_numpy

    try:
        return {field.name: column_to_numpy(batch.column(i), field) for i, field in enumerate(batch.schema)}
    except TFOSError as e:
        raise type(e)(f"{e} (in {source})") from None


def _signature_of(cols: dict, batch_size: int, drop_remainder: bool) -> dict:
    import tensorflow as tf

    sig = {}
    for name, arr in cols.items():
        dtype = tf.string if arr.dtype == object or arr.dtype.kind in "SU" else tf.as_dtype(arr.dtype)
        sig[name] = tf.TensorSpec(shape=(batch_size if drop_remainder else None,) + arr.shape[1:], dtype=dtype)
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


def _concat(pending: list) -> dict:
    return pending[0] if len(pending) == 1 else {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}


def _rebatch(pieces: Iterator, batch_size: int, drop_remainder: bool) -> Iterator[dict]:
    """Numpy column dicts of any size -> dicts of exactly ``batch_size`` rows (last one smaller
    unless ``drop_remainder``)."""
    pending: list = []
    n = 0
    for cols in pieces:
        rows = len(next(iter(cols.values()))) if cols else 0
        if not rows:
            continue
        pending.append(cols)
        n += rows
        while n >= batch_size:
            merged = _concat(pending)
            yield {k: v[:batch_size] for k, v in merged.items()}
            n -= batch_size
            pending = [{k: v[batch_size:] for k, v in merged.items()}] if n else []
    if n and not drop_remainder:
        yield _concat(pending)


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

    return no_autoshard(tf.data.Dataset.from_generator(generate, output_signature=sig))


def parquet_dataset(files, columns=None, batch_size: int = 1024, drop_remainder: bool = False,
                    output_signature=None, uneven: str | None = "drop"):
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

    With the files of :func:`~tfos.data.rank_files` every rank yields the same number of batches
    whatever its files hold (``uneven``: ``"drop"``, ``"pad"``, ``"error"`` or None; see
    :mod:`tfos.data.equal`).
    """
    import pyarrow.parquet as pq

    rank_shard, files = files, _file_list(files)
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

    ds = _arrow_dataset(batches, batch_size, drop_remainder, output_signature, "parquet")
    return _equal_steps(ds, rank_shard, lambda: equal.count_parquet(files), batch_size, drop_remainder, uneven)


def _equal_steps(ds, rank_shard, count, batch_size: int, drop_remainder: bool, policy):
    """``ds`` with equal steps on every rank when ``rank_shard`` came from rank_files (tfos.data.equal)."""
    if not equal.applies(rank_shard, batch_size, policy):
        return ds
    own = count()
    return equal.equalize(ds, rank_shard, own // batch_size * batch_size if drop_remainder else own, batch_size,
                          policy)


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
                delimiter: str = ",", drop_remainder: bool = False, output_signature=None, uneven: str | None = "drop"):
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

    Equal steps on every rank for the files of :func:`~tfos.data.rank_files` as in
    :func:`parquet_dataset` (CSV files are read once more to count their rows).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rank_shard, files = files, _file_list(files)
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

    ds = _arrow_dataset(batches, batch_size, drop_remainder, output_signature, "csv")
    return _equal_steps(ds, rank_shard, lambda: sum(b.num_rows for _, b in batches()), batch_size, drop_remainder,
                        uneven)
