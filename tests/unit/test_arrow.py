"""tfos.wire.arrow: rows <-> Arrow batches and the Arrow -> numpy column converter (pure, no Spark)."""

import numpy as np
import pyarrow as pa
import pytest

from tfos.errors import ConfigError, FeedError
from tfos.wire import arrow as A
from tfos.wire import channel as C


def test_tuple_rows_with_vectors_become_fixed_size_lists_and_back():
    rows = [(np.arange(6, dtype=np.float32).reshape(2, 3) + i, i, f"s{i}") for i in range(5)]
    b = A.rows_to_batch(rows)
    assert pa.types.is_fixed_size_list(b.column(0).type) and b.column(0).type.list_size == 6
    x = A.column_to_numpy(b.column(0), b.schema.field(0))
    assert x.shape == (5, 2, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(x[3], rows[3][0])
    back = A.batch_to_rows(A.from_ipc(A.to_ipc(b)))
    assert [r[1] for r in back] == list(range(5)) and back[2][2] == "s2"


def test_dict_and_scalar_rows_keep_their_shape():
    d = A.batch_to_rows(A.rows_to_batch([{"a": 1, "b": [1.0, 2.0]}, {"a": 2, "b": [3.0, 4.0]}]))
    assert d[1]["a"] == 2 and list(d[1]["b"]) == [3.0, 4.0]
    assert A.batch_to_rows(A.rows_to_batch([1.5, 2.5])) == [1.5, 2.5]


def test_input_mapping():
    b = A.rows_to_batch([{"img": [1, 2], "label": 0}, {"img": [3, 4], "label": 1}])
    m = A.batch_to_rows(b, {"img": "x", "label": "y"})
    assert list(m["y"]) == [0, 1] and list(m["x"][1]) == [3, 4]


@pytest.mark.parametrize("rows,match", [
    ([(np.zeros(3), 1), (np.zeros(4), 2), (np.zeros(3), 3)], r"partition 7, row 11, column '_0' \(position 0\): expected shape \(3,\), got \(4,\)"),
    ([(np.zeros(3), 1), (np.zeros(3), "x")], r"partition 7, row 11, column '_1' \(position 1\): expected int, got str"),
    ([(1, 2), (1, 2, 3)], r"partition 7, row 11: expected 2 fields, got 3"),
    ([{"a": 1}, {"b": 1}], r"partition 7, row 11: expected keys \['a'\], got \['b'\]"),
    ([(1, 2), 5], r"partition 7, row 11: expected a tuple row"),
])
def test_bad_rows_name_partition_row_and_column(rows, match):
    with pytest.raises(FeedError, match=match):
        A.rows_to_batch(rows, partition=7, first_row=10)


def test_variable_lists_from_dataframes_must_be_uniform_to_batch():
    col = pa.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(A.column_to_numpy(col, pa.field("f", col.type)), [[1, 2], [3, 4]])
    ragged = pa.array([[1.0], [3.0, 4.0]])
    with pytest.raises(FeedError, match="different lengths"):
        A.column_to_numpy(ragged, pa.field("f", ragged.type))


@pytest.mark.parametrize("results,expected,types", [
    ([1, 2, 3], [1, 2, 3], [int] * 3),
    ([[1, 2], [3]], [[1, 2], [3]], [list] * 2),
    (np.array([0.5, 1.5]), [0.5, 1.5], [np.float64] * 2),
    (np.array([[1, 2], [3, 4]], np.float32), [[1.0, 2.0], [3.0, 4.0]], [np.ndarray] * 2),
    ([np.int64(4), np.int64(2)], [4, 2], [np.int64] * 2),
    ([np.zeros((2, 3)), np.ones((2, 3))], [np.zeros((2, 3)), np.ones((2, 3))], [np.ndarray] * 2),
    ([{"p": np.int64(1)}, {"p": 2}], [{"p": 1}, {"p": 2}], [dict] * 2),
    (["a", "b"], ["a", "b"], [str] * 2),
    ([np.float32(4), 2.5], [4.0, 2.5], [float] * 2),
    ([np.zeros(2), np.zeros(3)], [[0.0] * 2, [0.0] * 3], [list] * 2),   # ragged arrays: lists
    ([np.zeros(0), np.zeros(0)], [[], []], [list] * 2),                 # zero-width rows
    ([np.zeros(2, np.float32), np.zeros(2)], [[0.0] * 2] * 2, [list] * 2),  # dtypes differ
])
def test_results_come_back_as_given(results, expected, types):
    """TensorFlowOnSpark returned main_fun's objects: numpy stays numpy (with its dtype and row
    shape), Python values stay Python, through one Arrow batch and its IPC frame."""
    back = A.batch_to_results(A.from_ipc(A.to_ipc(A.results_to_batch(results))))
    assert [type(v) for v in back] == types
    for got, want in zip(back, expected):
        np.testing.assert_array_equal(got, want)
    if types[0] is np.ndarray:
        assert back[0].shape == np.asarray(expected[0]).shape


# --------------------------------------------------------------------------- column_to_numpy

def _shaped(values, shape):
    flat = pa.array(np.asarray(values, np.float32).reshape(-1))
    arr = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape)))
    return arr, pa.field("img", arr.type, metadata={A.SHAPE: ",".join(map(str, shape)).encode()})


