"""The backend interface: how gradients are averaged. Two halves, each run where it belongs.

* :class:`Backend` runs on the driver: ``validate`` (before any Spark job), ``setup(nodes)``
  once every node registered (returns JSON-able config that every TF process receives with
  the cluster spec, e.g. Horovod's rendezvous address), ``teardown()``; ``finishing_jobs``
  (roles whose completion ends the job), ``feed_jobs`` (roles that take fed data),
  ``survivable_jobs`` (roles the others can go on without, when restarts are on) and
  ``takes_reducers`` (its workers can use the reduction server's reducers).
* :class:`NodeHooks` runs in the TF process: ``env(me, nodes, config)`` (extra environment
  set before ``main_fun``), ``run(main_fun, args, ctx)`` and ``strategy(ctx)`` (behind
  ``ctx.strategy()``).

``Backend.node_hooks()`` builds the node half from the backend's options; it travels to the
nodes with ``main_fun`` in the node's private function file (cloudpickle, never a socket), so a
Backend or NodeHooks subclass defined in user code runs its own hooks on the nodes. The core
never branches on a backend's name.
"""

from __future__ import annotations

import os
from typing import Sequence

from tfos.errors import ConfigError
from tfos.topology import TRAINING_JOBS


def rdma_devices(sys_root: str = "/sys/class/infiniband") -> list[str]:
    try:
        return sorted(os.listdir(sys_root))
    except OSError:
        return []


def rdma_environment(devices: Sequence[str], socket_ifname: str | None = None) -> dict[str, str]:
    """Environment selecting NCCL over InfiniBand/RoCE (and UCX for MPI/Horovod) on ``devices``.

    TF 2.21 servers speak only grpc (grpc+verbs is gone), so RDMA means NCCL collectives over IB.
    """
    if not devices:
        raise ConfigError("transport='rdma' needs an RDMA device, but /sys/class/infiniband is empty on this "
                          "host; use transport='grpc' (the default) or run on hosts with InfiniBand/RoCE NICs")
    env = {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": ",".join(devices), "NCCL_NET": "IB",
           "UCX_NET_DEVICES": ",".join(f"{d}:1" for d in devices), "HOROVOD_GPU_OPERATIONS": "NCCL"}
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
        env["GLOO_SOCKET_IFNAME"] = socket_ifname
    return env


class NodeHooks:
    """The TF-process half of a backend. Constructed with the backend's node options (plain,
    picklable values), available as attributes."""

    def __init__(self, transport: str = "grpc", socket_ifname: str | None = None, **options):
        self.transport = transport
        self.socket_ifname = socket_ifname
        for k, v in options.items():
            setattr(self, k, v)

    def env(self, me, nodes, config: dict) -> dict[str, str]:
        """Extra environment of this TF process (``me``/``nodes``: NodeInfo; ``config``: setup()'s result)."""
        if self.transport == "rdma":
            return rdma_environment(rdma_devices(), self.socket_ifname)
        return {}

    def run(self, main_fun, args, ctx):
        """Call main_fun; returns what it returned (an export path is logged with the MLflow run)."""
        return main_fun(args, ctx)

    def strategy(self, ctx):
        raise ConfigError(f"the {type(self).__name__} backend has no tf.distribute strategy")

    def serve_reducer(self, cfg, spec_nodes) -> None:
        """A reducer node's work instead of main_fun (reserve's ``num_reducers``): the reduction
        server until the workers end, each wait within an all-reduce bounded by the backend's
        ``timeout_seconds`` (:mod:`tfos.tf.reduction`)."""
        from tfos.tf import reduction

        reduction.serve_node(cfg, spec_nodes, getattr(self, "timeout_seconds", None))


class Backend:
    """The driver half of a backend. Subclass it (and :class:`NodeHooks`, named by
    ``node_class``) for a custom backend; pass an instance as ``reserve(..., backend=...)``."""

    name = "base"
    node_class: type = NodeHooks
    finishing_jobs: tuple[str, ...] = TRAINING_JOBS
    feed_jobs: tuple[str, ...] = TRAINING_JOBS  # roles that receive data in InputMode.SPARK
    survivable_jobs: tuple[str, ...] = ()  # roles whose loss the others survive (lifecycle.failure_policy)
    takes_reducers = False  # its workers can all-reduce through reserve(num_reducers=R) (tfos.tf.reduction)

    def __init__(self, transport: str = "grpc", socket_ifname: str | None = None):
        if transport not in ("grpc", "rdma"):
            raise ConfigError(f"transport must be 'grpc' or 'rdma', got {transport!r}")
        self.transport = transport
        self.socket_ifname = socket_ifname

    def validate(self, num_executors: int, num_ps: int, master_node) -> None:
        if self.transport == "rdma":
            rdma_environment(rdma_devices(), self.socket_ifname)  # raises on hosts without RDMA

    def unprotected(self, num_gpus: int) -> list[str]:
        """What this backend sends between hosts that tfos cannot carry in its tunnels (each a short
        description); with encryption on, reserve() refuses it unless the user accepts it. TF's own
        gRPC and tfos's Gloo are protected; NCCL and RDMA transports are not."""
        if self.transport == "rdma":
            return ["transport='rdma' (NCCL over InfiniBand/RoCE between hosts)"]
        return []

    def setup(self, nodes) -> dict:
        return {}

    def teardown(self) -> None:
        pass

    def node_options(self) -> dict:
        """Options the node half is built with (plain values)."""
        return {"transport": self.transport, "socket_ifname": self.socket_ifname}

    def node_hooks(self) -> NodeHooks:
        return self.node_class(**self.node_options())
