"""The reduction server: an all-reduce through CPU-only reducer processes (workers' and reducers' halves).

A reducer owns one shard of every gradient. Each worker sends shard r of its buffer to reducer r
and receives the reduced shard back, so it moves K bytes each way for a K-byte buffer, where a
ring moves 2(N-1)/N K, and the time does not grow with the number of workers. Reducers are nodes
of the tfos cluster (``reserve(..., num_reducers=R)``, role ``reducer``, no ``main_fun``); the
workers reach them with ``implementation='reduction_server'`` in ``tfos.keras_dist`` or
``tfos.distribute.allreduce_gradients`` (docs/reduction_server.md).

Data path: one Gloo process group of the W workers (ranks 0..W-1) and the R reducers (ranks
W..W+R-1), and Gloo's point-to-point send/recv called from C++ (``gloo_cc/reduction.cc``): the
worker's half is tfos's Gloo op in a ``tf.function`` (no Python per message); the reducer's half
is one C++ loop with the GIL released. Buffers go in pieces of R shards of ``SHARD_BYTES``, so
sending, summing and receiving overlap; a reducer sums the workers' shards in worker order
(half and bfloat16 in float32), so every worker receives the same bytes and replicas stay
identical. With the cluster encrypted the group's connections are in the nodes' private network,
carried between hosts by the node tunnel, like every Gloo group of tfos.

Failure: a reducer that dies breaks its connections and the worker's op fails at once; one that
stalls fails it after the collective timeout. Either way the error starts with
``CollectiveError`` and names the reducer (node, host); the group is not used again, and the
cluster's ``max_restarts`` restarts every node. A reducer ends when the workers' connections end
between two all-reduces (their processes finished); within an all-reduce, a worker that dies or
stalls fails the reducer with the worker named.

Outside a tfos cluster (a plain TF_CONFIG), set ``TFOS_REDUCERS=<R>`` on the workers; worker 0
hosts the rendezvous (a TCPStore on its TF_CONFIG port) and each reducer runs
``python -m tfos.tf.reduction serve --index r --workers W --reducers R --store HOST:PORT --host ADDR``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys

from tfos.errors import COLLECTIVE_ERROR, CollectiveError, ConfigError
from tfos.tf import gloo
from tfos.topology import ENV_REDUCER_NAMES, ENV_REDUCERS, REDUCER_JOB

logger = logging.getLogger(__name__)

#: A buffer goes to the reducers in pieces of R shards of about this many bytes: a reducer sums a
#: shard while the next ones travel, and a pipeline of small shards fills and drains fast
#: (bench/README, "Reduction server": 1 MiB pieces at 4 reducers were 5% faster than 4 MiB).
SHARD_BYTES = 256 << 10

#: How many shards a reducer has on the way in (and out) at once, per worker.
LOOKAHEAD = 8

#: How long a reducer waits for the next all-reduce (between steps: evaluation, checkpoints,
#: input stalls). Within an all-reduce the collective timeout applies.
IDLE_TIMEOUT_SECONDS = 7 * 24 * 3600.0

SCOPE = "reduction"  # the group's keys in the driver's rendezvous store


def piece_bytes(reducers: int) -> int:
    """Pure: the bytes of one piece of a buffer (R shards of SHARD_BYTES)."""
    return SHARD_BYTES * max(1, reducers)


def shard_counts(count: int, reducers: int, piece_bytes: int, itemsize: int = 4) -> list[list[int]]:
    """Pure: how a buffer of ``count`` elements is cut: per piece, the elements of each reducer's
    shard (sizes differ by at most one; reducer r gets the r-th slice). ``gloo_cc/reduction.cc``
    cuts alike; a shard of 0 elements is not sent."""
    if count <= 0:
        return []
    piece = max(reducers, piece_bytes // itemsize) if piece_bytes > 0 else count
    out = []
    for off in range(0, count, piece):
        n = min(piece, count - off)
        out.append([n // reducers + (1 if r < n % reducers else 0) for r in range(reducers)])
    return out


def bytes_per_worker(nbytes: int, workers: int, reducers: int = 0) -> int:
    """Pure: the bytes a worker sends (and as many it receives) in one all-reduce of ``nbytes``:
    ``nbytes`` through reducers; 2(N-1)/N of it in a ring (reduce-scatter then all-gather)."""
    if workers <= 1:
        return 0
    return nbytes if reducers else 2 * (workers - 1) * nbytes // workers


def reducers_here() -> tuple[int, list[str]]:
    """``(number of reducers, their names)`` for this process: from tfos in a node, else from
    ``TFOS_REDUCERS``; (0, []) when there are none."""
    raw = os.environ.get(ENV_REDUCERS, "").strip()
    try:
        count = int(raw) if raw else 0
    except ValueError:
        raise ConfigError(f"{ENV_REDUCERS}={raw!r} is not a number of reducers") from None
    names = json.loads(os.environ.get(ENV_REDUCER_NAMES) or "[]")
    return count, [str(n) for n in names][:count] + [f"reducer {r}" for r in range(len(names), count)]


NOT_BUILT = ("the reduction server runs in tfos's Gloo op, which is not built here: build it with "
             "'python -m tfos.tf.gloo_kernel build' (needs g++; TFOS_GLOO_KERNEL=0 switches it off)")


def _kernel():
    from tfos.tf import gloo_kernel

    kernel = gloo_kernel.load()
    if kernel is None:
        raise ConfigError(NOT_BUILT)
    return kernel


def _process_group(store, store_address, rank: int, world: int, host: str, timeout_seconds: float, is_master: bool):
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_seconds)
    if store is None:
        store_host, store_port = store_address
        store = dist.TCPStore(store_host, int(store_port), world, is_master=is_master, timeout=timeout,
                              wait_for_workers=False)
    return store, gloo.process_group(store, rank, world, host, timeout, threads=2)


class WorkerGroup(gloo.Compressing):
    """A worker's side: all-reduces through the ``num_reducers`` reducers. ``rank`` among the
    ``size`` workers; the group meets in ``store`` (the driver's, in a tfos node) or at worker 0's
    TCPStore on ``store_address``; its connections bind to ``host``. Same interface as
    :class:`tfos.tf.gloo.Group` (``reduce_flats``, ``all_reduce_many``, ``broadcast``)."""

    def __init__(self, rank: int, size: int, num_reducers: int, host: str, timeout_seconds: float, store=None,
                 store_address: tuple[str, int] | None = None, names=(),
                 timeout_setting: str = "keras_dist.init_collectives(timeout_seconds=...)"):
        self.rank, self.size, self.num_reducers = rank, size, num_reducers
        self.timeout_seconds, self.timeout_setting = float(timeout_seconds), timeout_setting
        self._kernel = _kernel()  # before the rendezvous: a missing build fails at once, on every rank
        try:
            self._store, self.pg = _process_group(store, store_address, rank, size + num_reducers, host,
                                                  self.timeout_seconds, rank == 0)
        except Exception as e:
            raise CollectiveError(
                f"the reduction-server group (worker {rank} of {size}, {num_reducers} reducers) did not meet within "
                f"{self.timeout_seconds:g} s: {e}. If the reducers or workers are only slow to start, raise "
                f"{timeout_setting}") from e
        self.names = list(names) or [f"reducer {r}" for r in range(num_reducers)]
        self.handle = self._kernel.register_reduction(self.pg, size, self.names)
        logger.info("reduction server: worker %d of %d, %d reducers (%s)", rank, size, num_reducers,
                    ", ".join(self.names))

    def _context(self) -> str:
        return (f"{COLLECTIVE_ERROR}reduction-server all-reduce failed on worker {self.rank} of {self.size} (the "
                f"collective timeout is {self.timeout_seconds:g} s, {self.timeout_setting})")

    def all_reduce_many(self, flats, owned, average):
        """Sum (or mean, where ``average[i]``) each 1-D tensor of ``flats`` over the workers, through the
        reducers, in one op. ``owned``: as for Gloo (the op forwards a buffer nothing else reads,
        and copies any other)."""
        import tensorflow as tf

        xs, casts = [], []
        for flat in flats:
            dtype = flat.dtype
            if dtype.name not in gloo.SUMMABLE:
                if not dtype.is_floating:
                    raise TypeError(f"the reduction server cannot sum {dtype.name} tensors")
                flat = tf.cast(flat, tf.float32)
            xs.append(flat)
            casts.append(dtype)
        if not xs:
            return []
        try:
            ys = self._kernel.all_reduce(xs, handle=self.handle, average=[bool(a) for a in average],
                                         context=self._context(), reduction_server=True,
                                         piece_bytes=piece_bytes(self.num_reducers),
                                         timeout_ms=int(self.timeout_seconds * 1000))
        except tf.errors.OpError as e:  # eagerly; in a tf.function the op's error names CollectiveError first
            raise CollectiveError(e.message) from None
        out = []
        for x, y, dtype in zip(xs, ys, casts):
            y.set_shape(x.shape)
            out.append(y if y.dtype == dtype else tf.cast(y, dtype))
        return out

    def broadcast(self, flat, root_rank: int):
        """``flat`` as it is on ``root_rank``: its bytes summed with zeros from every other worker (exact)."""
        import tensorflow as tf

        raw = tf.reshape(tf.bitcast(flat, tf.uint8), [-1]) if flat.dtype.size > 1 else tf.bitcast(flat, tf.uint8)
        if self.rank != root_rank:
            raw = tf.zeros_like(raw)
        summed = self.all_reduce_many([raw], [True], [False])[0]
        if flat.dtype.size > 1:
            summed = tf.reshape(summed, [-1, flat.dtype.size])
        return tf.reshape(tf.bitcast(summed, flat.dtype), tf.shape(flat))

    def close(self) -> None:
        self._kernel.unregister_reduction(self.handle)


_group: WorkerGroup | None = None


def worker_group(rank: int, size: int, host: str, timeout_seconds: float, store_address=None,
                 timeout_setting: str = "keras_dist.init_collectives(timeout_seconds=...)") -> WorkerGroup:
    """This process's one reduction-server group (made on first call: keras_dist and
    tfos.distribute share it). In a tfos node the workers and reducers meet through the driver;
    else at worker 0's TCPStore on ``store_address``."""
    global _group
    if _group is not None:
        return _group
    count, names = reducers_here()
    if count < 1:
        raise ConfigError("implementation='reduction_server' needs reducers: reserve(..., num_reducers=R) in a "
                          f"tfos cluster, or {ENV_REDUCERS}=R with reducers started by 'python -m tfos.tf.reduction "
                          "serve' outside one")
    store = gloo.node_store(SCOPE, timeout_seconds)
    if store is None and store_address is None:
        raise ConfigError("outside a tfos node the reduction server needs worker 0's address (TF_CONFIG)")
    _group = WorkerGroup(rank, size, count, host, timeout_seconds, store=store,
                         store_address=None if store is not None else store_address, names=names,
                         timeout_setting=timeout_setting)
    return _group


