"""Python rows and numpy columns <-> Arrow record batches and IPC frames (no TensorFlow, no pickle).

Runs in the feeding Spark tasks (rows -> batches, :func:`rows_to_batch`), in the TF process
(batches -> rows or numpy columns: the feed consumer, the ``tfos.data`` readers) and in the
inference Spark tasks (results -> batches). Row shapes are remembered in the schema metadata key
``tfos.row``: ``tuple`` (tuples, lists, pyspark Rows), ``dict``, or ``scalar`` (anything else, one
column); the per-row shape of a vector column in the field metadata key ``tfos.shape``.

:func:`column_to_numpy` is the library's one Arrow -> numpy column converter.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from tfos.errors import ConfigError, FeedError, ProtocolError
from tfos.wire import messages as M
from tfos.wire.schema import column_drift

__all__ = ["ROW_KIND", "SHAPE", "rows_to_batch", "batch_to_rows", "column_to_numpy", "to_ipc", "from_ipc",
           "results_to_batch", "batch_to_results", "schema_drift", "columns", "body_compressed"]

ROW_KIND = b"tfos.row"
SHAPE = b"tfos.shape"


def _row_kind(row) -> str:
    if isinstance(row, dict):
        return "dict"
    if isinstance(row, (tuple, list)):
        return "tuple"
    return "scalar"


def _columns(rows, kind: str):
    first = rows[0]
    if kind == "dict":
        names = list(first.keys())
        if any(len(r) != len(names) for r in rows):
            raise KeyError("keys differ")
        return names, [[r[k] for r in rows] for k in names]
    if kind == "tuple":
        names = list(getattr(first, "__fields__", None) or [f"_{j}" for j in range(len(first))])
        width = len(first)
        if any(len(r) != width for r in rows):
            raise IndexError("widths differ")
        return names, [[r[j] for r in rows] for j in range(width)]
    return ["_0"], [rows]


def _stacked(values, alloc):
    """Rows of ndarrays of one shape and dtype stacked into the memory ``alloc(nbytes)`` gives (a
    uint8 array), or None when it gives none or a row differs (the caller stacks them itself)."""
    first = values[0]
    shape = (len(values),) + first.shape
    out = alloc(int(np.prod(shape)) * first.dtype.itemsize) if first.dtype.kind in "biuf" and first.ndim else None
    try:  # another shape or dtype: converted as usual, which says where
        return None if out is None else np.stack(values, out=out.view(first.dtype).reshape(shape), casting="no")
    except (ValueError, TypeError):
        return None


def _to_array(values, alloc=None):
    """One column of Python values -> (pa.Array, per-row shape or None); a column of ndarrays is
    stacked into ``alloc``'s memory when it gives some."""
    first = values[0]
    if isinstance(first, (np.ndarray, list, tuple)):
        arr = _stacked(values, alloc) if alloc is not None and isinstance(first, np.ndarray) else None
        if arr is None:
            arr = np.asarray(values) if not isinstance(first, np.ndarray) else np.stack(values)
        if arr.dtype == object or arr.ndim < 2 or arr.dtype.kind not in "biuf":
            raise ValueError("ragged or non-numeric vectors")
        shape = arr.shape[1:]
        flat = np.ascontiguousarray(arr).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat), int(np.prod(shape))), shape
    if isinstance(first, (bytes, bytearray)):
        return pa.array(values, type=pa.binary()), None
    if isinstance(first, str):
        return pa.array(values, type=pa.string()), None
    arr = np.asarray(values)
    if arr.dtype == object or arr.ndim != 1 or arr.dtype.kind not in "biuf":
        raise ValueError("mixed or non-scalar values")
    return pa.array(arr), None


def rows_to_batch(rows: list, partition: int = -1, first_row: int = 0, alloc=None) -> pa.RecordBatch:
    """Convert a chunk of rows of one shape into a record batch; its first column of ndarrays
    goes into the memory ``alloc(nbytes)`` gives, if it gives some (a uint8 array: a slot of a
    shared-memory ring, so the column is written once, where the TF process reads it).

    Raises FeedError naming the partition, the row index within the partition and the column
    when a row does not match the first row's layout or a value cannot be converted.
    """
    kind = _row_kind(rows[0])
    try:
        names, cols = _columns(rows, kind)
    except (KeyError, IndexError, TypeError):
        bad = _find_bad_row(rows, kind)
        raise FeedError(f"partition {partition}, row {first_row + bad[0]}: {bad[1]}") from None
    arrays, fields = [], []
    for j, (name, values) in enumerate(zip(names, cols)):
        try:
            arr, shape = _to_array(values, alloc)
            if shape is not None:
                alloc = None  # one staged column per chunk
        except (ValueError, TypeError, pa.ArrowException) as e:
            i, why = _find_bad_value(values)
            raise FeedError(f"partition {partition}, row {first_row + i}, column {name!r} (position {j}): {why or e}") from None
        meta = {SHAPE: ",".join(map(str, shape)).encode()} if shape is not None else None
        fields.append(pa.field(name, arr.type, metadata=meta))
        arrays.append(arr)
    schema = pa.schema(fields, metadata={ROW_KIND: kind.encode()})
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"ndarray{v.shape} of {v.dtype}"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__} of length {len(v)}"
    return type(v).__name__


