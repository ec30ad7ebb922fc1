"""Where a TF process spends its time reading a feed: the consumer side alone, in one process.

A producer thread puts the same Arrow chunks the feeding tasks send (784 float32 + int64 label,
about 16 MiB each, TARGET_CHUNK_BYTES) into a real FeedHub queue, as the hub's connection threads do after reading a
socket; the main thread reads them through each DataFeed path at each batch size, in the
environment tfos's agent gives a TF process (its malloc settings):

  batches     feed.batches(B), a Python loop counting rows
  dataset     feed.dataset(B), consumed in the graph (Dataset.reduce counting rows)
  dataset-py  feed.dataset(B), a Python `for` loop over the dataset (what eager custom loops do)
  next_batch  feed.next_batch(B) row lists (TensorFlowOnSpark's API), counting rows
  tf-floor    no feed: the same batches already in TF memory (from_tensor_slices of a chunk's whole
              batches, repeated), counted by the same Dataset.reduce: what TF alone costs per batch

Prints rows/s, MB/s, each path's ratio to batches at the same batch size, and the process's
CPU-s per 1M rows (with --rate, the figure that counts: the rows/s is then the producer's).
Run:  bash scripts/bench.sh feed_consumer [--rows N] [--batch 64,256,1024] [--rate ROWS_PER_S] [--profile DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import os
import pstats
import sys
import threading
import time

import numpy as np

ROW_BYTES = 784 * 4 + 8


def make_chunk(rows: int):
    import pyarrow as pa

    from tfos.wire import arrow

    rng = np.random.default_rng(0)
    x = rng.random((rows, 784), dtype=np.float32)
    batch = arrow.rows_to_batch([(x[i], i % 10) for i in range(rows)])
    # in Arrow's own (64-byte aligned) memory, as the channel delivers a frame's columns: TF takes an
    # aligned array as it is and copies an unaligned one (numpy's own allocations are 16-byte aligned)
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


def start_producer(hub, chunk, total_rows: int, feed_id: str, rate: float = 0) -> threading.Thread:
    """Put ``total_rows`` rows of ``chunk`` into the hub's queue, at ``rate`` rows/s (0: as fast as
    the reader takes them)."""
    from tfos.feed.node.hub import Data, End, Origin

    q = hub.queue("input")
    origin = Origin(None, train=True)
    stop = threading.Event()

    def produce():
        sent, t0 = 0, time.perf_counter()
        while sent < total_rows:
            if rate:  # a chunk when the network would have brought it
                time.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
            b = chunk if total_rows - sent >= chunk.num_rows else chunk.slice(0, total_rows - sent)
            q.put(Data(b, origin, feed_id), stop)
            sent += b.num_rows
        q.put(End(feed_id, sent), stop)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    return t


def count_in_graph(ds) -> int:
    """The rows of a dataset of (features, labels) batches, counted in the graph (Dataset.reduce)."""
    import tensorflow as tf

    return int(ds.reduce(tf.constant(0, tf.int64), lambda acc, b: acc + tf.shape(b[1], out_type=tf.int64)[0]))


def consume(path: str, feed, batch: int) -> int:
    import tensorflow as tf

    n = 0
    if path == "batches":
        for _x, labels in feed.batches(batch):
            n += len(labels)
    elif path == "dataset":
        ds = feed.dataset(batch)
        n = count_in_graph(ds)
    elif path == "dataset-py":
        for _x, labels in feed.dataset(batch):
            n += int(labels.shape[0])
    elif path == "next_batch":
        while not feed.should_stop():
            n += len(feed.next_batch(batch))
    else:
        raise ValueError(path)
    return n


def tf_floor(chunk, batch: int, rows: int) -> tuple[float, float]:
    """rows/s and CPU-s per 1M rows of TF alone iterating ``rows`` rows of ready batches (no feed, no
    generator): the chunk's whole batches as tensors, sliced by from_tensor_slices, counted in the
    graph as the ``dataset`` path counts."""
    import tensorflow as tf

    k, width = chunk.num_rows // batch, chunk.column(0).type.list_size
    x = tf.constant(chunk.column(0).flatten().to_numpy()[:k * batch * width].reshape(k, batch, width))
    y = tf.constant(chunk.column(1).to_numpy()[:k * batch].reshape(k, batch))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().take(rows // batch)
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = count_in_graph(ds)
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n / secs, cpu / n * 1e6


def run(path: str, batch: int, rows: int, chunk, profile_dir: str | None, rate: float = 0) -> tuple[float, float]:
    """rows/s, and this process's CPU-s per 1M rows, of one feed read through ``path``."""
    if path == "tf-floor":
        return tf_floor(chunk, batch, rows)
    from tfos.feed.node.datafeed import DataFeed
    from tfos.feed.node.hub import FeedHub
    from tfos.wire.channel import new_key

    hub = FeedHub(new_key(), queue_chunks=4).start()
    try:
        feed = DataFeed(hub, train_mode=True)
        producer = start_producer(hub, chunk, rows, f"{path}-{batch}", rate)
        prof = cProfile.Profile() if profile_dir else None
        t0, cpu0 = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        n = consume(path, feed, batch)
        if prof:
            prof.disable()
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        producer.join(10)
        if n != rows:
            raise RuntimeError(f"{path} at batch {batch} read {n} rows, expected {rows}")
        if prof:
            os.makedirs(profile_dir, exist_ok=True)
            out = os.path.join(profile_dir, f"{path}-{batch}.txt")
            with open(out, "w") as f:
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(30)
        return rows / secs, cpu / rows * 1e6
    finally:
        hub.close()


