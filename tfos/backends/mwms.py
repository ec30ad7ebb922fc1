"""Ring all-reduce: MultiWorkerMirroredStrategy from TF_CONFIG (driver and TF-process halves)."""

from __future__ import annotations

from tfos.backends.base import Backend, NodeHooks
from tfos.errors import ConfigError
from tfos.tf.collectives import IMPLEMENTATIONS


def effective_communication(communication: str, encrypted: bool) -> str:
    """Pure: the collective implementation a node asks TF for. On an encrypted cluster 'auto' means
    RING: TF's 'auto' picks NCCL when the node sees GPUs (Spark-scheduled ones included, which
    reserve() cannot count), and NCCL's traffic between hosts bypasses the node tunnel; 'nccl' is
    asked for by name (and refused at reserve() unless allow_unprotected)."""
    return "ring" if encrypted and communication == "auto" else communication


class MWMSNode(NodeHooks):
    def strategy(self, ctx):
        import tensorflow as tf

        from tfos.tf.collectives import communication_options, mwms_cluster_resolver, stop_on_sigterm

        from tfos.distribute import init_gloo

        communication = effective_communication(self.communication, getattr(ctx, "encrypted", False))
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=mwms_cluster_resolver(),
            communication_options=communication_options(communication, self.bytes_per_pack,
                                                        self.timeout_seconds))
        stop_on_sigterm()  # TF's coordination service took SIGTERM over
        init_gloo(strategy, self.implementation, self.timeout_seconds, self.communication)
        return strategy


class MWMSBackend(Backend):
    """Ring all-reduce: MultiWorkerMirroredStrategy from TF_CONFIG.

    ``communication``: 'auto' | 'ring' | 'nccl'; ``bytes_per_pack`` > 0 packs gradients into
    chunks of that size before all-reducing (TF's tensor fusion); ``timeout_seconds`` bounds
    each collective. transport='rdma' selects NCCL. ``implementation``: 'auto' | 'tf' | 'gloo' |
    'reduction_server': who all-reduces in ``tfos.distribute.allreduce_gradients`` ('auto': the
    reducers when the cluster has some, else Gloo, on CPU-only hosts with PyTorch installed, see
    :func:`tfos.distribute.init_gloo`).
    """

    name = "mwms"
    node_class = MWMSNode
    takes_reducers = True

    def __init__(self, communication: str = "auto", bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation: str = "auto", **kw):
        super().__init__(**kw)
        if communication not in ("auto", "ring", "nccl"):
            raise ConfigError(f"communication must be 'auto', 'ring' or 'nccl', got {communication!r}")
        self.communication = "nccl" if self.transport == "rdma" else communication
        self.bytes_per_pack = int(bytes_per_pack)
        self.timeout_seconds = timeout_seconds
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        self.implementation = implementation

    def unprotected(self, num_gpus: int) -> list[str]:
        found = super().unprotected(num_gpus)
        if not found and (self.communication == "nccl" or (self.communication == "auto" and num_gpus > 0)):
            found.append("NCCL's all-reduce between the GPUs of different hosts (MultiWorkerMirroredStrategy with "
                         "GPUs; communication='ring' keeps TF's own, which tfos protects)")
        return found

    def node_options(self) -> dict:
        return dict(super().node_options(), communication=self.communication, bytes_per_pack=self.bytes_per_pack,
                    timeout_seconds=self.timeout_seconds, implementation=self.implementation)