def serve(index: int, workers: int, reducers: int, host: str, step_timeout: float, store=None,
          store_address: tuple[str, int] | None = None, idle_timeout: float = IDLE_TIMEOUT_SECONDS) -> str:
    """Run reducer ``index`` of ``reducers`` for ``workers`` workers until the workers leave (returns
    why); CollectiveError if an all-reduce fails on its way through (a worker died or stalled
    within ``step_timeout`` seconds, or the workers disagree)."""
    import torch

    from tfos.tf import gloo_kernel

    kernel = gloo_kernel.load_bridge()  # no TensorFlow in a reducer: it sums with PyTorch's kernels
    if kernel is None:
        raise ConfigError(NOT_BUILT)
    torch.set_num_threads(1)  # one sum at a time per reducer; the cores are the workers'
    _, pg = _process_group(store, store_address, workers + index, workers + reducers, host, idle_timeout, False)
    handle = kernel.register_reduction(pg, workers, [])
    logger.info("reducer %d of %d serves %d workers on %s", index, reducers, workers, host)
    try:
        reason = kernel.serve(handle, int(step_timeout * 1000), LOOKAHEAD)
    except RuntimeError as e:
        raise CollectiveError(f"reduction server: {e}. A worker died or stopped answering within the collective "
                              f"timeout ({step_timeout:g} s), or the workers reduce different tensors") from None
    finally:
        kernel.unregister_reduction(handle)
    logger.info("reducer %d ends: %s", index, reason)
    return reason


