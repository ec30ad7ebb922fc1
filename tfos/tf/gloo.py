"""CPU all-reduce and broadcast of TF tensors over Gloo, through PyTorch's ``torch.distributed``.

Runs in the TF process. TF 2.21's own CPU collectives (MWMS RING) move data at a fraction of
what the network allows, and Horovod (Gloo) no longer builds for TF >= 2.16. PyTorch's wheel
ships a maintained Gloo; this module hands TF tensors to it without copying them:

* a ``tf.py_function`` receives the tensor as an EagerTensor whose ``_numpy()`` is a writable
  view of TF's buffer, and ``torch.from_numpy`` views the same memory, so Gloo reduces TF's
  buffer in place and the op returns that very tensor;
* in a ``tf.function`` the tensor first passes through TF's ``Snapshot`` op, which hands on the
  tensor's own buffer when nothing else will read it (TF's buffer forwarding: a gradient that
  only the all-reduce consumes) and copies it otherwise (a variable's value, a function
  argument the caller keeps), so a gradient is reduced in the memory back-propagation wrote it
  to, with no copy, and nothing TF may still read is ever written;
* with tfos's op built (:mod:`tfos.tf.gloo_kernel`, the default wherever g++ can build it), a
  ``tf.function`` and an eager call alike hand their tensors to Gloo in C++ instead of through the
  ``py_function`` (no Python per call), with the same buffer rule (TF's forwarding, else a copy
  made part by part while the parts before it travel; an eager caller holds its tensor, so it is
  copied);
* without the op, eagerly (the caller holds the tensor) the tensor is copied into a fresh one, in
  chunks of ``CHUNK_BYTES`` whose all-reduces start while the next chunk is being copied;
* the tensors of one step go to Gloo in one call (:meth:`Group.all_reduce_many`): every
  collective is issued before the first is waited for; a mean is one in-place scaling pass
  after the last.

In a tfos node the group's rendezvous goes through the driver's authenticated channel
(:func:`node_store`, :mod:`tfos.tf.gloo_store`), and with encryption on its TCP connections live in
the node's private network, carried between hosts by the node tunnel (:mod:`tfos.tunnel`): the
address a rank publishes is its node's private address. Outside a tfos node (a plain TF_CONFIG)
the rendezvous is a ``torch.distributed.TCPStore`` on rank 0. A peer that dies breaks the TCP
connections at once and every other rank's collective raises :class:`tfos.errors.CollectiveError`;
a peer that stops answering fails the collective after ``timeout_seconds``.
"""

from __future__ import annotations

import datetime
import importlib.util
import logging

from tfos.errors import COLLECTIVE_ERROR, CollectiveError, collective_error

logger = logging.getLogger(__name__)

#: Gloo's deadline for its rendezvous and for every collective when timeout_seconds is not given.
GLOO_TIMEOUT_SECONDS = 600.0

#: Copy-and-reduce granularity for tensors that must not be reduced in place.
CHUNK_BYTES = 16 << 20

#: Gloo threads per process: each runs one collective at a time, so this many of a step's
#: collectives travel at once (torch's default is 2; bench/README, "Constants": Gloo threads).
THREADS = 4

#: On 2 ranks a tensor of at least twice this many bytes goes to Gloo as several collectives on its
#: parts (:func:`split_count`), which Gloo's THREADS run at once: a 2-rank ring is one exchange with
#: nothing to overlap but other collectives (bench/README, "Constants": all-reduce pieces).
PIECE_BYTES = 4 << 20

#: dtypes Gloo sums natively; other float dtypes are summed as float32.
SUMMABLE = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")

INSTALL_HINT = ("pip install 'tfos[gloo]' (PyTorch's CPU wheel, ~190 MB download; on PyPI plain 'torch' is the "
                "CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cpu)")


def installed() -> bool:
    """True when ``torch`` (with ``torch.distributed``) can be imported."""
    return importlib.util.find_spec("torch") is not None


def max_pieces(ranks: int) -> int:
    """Pure: how many parts a tensor may go to Gloo in, on a group of ``ranks`` (see PIECE_BYTES)."""
    return THREADS if ranks == 2 else 1