@pytest.mark.parametrize("col,expected", [
    (pa.array([1, 2, 3], pa.int32()), np.array([1, 2, 3], np.int32)),
    (pa.array([0.5, 1.5], pa.float64()), np.array([0.5, 1.5])),
    (pa.array([True, False]), np.array([True, False])),
    (pa.array(["a", "ü"]), np.array(["a", "ü"], dtype=object)),
    (pa.array(["a", "b"], pa.large_string()), np.array(["a", "b"], dtype=object)),
    (pa.array([b"\x00", b""]), np.array([b"\x00", b""], dtype=object)),
    (pa.array([b"x"], pa.large_binary()), np.array([b"x"], dtype=object)),
    (pa.array([b"ab", b"cd"], pa.binary(2)), np.array([b"ab", b"cd"], dtype=object)),
    (pa.array(["x", "y", "x"]).dictionary_encode(), np.array(["x", "y", "x"], dtype=object)),
    (pa.array([[1, 2], [3, 4]], pa.list_(pa.int64())), np.array([[1, 2], [3, 4]])),
    (pa.array([[1, 2], [3, 4]], pa.large_list(pa.int64())), np.array([[1, 2], [3, 4]])),
    (pa.array([[[1], [2]], [[3], [4]]], pa.list_(pa.list_(pa.int8()))), np.array([[[1], [2]], [[3], [4]]], np.int8)),
    (pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float32(), 3)), np.array([[1, 2, 3]], np.float32)),
    (pa.array([["a", "b"]], pa.list_(pa.string())), np.array([["a", "b"]], dtype=object)),
    (pa.array([[], []], pa.list_(pa.int64())), np.zeros((2, 0), np.int64)),
    (pa.array([], pa.list_(pa.int64())), np.zeros((0, 0), np.int64)),
    (pa.array([[9], [1, 2], [3, 4]], pa.list_(pa.int64())).slice(1), np.array([[1, 2], [3, 4]])),
])
def test_column_to_numpy_table(col, expected):
    got = A.column_to_numpy(col, "c")
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert [type(v) for v in got.reshape(-1)] == [type(v) for v in expected.reshape(-1)]
    np.testing.assert_array_equal(got, expected)
    assert A.column_to_numpy(col, pa.field("c", col.type)).shape == expected.shape  # a field works too


def test_column_to_numpy_restores_nd_rows_from_shape_metadata():
    values = np.arange(12).reshape(2, 2, 3)
    col, field = _shaped(values, (2, 3))
    got = A.column_to_numpy(col, field)
    assert got.shape == (2, 2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, values)
    assert A.column_to_numpy(col, "img").shape == (2, 6)  # without the metadata: (rows, list_size)
    assert A.column_to_numpy(col.slice(1), field).shape == (1, 2, 3)
    bad = pa.field("img", col.type, metadata={A.SHAPE: b"4,2"})
    with pytest.raises(FeedError, match=r"'img'.*tfos.shape"):
        A.column_to_numpy(col, bad)