def _find_bad_row(rows, kind):
    ref = rows[0]
    for i, r in enumerate(rows):
        if _row_kind(r) != kind:
            return i, f"expected a {kind} row like row 0, got {_describe(r)}"
        if kind == "tuple" and len(r) != len(ref):
            return i, f"expected {len(ref)} fields, got {len(r)}"
        if kind == "dict" and set(r) != set(ref):
            return i, f"expected keys {sorted(ref)}, got {sorted(r)}"
    return 0, "rows could not be split into columns"


def _find_bad_value(values):
    ref = values[0]
    for i, v in enumerate(values):
        if isinstance(ref, (np.ndarray, list, tuple)):
            if not isinstance(v, (np.ndarray, list, tuple)):
                return i, f"expected {_describe(ref)}, got {_describe(v)}"
            if np.shape(v) != np.shape(ref):
                return i, f"expected shape {np.shape(ref)}, got {np.shape(v)}"
            try:
                np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                return i, f"non-numeric vector: {_describe(v)}"
        elif type(v) is not type(ref) and not (isinstance(v, (int, float, np.number)) and
                                                isinstance(ref, (int, float, np.number)) and
                                                not isinstance(v, bool)):
            return i, f"expected {type(ref).__name__}, got {_describe(v)}"
    return 0, None


# --------------------------------------------------------------------------- Arrow column -> numpy

def column_to_numpy(col: pa.Array, field_or_name) -> np.ndarray:
    """One Arrow column -> a numpy array of shape ``(rows, ...)``, without per-row Python work.

    ``field_or_name`` is the column's ``pa.Field`` (its ``tfos.shape`` metadata, written by
    :func:`rows_to_batch`, restores N-D rows) or just its name (used in error messages).

    * nulls: :class:`~tfos.errors.FeedError` naming the column (tensors cannot hold nulls);
    * dictionary-encoded columns are decoded first;
    * fixed-size lists: ``(rows, *tfos.shape)`` if the field has that metadata, else
      ``(rows, list_size, ...)``;
    * lists / large lists of one uniform length: ``(rows, width, ...)``; lists of different
      lengths raise FeedError naming the column and the length range;
    * strings: object array of ``str``; binaries (also large and fixed-size): object array of ``bytes``;
    * integers, floats, booleans: arrays of that dtype;
    * anything else (timestamps, decimals, structs, ...): :class:`~tfos.errors.ConfigError`
      saying how to cast it.
    """
    if isinstance(field_or_name, pa.Field):
        shape = (field_or_name.metadata or {}).get(SHAPE)
        row_shape = tuple(int(s) for s in shape.decode().split(",")) if shape else None
        return _to_numpy(col, field_or_name.name, row_shape)
    return _to_numpy(col, str(field_or_name), None)


def _to_numpy(arr: pa.Array, name: str, row_shape) -> np.ndarray:
    t = arr.type
    if arr.null_count:
        raise FeedError(f"column {name!r} has {arr.null_count} null value(s); tensors cannot hold nulls. "
                        "Fill or drop them first (df.fillna / df.dropna), or leave the column out.")
    if pa.types.is_dictionary(t):
        return _to_numpy(arr.dictionary_decode(), name, row_shape)
    if pa.types.is_fixed_size_list(t):
        inner = _to_numpy(arr.flatten(), name, None)
        per_row = (t.list_size,) + inner.shape[1:]
        if row_shape is not None:
            if int(np.prod(row_shape)) != int(np.prod(per_row)):
                raise FeedError(f"column {name!r}: its tfos.shape metadata {row_shape} does not match its "
                                f"{int(np.prod(per_row))} values per row")
            per_row = row_shape
        return inner.reshape((len(arr),) + tuple(per_row))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.diff(np.asarray(arr.offsets))
        if len(lengths) and not np.all(lengths == lengths[0]):
            raise FeedError(f"column {name!r} holds lists of different lengths ({int(lengths.min())}.."
                            f"{int(lengths.max())}); a batch of them is not a tensor. Pad or cut them to one "
                            "length first, or store them as TFRecords and parse with "
                            "tf.io.VarLenFeature / RaggedFeature.")
        inner = _to_numpy(arr.flatten(), name, None)
        width = int(lengths[0]) if len(lengths) else 0
        return inner.reshape((len(arr), width) + inner.shape[1:])
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return arr.to_numpy(zero_copy_only=False)
    raise ConfigError(f"column {name!r} has Arrow type {t}, which has no tensor equivalent here. Cast it first "
                      "(timestamps/dates to long, decimals to double, Spark ML vectors to arrays with "
                      "pyspark.ml.functions.vector_to_array, structs to separate columns) or leave it out "
                      "(columns=[...] in the tfos.data readers).")