def with_tf_process_environment() -> None:
    """Re-run this script with the environment tfos's agent gives a TF process (malloc settings that
    keep the feed's buffers in the heap for reuse: without them every chunk-sized allocation is a
    fresh mmap that page-faults), unless it already has it."""
    from tfos.cluster.agent.node_agent import memory_environment

    extra = memory_environment(os.environ)
    if any(os.environ.get(k) != v for k, v in extra.items()):
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], dict(os.environ, **extra))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch", default="64,256,1024")
    p.add_argument("--paths", default="batches,dataset,dataset-py,next_batch")
    p.add_argument("--profile", default=None, help="write cProfile tables of each run into this directory")
    p.add_argument("--rate", type=float, default=0, help="rows/s the producer puts in (0: as fast as read); "
                   "~150000 is what one of two ranks gets in bench/feed.py, where tf.data waits for the network")
    args = p.parse_args(argv)
    with_tf_process_environment()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    importlib.import_module("tensorflow")  # imported once, before any timing

    from tfos.feed.executor.producer import ROW_MULTIPLE, TARGET_CHUNK_BYTES

    chunk = make_chunk(TARGET_CHUNK_BYTES // ROW_BYTES // ROW_MULTIPLE * ROW_MULTIPLE)  # as the producer sizes them
    paths = args.paths.split(",")
    print(f"{'batch':>6} {'path':<11} {'rows/s':>10} {'MB/s':>8} {'x batches':>9} {'CPU-s/1M rows':>14}")
    for batch in (int(b) for b in args.batch.split(",")):
        run("batches", batch, min(args.rows, 20_000), chunk, None)  # warm-up
        base = None
        for path in paths:
            rows = args.rows if path != "next_batch" else max(batch, args.rows // 20)
            rate, cpu = run(path, batch, rows, chunk, args.profile, args.rate)
            base = rate if path == "batches" else base
            ratio = f"{rate / base:.2f}" if base else "-"
            print(f"{batch:>6} {path:<11} {rate:>10.0f} {rate * ROW_BYTES / 1e6:>8.1f} {ratio:>9} {cpu:>14.3f}",
                  flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
