"""Equal steps for InputMode.TENSORFLOW readers (tfos.data.equal): record counting (TFRecord headers,
the counts save_as_tfrecords leaves, Parquet footers) and the policies on real tf.data pipelines.
The other ranks' counts come from ``ctx.all_gather``, played here by a stand-in that answers with
given counts; tests/integration/test_hang_free.py runs the same through the driver."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tfos import data
from tfos.data import equal
from tfos.data.sharding import RankFiles
from tfos.data.tfrecord import tfrecord_frame
from tfos.errors import FeedError, UnevenDataError


class Ctx:
    """rank 0 of ``len(counts)``; all_gather answers with ``counts`` (this rank's own value first)."""

    def __init__(self, counts):
        self.rank, self.num_workers, self.counts, self.reported = 0, len(counts), list(counts), {}

    def all_gather(self, key, value):
        assert value == self.counts[0], (value, self.counts)
        return self.counts

    def report(self, **values):
        self.reported.update(values)


def _tfrecords(path, n, start=0):
    with open(path, "wb") as f:
        for i in range(start, start + n):
            f.write(tfrecord_frame(data.encode_example({"x": float(i)})))
    return str(path)


def test_count_tfrecords_by_headers_and_from_save_as_tfrecords_counts(tmp_path):
    a, b = _tfrecords(tmp_path / "a.tfrecord", 37), _tfrecords(tmp_path / "b.tfrecord", 5)
    assert equal.count_tfrecords([a, b]) == 42
    (tmp_path / equal.COUNTS_FILE).write_text(json.dumps({"a.tfrecord": 1000}))  # trusted when present
    assert equal.count_tfrecords([a, b]) == 1005
    (tmp_path / "c.tfrecord").write_bytes(open(a, "rb").read()[:-3])
    with pytest.raises(FeedError, match="truncated TFRecord"):
        equal.count_tfrecords([str(tmp_path / "c.tfrecord")])


@pytest.mark.parametrize("counts,uneven,steps,last", [
    ((95, 37), "drop", 4, 10), ((37, 95), "drop", 4, 7), ((95, 37), "pad", 10, 10), ((40, 37), "error", 4, 10),
])
def test_tfrecord_reader_gives_every_rank_the_fewest_or_most_steps(tmp_path, counts, uneven, steps, last):
    tf = pytest.importorskip("tensorflow")
    files = RankFiles([_tfrecords(tmp_path / "mine.tfrecord", counts[0])], Ctx(counts))
    ds = data.tfrecord_dataset(files, features={"x": tf.io.FixedLenFeature([], tf.float32)}, batch_size=10,
                               uneven=uneven)
    batches = list(ds.as_numpy_iterator())
    assert len(batches) == steps and len(batches[-1]["x"]) == last
    if uneven == "pad":
        w = np.concatenate([b["sample_weight"] for b in batches])
        assert w.sum() == counts[0] and len(w) == steps * 10 and files.ctx.reported["rows_padded"] == 100 - counts[0]
    elif uneven == "drop":
        assert files.ctx.reported["rows_dropped"] == max(0, counts[0] - steps * 10)


def test_error_raises_before_the_first_step_naming_every_rank(tmp_path):
    pytest.importorskip("tensorflow")
    files = RankFiles([_tfrecords(tmp_path / "mine.tfrecord", 95)], Ctx((95, 37)))
    with pytest.raises(UnevenDataError, match="node 0: 95 rows = 10 steps, node 1: 37 rows = 4 steps"):
        data.tfrecord_dataset(files, batch_size=10, uneven="error")


def test_parquet_reader_counts_from_footers_and_drops_to_the_fewest_steps(tmp_path):
    pytest.importorskip("tensorflow")
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"x": np.arange(250, dtype=np.float32)}), path, row_group_size=64)
    assert equal.count_parquet([str(path)]) == 250
    files = RankFiles([str(path)], Ctx((250, 130)))
    batches = list(data.parquet_dataset(files, batch_size=64).as_numpy_iterator())
    assert [len(b["x"]) for b in batches] == [64, 64, 64]  # ceil(130 / 64) steps
    unequal = list(data.parquet_dataset([str(path)], batch_size=64).as_numpy_iterator())  # a plain list: as before
    assert sum(len(b["x"]) for b in unequal) == 250