def batch_to_rows(batch: pa.RecordBatch, input_mapping: dict | None = None):
    """Record batch -> Python rows in their original shape (TensorFlowOnSpark next_batch format).

    With ``input_mapping`` ({column: tensor_name}) returns {tensor_name: [values]} instead.
    """
    kind = (batch.schema.metadata or {}).get(ROW_KIND, b"tuple").decode()
    cols = [column_to_numpy(batch.column(j), batch.schema.field(j)) for j in range(batch.num_columns)]
    if input_mapping:
        names = batch.schema.names
        return {tensor: list(cols[names.index(col)]) for col, tensor in input_mapping.items()}
    if kind == "scalar":
        return list(cols[0])
    if kind == "dict":
        names = batch.schema.names
        return [dict(zip(names, vals)) for vals in zip(*cols)]
    return [tuple(vals) for vals in zip(*cols)]


# --------------------------------------------------------------------------- IPC frames and results

def to_ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue()


class _Gather:
    """A write-only file for pyarrow's IPC writer that keeps what it is given instead of copying
    it: the body buffers arrive as ``pyarrow.Buffer`` views of the batch's own memory."""

    closed = False

    def __init__(self):
        self.parts: list = []

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n:
            self.parts.append(data)
        return n

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def ipc_parts(batch: pa.RecordBatch) -> list:
    """The Arrow IPC stream of ``batch`` (the bytes :func:`to_ipc` makes) as a list of buffers to
    send one after the other, without copying the batch: its column buffers are in the list as
    views of its memory; the small pieces between them (message headers, padding) are joined."""
    sink = _Gather()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema) as w:
        w.write_batch(batch)
    parts, small = [], []
    for part in sink.parts:
        if isinstance(part, bytes):
            small.append(part)
            continue
        if small:
            parts.append(b"".join(small))
            small = []
        parts.append(part)
    if small:
        parts.append(b"".join(small))
    return parts