def serve_node(cfg, spec_nodes, timeout_seconds: float | None) -> None:
    """A reducer node's work (instead of ``main_fun``): serve the cluster's workers until they end.
    ``spec_nodes``: the nodes as TF names them (private addresses with the tunnel); the
    ``timeout_seconds`` of the backend bounds every wait within an all-reduce."""
    from tfos.topology import num_training_nodes

    roles = cfg.cluster.roles
    me = next(n for n in spec_nodes if n.node_index == cfg.node_index)
    store = gloo.node_store(SCOPE, IDLE_TIMEOUT_SECONDS)
    serve(cfg.task_index, num_training_nodes(roles), sum(1 for job, _ in roles if job == REDUCER_JOB), me.host,
          float(timeout_seconds or gloo.GLOO_TIMEOUT_SECONDS), store=store)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfos.tf.reduction",
                                     description="a reducer of tfos's reduction server, outside a tfos cluster")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--index", type=int, required=True, help="this reducer's index (0..R-1)")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--reducers", type=int, required=True)
    parser.add_argument("--store", required=True, help="worker 0's HOST:PORT (its TF_CONFIG address)")
    parser.add_argument("--host", required=True, help="the address this reducer's connections bind to")
    parser.add_argument("--timeout", type=float, default=600.0, help="collective timeout within an all-reduce (s)")
    args = parser.parse_args(argv)
    host, port = args.store.rsplit(":", 1)
    try:
        serve(args.index, args.workers, args.reducers, args.host, args.timeout,
              store_address=(host.strip("[]"), int(port)))
    except (CollectiveError, ConfigError) as e:
        logger.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    raise SystemExit(main())