@pytest.mark.parametrize("col,error,match", [
    (pa.array([1.0, None]), FeedError, r"column 'c' has 1 null value"),
    (pa.array(["a", None]), FeedError, r"column 'c' has 1 null value"),
    (pa.array([[1.0], None]), FeedError, r"column 'c' has 1 null value"),
    (pa.array([[1.0, None]]), FeedError, r"column 'c' has 1 null value"),  # a null inside a list
    (pa.array(["x", None]).dictionary_encode(), FeedError, r"column 'c' has 1 null value"),
    (pa.array([[1], [1, 2, 3], [4, 5]]), FeedError, r"column 'c' holds lists of different lengths \(1\.\.3\)"),
    (pa.array([[[1], [1, 2]]]), FeedError, r"column 'c' holds lists of different lengths \(1\.\.2\)"),
    (pa.array([0], pa.timestamp("s")), ConfigError, r"column 'c' has Arrow type timestamp.*timestamps/dates to long"),
    (pa.array([1], pa.decimal128(5, 2)), ConfigError, r"column 'c' has Arrow type decimal.*decimals to double"),
    (pa.array([{"a": 1}]), ConfigError, r"column 'c' has Arrow type struct.*structs to separate columns"),
])
def test_column_to_numpy_errors_name_the_column(col, error, match):
    with pytest.raises(error, match=match):
        A.column_to_numpy(col, pa.field("c", col.type))


def test_multi_dimensional_results_cast_to_nested_spark_arrays():
    """DataFrame inference casts the results column to the output type: 2-D rows must become
    list<list<...>>, which needs one Arrow list level per dimension."""
    batch = A.results_to_batch(np.arange(12, dtype=np.float32).reshape(2, 2, 3))
    cast = batch.column(0).cast(pa.list_(pa.list_(pa.float32())))
    assert cast.to_pylist() == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]
    back = A.batch_to_results(batch)
    assert back[1].shape == (2, 3) and back[1].dtype == np.float32 and back[1][1, 2] == 11


def test_results_that_fit_no_column_type_fail_clearly():
    with pytest.raises(FeedError, match="int64, str.*same type"):
        A.results_to_batch([np.int64(1), "a"])


def test_a_batch_spanning_two_chunks_is_joined_into_aligned_memory():
    """TensorFlow takes a 64-byte-aligned array without a copy; numpy's own concatenation is not
    aligned that far (a batch of rows from two chunks in dataset())."""
    import numpy as np

    from tfos.feed.node.datafeed import _concatenate

    for _ in range(20):  # allocations land at various addresses
        parts = [np.arange(7 * 3, dtype="float32").reshape(7, 3), np.arange(5 * 3, dtype="float32").reshape(5, 3)]
        out = _concatenate(parts)
        assert out.ctypes.data % 64 == 0 and out.flags.c_contiguous
        assert np.array_equal(out, np.concatenate(parts))
    strings = [np.array([b"a", b"bc"], dtype=object), np.array([b"d"], dtype=object)]
    assert list(_concatenate(strings)) == [b"a", b"bc", b"d"]



def _fed_hub(chunks):
    """A hub whose input queue holds ``chunks`` (record batches) as one train feed, then its end."""
    from tfos.feed.node.hub import Data, End, FeedHub, Origin

    hub = FeedHub(C.new_key())
    q, origin = hub.queue("input"), Origin(None, train=True)
    for c in chunks:
        q.q.put(Data(c, origin, "f"))
    q.q.put(End("f", sum(c.num_rows for c in chunks)))
    return hub


def _three_chunks():
    """1000 rows of (8 floats, id) in chunks of 400, 400 and 200: batches of 64 span chunks."""
    x = np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8)
    return x, [A.rows_to_batch([(x[i], i) for i in range(lo, min(lo + 400, 1000))]) for lo in (0, 400, 800)]