def _field_pos(buf: bytes, table: int, index: int) -> int | None:
    """Position of field ``index`` of the flatbuffer table at ``table``, None when absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    (vtable_size,) = struct.unpack_from("<H", buf, vtable)
    slot = vtable + 4 + 2 * index
    if slot + 2 > vtable + vtable_size:
        return None
    (offset,) = struct.unpack_from("<H", buf, slot)
    return table + offset if offset else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + struct.unpack_from("<I", buf, pos)[0]


def body_compressed(metadata: bytes) -> bool:
    """Pure: whether an Arrow IPC message (its flatbuffer metadata) carries a compressed body.

    Message { version: 0, header_type: 1, header: 2, ... }; RecordBatch { ..., compression: 3 };
    DictionaryBatch { id: 0, data: RecordBatch 1, ... }. Raises struct.error/IndexError on garbage.
    """
    root = _deref(metadata, 0)
    type_pos, header_pos = _field_pos(metadata, root, 1), _field_pos(metadata, root, 2)
    header_type = metadata[type_pos] if type_pos is not None else 0
    if header_pos is None or header_type not in (2, 3):
        return False
    header = _deref(metadata, header_pos)
    if header_type == 2:
        data = _field_pos(metadata, header, 1)
        if data is None:
            return False
        header = _deref(metadata, data)
    return _field_pos(metadata, header, 3) is not None


def from_ipc(data) -> pa.RecordBatch:
    """One Arrow IPC stream (a tfos data frame) -> one record batch.

    The stream's size is already bounded by the channel; compressed bodies are refused before
    anything is decompressed (tfos never compresses, and a few KiB of compressed zeros could
    expand to gigabytes), as is anything that is not an Arrow IPC stream (ProtocolError)."""
    buf = pa.py_buffer(data)
    try:
        reader = pa.BufferReader(buf)
        while True:
            try:
                message = pa.ipc.read_message(reader)
            except EOFError:
                break
            if message is None:
                break
            if body_compressed(message.metadata.to_pybytes()):
                raise ProtocolError("compressed Arrow IPC frames are not accepted (tfos senders never compress)")
        reader = pa.ipc.open_stream(buf)
        batches = list(reader)
    except ProtocolError:
        raise
    except (pa.ArrowException, ValueError, struct.error, IndexError, OSError) as e:
        raise ProtocolError(f"data frame is not an Arrow IPC stream: {str(e)[:200]}") from None
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=reader.schema)
    return pa.Table.from_batches(batches, schema=reader.schema).combine_chunks().to_batches()[0]


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    return str(t)


def columns(schema: pa.Schema) -> tuple[M.Column, ...]:
    """The typed description of ``schema`` that the driver compares between partitions."""
    return tuple(M.Column(f.name, _kind(f.type), str(f.type), ((f.metadata or {}).get(SHAPE) or b"").decode())
                 for f in schema)


def schema_drift(first: pa.Schema, schema: pa.Schema) -> str | None:
    """How ``schema`` differs from the ``first`` schema of the same feed, or None (see
    :func:`tfos.wire.schema.column_drift`)."""
    if first.equals(schema, check_metadata=True):  # the common case: one comparison, no Python loop
        return None
    return column_drift(columns(first), columns(schema))


RESULT_KIND = b"tfos.result"


def _nested(arr: np.ndarray) -> pa.Array:
    """(n, d1, d2, ...) -> fixed-size lists nested one level per dimension (casts to list<list<...>>)."""
    out = pa.array(np.ascontiguousarray(arr).reshape(-1))
    for d in reversed(arr.shape[1:]):
        out = pa.FixedSizeListArray.from_arrays(out, int(d))
    return out


def _uniform_numpy(results: list):
    """The results as one numpy array if they are all numpy values of one type, dtype and shape
    (scalars, or arrays with at least one value); else None."""
    first = results[0]
    if isinstance(first, np.generic):
        if all(type(r) is type(first) for r in results):
            return np.asarray(results)
        return None
    if isinstance(first, np.ndarray) and first.size and all(
            isinstance(r, np.ndarray) and r.dtype == first.dtype and r.shape == first.shape for r in results):
        return np.stack(results)
    return None


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) else (v.item() if isinstance(v, np.generic) else v)


def results_to_batch(results) -> pa.RecordBatch:
    """Inference results (one per row) -> a one-column record batch that remembers what they were.

    The field metadata key ``tfos.result`` says how :func:`batch_to_results` gives them back, so
    main_fun's values come back as they were given (TensorFlowOnSpark handed back the pickled
    objects): ``numpy`` (numpy scalars, or a 1-D array: one scalar per row), ``ndarray`` (numpy
    arrays of one shape, or an N-D array: one row each; the row shape in ``tfos.shape``), or
    ``python`` (anything else: Python scalars, lists, dicts, mixed or ragged values, as Python
    values; numpy inside lists and dicts becomes Python). Numpy kinds need every result of the
    call to be numpy of one type, dtype and shape.
    """
    if isinstance(results, np.ndarray) and results.dtype != object and (results.ndim < 2 or results[0].size):
        values = results
    else:
        results = list(results)
        values = _uniform_numpy(results) if results else None
    if values is not None and values.dtype.kind in "biufSU":
        if values.ndim >= 2:
            arr = _nested(values)
            meta = {RESULT_KIND: b"ndarray", SHAPE: ",".join(map(str, values.shape[1:])).encode()}
        else:
            arr = pa.array(values)
            meta = {RESULT_KIND: b"numpy"}
    else:
        items = values if values is not None else results
        try:
            arr = pa.array([{k: _plain(x) for k, x in r.items()} if isinstance(r, dict) else _plain(r) for r in items])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            kinds = sorted({type(r).__name__ for r in items})
            raise FeedError(f"batch_results: the results ({', '.join(kinds)}) do not fit one column type ({e}); "
                            "give every row's result the same type and shape") from None
        meta = {RESULT_KIND: b"python"}
    return pa.RecordBatch.from_arrays([arr], schema=pa.schema([pa.field("result", arr.type, metadata=meta)]))


def batch_to_results(batch: pa.RecordBatch) -> list:
    """The inverse of :func:`results_to_batch`: one value per row, numpy where main_fun gave numpy."""
    field = batch.schema.field(0)
    kind = (field.metadata or {}).get(RESULT_KIND, b"python")
    if kind in (b"numpy", b"ndarray"):
        return list(column_to_numpy(batch.column(0), field))
    return batch.column(0).to_pylist()
