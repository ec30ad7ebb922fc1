"""Settings of TensorFlow's collectives, shared by :mod:`tfos.keras_dist` and the MWMS backend."""

from __future__ import annotations

COMMUNICATIONS = ("auto", "ring", "nccl")

#: Who runs the collectives of tfos.keras_dist: TensorFlow's own collective ops, Gloo
#: (PyTorch's torch.distributed, :mod:`tfos.tf.gloo`), or the reducers of the cluster
#: (:mod:`tfos.tf.reduction`, over Gloo's connections).
IMPLEMENTATIONS = ("auto", "tf", "gloo", "reduction_server")

#: With Gloo, a tensor at least this big is all-reduced in its own memory (no packing copy, see
#: :mod:`tfos.tf.gloo`); smaller ones are packed so that a step makes few collective calls.
ALONE_BYTES = 1 << 20


def stop_on_sigterm() -> bool:
    """Give SIGTERM its default action back in a tfos node's TF process; True if it did.

    TF's coordination service (started by MultiWorkerMirroredStrategy and ParameterServerStrategy)
    catches SIGTERM for its preemption notifier, and the process then ignores the node agent's stop
    until ``stop_grace_secs`` ran out and SIGKILL came: every restart, resize and shutdown waited
    that long. In a tfos node the agent is the one that hears eviction notices, so the TF process
    may die of SIGTERM again. Outside a node (a plain process) nothing changes."""
    import signal
    import threading

    from tfos.cluster.node.control import node_config

    if node_config() is None or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return True


def choose_implementation(requested: str, communication: str, gloo_installed: bool, num_gpus: int,
                          reducers: int = 0) -> str:
    """Pure: ``'tf'``, ``'gloo'`` or ``'reduction_server'`` for the ``implementation`` argument ``requested``.

    ``'auto'`` picks the reduction server when the cluster has ``reducers`` (reserve's
    ``num_reducers``), else Gloo, on CPU-only hosts with PyTorch installed (Gloo all-reduces
    several times faster than TF's RING there); TF otherwise: GPU hosts keep NCCL through TF, and an
    explicit ``communication='nccl'`` or ``'ring'`` asks for TF's collectives. ``'gloo'`` or
    ``'reduction_server'`` without PyTorch is a ValueError.
    """
    name = requested.lower() if isinstance(requested, str) else requested
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, not {requested!r}")
    if name in ("gloo", "reduction_server") and not gloo_installed:
        raise ValueError(f"implementation={name!r} needs PyTorch: pip install 'tfos[gloo]'")
    if name != "auto":
        return name
    if gloo_installed and num_gpus == 0 and communication == "auto":
        return "reduction_server" if reducers > 0 else "gloo"
    return "tf"


def packs(tensors, bytes_per_pack: int, alone_bytes: int = 0) -> list[list[int]]:
    """Group the indices of ``tensors`` by dtype (first appearance order) and then by size; with
    ``alone_bytes``, a tensor at least that big is a pack of its own (reduced in its own memory,
    with no packing copy) and only the smaller ones are packed."""
    groups = []
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        cur, cur_bytes = [], 0
        for i in idx:
            n = tensors[i].shape.num_elements()
            nbytes = (n if n is not None else 0) * dtype.size
            if alone_bytes and nbytes >= alone_bytes:
                groups.append([i])
                continue
            if bytes_per_pack and cur and cur_bytes + nbytes > bytes_per_pack:
                groups.append(cur)
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += nbytes
        if cur:
            groups.append(cur)
    return groups


def reduce_packed(tensors, packs, reduce_flats) -> list:
    """Reduce the dense ``tensors`` pack by pack, for every collective implementation: each pack
    (a list of indices into ``tensors``) becomes one 1-D tensor (a ``tf.concat`` when it holds
    several), ``reduce_flats(flats, owned)`` reduces them all (``owned[i]``: the concat was made
    here and nothing else reads it), and the results are split back into the tensors' shapes."""
    import tensorflow as tf

    # Dynamic shapes are read first, and the packing waits for them: a pending Shape op would still
    # hold the tensor when the collective takes it, and TF would then copy instead of forwarding
    # its buffer (see tfos.tf.gloo).
    shapes = [t.shape if t.shape.is_fully_defined() else tf.shape(t) for t in tensors]
    dynamic = [s for s in shapes if isinstance(s, tf.Tensor)]
    flats, owned, sizes = [], [], []
    with tf.control_dependencies(dynamic):
        for pack in packs:
            parts = [tensors[j] for j in pack]
            if len(parts) == 1:
                flats.append(tf.reshape(parts[0], [-1]))
                owned.append(False)
                sizes.append(None)
            else:
                n = [p.shape.num_elements() for p in parts]
                sizes.append(tf.stack([tf.reduce_prod(shapes[j]) for j in pack]) if any(k is None for k in n) else n)
                flats.append(tf.concat([tf.reshape(p, [-1]) for p in parts], axis=0))
                owned.append(True)
    out = [None] * len(tensors)
    for pack, reduced, size in zip(packs, reduce_flats(flats, owned), sizes):
        pieces = [reduced] if size is None else tf.split(reduced, size)
        for j, r in zip(pack, pieces):
            out[j] = tf.reshape(r, shapes[j])
    return out


def check_communication(communication: str) -> str:
    """The communication name in lower case; ValueError unless 'auto', 'ring' or 'nccl'."""
    name = communication.lower() if isinstance(communication, str) else communication
    if name not in COMMUNICATIONS:
        raise ValueError(f"communication must be 'auto', 'ring' or 'nccl', not {communication!r}")
    return name


def communication_options(communication: str = "auto", bytes_per_pack: int = 0,
                          timeout_seconds: float | None = None):
    """``tf.distribute.experimental.CommunicationOptions`` for ``communication`` ('auto' | 'ring' |
    'nccl', any case; ValueError otherwise), ``bytes_per_pack`` and ``timeout_seconds``."""
    name = check_communication(communication)
    import tensorflow as tf

    impl = getattr(tf.distribute.experimental.CommunicationImplementation, name.upper())
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=int(bytes_per_pack), timeout_seconds=timeout_seconds, implementation=impl)


def mwms_cluster_resolver():
    """TF's ``TFConfigClusterResolver`` (TF_CONFIG from the environment), except that a job named
    'master' (TF 1.x's name of the chief, ``master_node='master'``) reads as 'chief':
    MultiWorkerMirroredStrategy rejects any other name. Every task renames it, so they agree."""
    import tensorflow as tf

    base = tf.distribute.cluster_resolver.TFConfigClusterResolver

    class ChiefNamedResolver(base):
        def cluster_spec(self):
            jobs = super().cluster_spec().as_dict()
            if "master" in jobs:
                jobs["chief"] = jobs.pop("master")
            return tf.train.ClusterSpec(jobs)

    return ChiefNamedResolver(task_type="chief" if base().task_type == "master" else None)