def test_dataset_blocks_are_views_of_the_chunks_but_a_batch_that_spans_two():
    """feed.dataset()'s items: a chunk's whole batches are one view of its Arrow buffer; only a
    batch that spans two chunks is joined (a copy), as the first part of the next chunk's item (one
    item per chunk); every row once, in order."""
    from tfos.feed.node.datafeed import DataFeed

    x, chunks = _three_chunks()
    hub = _fed_hub(chunks)
    items = [parts for _schema, parts in DataFeed(hub)._blocks(64)]
    assert [[p[0].shape[:2] for p in parts] for parts in items] == [
        [(6, 64)], [(1, 64), (5, 64)], [(1, 64), (2, 64)], [(1, 40)]]
    blocks = [p for parts in items for p in parts]
    np.testing.assert_array_equal(np.concatenate([b[0].reshape(-1, 8) for b in blocks]), x)
    np.testing.assert_array_equal(np.concatenate([b[1].reshape(-1) for b in blocks]), np.arange(1000))
    sources = [A.column_to_numpy(c.column(0), c.schema.field(0)) for c in chunks]
    views = [any(np.shares_memory(b[0], src) for src in sources) for b in blocks]
    assert views == [True, False, True, False, True, True]


def test_dataset_blocks_keep_every_row_when_a_chunks_rest_comes_short():
    """If the whole batches _blocks counted on in a chunk come short (a feed cut meanwhile), the
    joined batch and the rest go as items of their own: no part is dropped, rows stay in order."""
    from tfos.feed.node.datafeed import DataFeed

    class Cut(DataFeed):
        def _take(self, n, admitted=False):
            return super()._take(n - 10 if admitted else n, admitted)  # 10 rows fewer than counted on

    _x, chunks = _three_chunks()
    hub = _fed_hub(chunks)
    items = [parts for _schema, parts in Cut(hub)._blocks(64)]
    assert all(len(parts) <= 2 for parts in items)
    labels = np.concatenate([p[1].reshape(-1) for parts in items for p in parts])
    np.testing.assert_array_equal(labels, np.arange(1000))


@pytest.mark.parametrize("rows", [
    [(np.full(3, i, np.float32), i) for i in range(250)],  # (x, y)
    [(np.full(3, i, np.float32),) for i in range(250)],  # a 1-tuple stays a 1-tuple
    [{"x": np.full(3, i, np.float32), "y": i} for i in range(250)],  # dicts
    [float(i) for i in range(250)],  # single values
])
def test_dataset_yields_the_batches_of_batches_in_their_structure(rows):
    """feed.dataset() slices blocks of whole batches in TF: the same batches, in the same
    structure (tuple, 1-tuple, dict, single tensor), as feed.batches()."""
    tf = pytest.importorskip("tensorflow")
    from tfos.feed.node.datafeed import DataFeed

    def feed():  # chunks of 100 rows: batches of 32 span chunks
        return DataFeed(_fed_hub([A.rows_to_batch(rows[lo:lo + 100]) for lo in range(0, len(rows), 100)]))

    expected = list(feed().batches(32))
    got = list(feed().dataset(32).as_numpy_iterator())
    assert [len(tf.nest.flatten(b)[0]) for b in got] == [32] * 7 + [26]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is type(e)
        tf.nest.assert_same_structure(g, e)
        for a, b in zip(tf.nest.flatten(g), tf.nest.flatten(e)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows,dtypes", [
    ([(np.full(3, i, np.float32), i) for i in range(150)], {0: "float16"}),  # tuple: by position
    ([{"x": np.full(3, i, np.float32), "y": i} for i in range(150)], {"y": "int32"}),  # dict: by name
    ([float(i) for i in range(150)], {0: "float32"}),  # a single value
])
def test_dataset_casts_the_columns_named_in_dtypes_and_keeps_the_structure(rows, dtypes):
    tf = pytest.importorskip("tensorflow")
    from tfos.feed.node.datafeed import DataFeed

    hub = _fed_hub([A.rows_to_batch(rows[lo:lo + 100]) for lo in range(0, len(rows), 100)])
    got = list(DataFeed(hub).dataset(64, dtypes={k: tf.as_dtype(v) for k, v in dtypes.items()}).as_numpy_iterator())
    assert [len(tf.nest.flatten(b)[0]) for b in got] == [64, 64, 22]
    first = got[0]
    for key, dtype in dtypes.items():
        column = first if not isinstance(first, (tuple, dict)) else first[key]
        assert column.dtype == np.dtype(dtype)
    values = np.concatenate([tf.nest.flatten(b)[0] for b in got])
    np.testing.assert_array_equal(values.reshape(150, -1)[:, 0], np.arange(150))