def split_count(nbytes: int, max_pieces: int = THREADS, piece_bytes: int = PIECE_BYTES) -> int:
    """Pure: into how many collectives a tensor of ``nbytes`` goes (every rank splits alike; the
    op's bridge.cc applies the same rule)."""
    return max(1, min(max_pieces, nbytes // piece_bytes if piece_bytes > 0 else 1))


def node_store(scope: str, timeout_seconds: float):
    """The group's rendezvous store through the driver (:class:`tfos.tf.gloo_store.DriverStore`)
    when this process runs in a tfos node (``scope`` names the group), else None."""
    from tfos.cluster.node.control import node_config

    cfg = node_config()
    if cfg is None:
        return None
    from tfos.tf.gloo_store import DriverStore

    return DriverStore(cfg, scope, timeout_seconds)


def store_on_free_port(size: int, timeout_seconds: float):
    """Rank 0's rendezvous store on a port the OS picks (its ``.port``), for when no port is known
    in advance; the other ranks learn it some other way and join with :class:`Group`."""
    import torch.distributed as dist

    return dist.TCPStore("0.0.0.0", 0, size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_seconds))


def process_group(store, rank: int, size: int, host: str, timeout, threads: int = THREADS):
    """PyTorch's Gloo process group of ``size`` ranks meeting in ``store``, its connections bound to
    ``host``, every collective bounded by ``timeout`` (a timedelta); shared with :mod:`tfos.tf.reduction`."""
    import torch.distributed as dist

    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._threads = threads
    return dist.ProcessGroupGloo(store, rank, size, opts)


class Compressing:
    """``reduce_flats`` for a group with ``size`` and ``all_reduce_many`` (:class:`Group`, the
    reduction server's :class:`tfos.tf.reduction.WorkerGroup`)."""

    def reduce_flats(self, flats, owned, average: bool, compression):
        """:meth:`all_reduce_many` of the 1-D ``flats`` with ``compression`` (see
        :mod:`tfos.tf.compression`); a compression cast is a buffer of our own, pre-divided, so its
        all-reduce sums where the others average."""
        from tfos.tf import compression as _compression

        wire = [_compression.compress(f, compression, self.size) for f in flats]
        ys = self.all_reduce_many([w for w, _ in wire], [own or c for own, (_, c) in zip(owned, wire)],
                                  [average and not c for _, c in wire])
        return [_compression.decompress(y, f.dtype, self.size, average) if c else y
                for f, (_, c), y in zip(flats, wire, ys)]


class Group(Compressing):
    """A Gloo process group of ``size`` ranks meeting in ``store`` (every rank passes its own: a
    :func:`node_store`, or rank 0's TCPStore), or else in a TCPStore that rank 0 hosts on
    ``store_address`` (host, port); every rank's Gloo connections bind to ``host``."""

    def __init__(self, rank: int, size: int, store_address: tuple[str, int] | None, host: str, timeout_seconds: float,
                 store=None, timeout_setting: str = "keras_dist.init_collectives(timeout_seconds=...)"):
        import torch.distributed as dist

        self.rank, self.size, self.timeout_seconds = rank, size, float(timeout_seconds)
        self.timeout_setting = timeout_setting  # named in timeout errors
        timeout = datetime.timedelta(seconds=self.timeout_seconds)
        store_host, store_port = store_address or ("", 0)
        try:
            self._store = store or dist.TCPStore(store_host, int(store_port), size, is_master=rank == 0,
                                                 timeout=timeout, wait_for_workers=True)
            self.pg = process_group(self._store, rank, size, host, timeout)
        except Exception as e:
            raise CollectiveError(
                f"Gloo rendezvous of rank {rank} of {size} "
                f"{'through the driver' if store is not None else f'at {store_host}:{store_port}'} failed within "
                f"{self.timeout_seconds:g} s: {e}. If the peers are only slow to start, raise "
                f"{timeout_setting}") from e
        from tfos.tf import gloo_kernel

        self._kernel = gloo_kernel.load()  # the op for tf.function (None: through tf.py_function)
        self._handles: dict = {}  # process group -> its handle in the op's bridge
        logger.info("Gloo group: rank %d of %d on %s (store %s)", rank, size, host,
                    f"{store_host}:{store_port}" if store is None else type(store).__name__)

    def _handle(self) -> int:
        """``self.pg``'s handle in the op's bridge (registered on first use)."""
        if self.pg not in self._handles:
            self._handles[self.pg] = self._kernel.register(self.pg)
        return self._handles[self.pg]

    def _wait(self, works, what: str) -> None:
        """Wait for every one of ``works``, even after one failed (none may go on writing into a
        buffer TF frees once the error is raised); then raise the first failure."""
        first = None
        for w in works:
            try:
                w.wait()
            except Exception as e:
                first = first or e
        if first is not None:
            raise CollectiveError(
                f"Gloo {what} failed on rank {self.rank} of {self.size}: {first}. A peer died or stopped answering; "
                f"the timeout is {self.timeout_seconds:g} s ({self.timeout_setting})") from first

    def all_reduce_many(self, flats, owned, average):
        """Sum (or mean, where ``average[i]``) each 1-D tensor of ``flats`` over the group's ranks, in
        one call to Gloo. Works eagerly and inside ``tf.function``. ``owned[i]``: nothing but this
        call reads ``flats[i]`` (a pack or cast made for it), so it is reduced in place; any other
        tensor is reduced in its own buffer when TF forwards it (see the module's notes) and
        otherwise in a copy."""
        import tensorflow as tf

        graph = not tf.executing_eagerly()
        kernel = self._kernel is not None  # the op forwards or copies each input itself, eagerly too
        xs, owns, casts = [], [], []
        for flat, own in zip(flats, owned):
            dtype = flat.dtype
            if dtype.name not in SUMMABLE:
                if not dtype.is_floating:
                    raise TypeError(f"Gloo all-reduce cannot sum {dtype.name} tensors")
                flat, own = tf.cast(flat, tf.float32), True  # summed as float32, cast back below
            elif not own and graph and not kernel:
                flat, own = tf.raw_ops.Snapshot(input=flat), True  # its own buffer if TF forwards it, else a copy
            xs.append(flat)
            owns.append(own)
            casts.append(dtype)
        if not xs:
            return []
        if kernel:  # in a tf.function its errors are TF's own: the TF process raises them as CollectiveError
            try:
                ys = self._kernel.all_reduce(xs, handle=self._handle(), average=[bool(a) for a in average],
                                             context=f"{COLLECTIVE_ERROR}Gloo all-reduce failed on rank {self.rank} "
                                                     f"of {self.size} (a peer died or stopped answering; the timeout "
                                                     f"is {self.timeout_seconds:g} s, {self.timeout_setting})",
                                             max_pieces=max_pieces(self.size), piece_bytes=PIECE_BYTES)
            except tf.errors.OpError as e:  # eagerly: the caller gets tfos's error at once
                raise (collective_error(e.message) or CollectiveError(e.message)) from None
        else:
            ys = tf.py_function(lambda *ts: self._all_reduce_eager(ts, owns, average), xs, [x.dtype for x in xs])
        out = []
        for x, y, dtype in zip(xs, ys, casts):
            y.set_shape(x.shape)
            out.append(y if y.dtype == dtype else tf.cast(y, dtype))
        return out

    def _all_reduce_eager(self, xs, owned, average):
        import numpy as np
        import tensorflow as tf

        outs, dsts, works = [], [], []
        for x, own in zip(xs, owned):
            src = x._numpy()  # a writable view of TF's buffer (public .numpy() copies)
            if own:
                out, dst = x, src
                view = _torch_view(dst)
                step = max(1, -(-dst.size // split_count(dst.nbytes, max_pieces(self.size))))
                ws = [self.pg.allreduce([view[i:i + step]]) for i in range(0, dst.size, step)]
            else:
                out = tf.raw_ops.Empty(shape=tf.shape(x), dtype=x.dtype)
                dst = out._numpy()
                view = _torch_view(dst)
                step = max(1, CHUNK_BYTES // max(1, dst.itemsize))
                ws = []
                for i in range(0, dst.size, step):
                    np.copyto(dst[i:i + step], src[i:i + step])
                    ws.append(self.pg.allreduce([view[i:i + step]]))
            outs.append(out)
            dsts.append(dst)
            works.append(ws)
        self._wait([w for ws in works for w in ws], "all-reduce")
        # averaged once every collective is done: scaling one result while the next travel competes
        # with Gloo for the cores (bench/README, "Constants": all-reduce pieces)
        for x, dst, avg in zip(xs, dsts, average):
            if avg and self.size > 1 and dst.size:
                if x.dtype.is_floating:
                    np.multiply(dst, dst.dtype.type(1.0 / self.size), out=dst)
                else:
                    np.floor_divide(dst, self.size, out=dst)
        return outs

    def broadcast(self, flat, root_rank: int):
        """``flat`` (a 1-D tensor, the same shape and dtype on every rank) as it is on ``root_rank``."""
        import tensorflow as tf

        y = tf.py_function(lambda x: self._broadcast_eager(x, root_rank), [flat], flat.dtype)
        y.set_shape(flat.shape)
        return y

    def _broadcast_eager(self, x, root_rank: int):
        import tensorflow as tf
        import torch
        import torch.distributed as dist

        out = tf.raw_ops.Empty(shape=tf.shape(x), dtype=x.dtype)
        dst = out._numpy()
        if self.rank == root_rank:
            dst[...] = x._numpy()
        if dst.size:
            opts = dist.BroadcastOptions()
            opts.rootRank = root_rank
            raw = torch.from_numpy(dst.reshape(-1).view("uint8"))  # any dtype travels as its bytes
            self._wait([self.pg.broadcast([raw], opts)], "broadcast")
        return out


def _torch_view(array):
    """A torch tensor on ``array``'s memory (bfloat16, which torch cannot take from numpy, through
    an int16 view)."""
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(array)
