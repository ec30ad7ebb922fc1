"""Horovod over Gloo: the driver runs Horovod's rendezvous server; every training node gets its
HOROVOD_* rank/size/local-rank environment, so ``hvd.init()`` in main_fun just works."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from tfos.backends.base import Backend, NodeHooks
from tfos.errors import ConfigError
from tfos.topology import rank_order


def horovod_slots(nodes: Sequence) -> list[dict]:
    """Pure: Horovod rank layout of the training nodes (NodeInfo), in rank order.

    local_rank counts nodes on the same host; cross_rank is the index of the host among hosts
    that have a node with that local_rank (Horovod's definition).
    """
    trainers = rank_order(nodes)
    hosts: list[str] = []
    for n in trainers:
        if n.host not in hosts:
            hosts.append(n.host)
    per_host = {h: [n for n in trainers if n.host == h] for h in hosts}
    slots = []
    for rank, n in enumerate(trainers):
        local = per_host[n.host]
        local_rank = local.index(n)
        cross_hosts = [h for h in hosts if len(per_host[h]) > local_rank]
        slots.append(dict(node_index=n.node_index, hostname=n.host, rank=rank, size=len(trainers),
                          local_rank=local_rank, local_size=len(local), cross_rank=cross_hosts.index(n.host),
                          cross_size=len(cross_hosts)))
    return slots


def interface_for(ip: str, addrs: dict) -> str | None:
    """Name of the network interface carrying ``ip`` (``addrs`` as from psutil.net_if_addrs())."""
    for name, entries in addrs.items():
        for e in entries:
            if getattr(e, "address", None) == ip:
                return name
    return None


def horovod_env(node_index: int, config: dict, opts: dict, iface: str | None) -> dict[str, str]:
    """Pure: the HOROVOD_* environment of node ``node_index`` (``config``: the driver's setup())."""
    slot = next((s for s in config["slots"] if s["node_index"] == node_index), None)
    if slot is None:
        return {}
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": config["driver_host"],
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(config["rendezvous_port"]),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_HOSTNAME": slot["hostname"], "HOROVOD_RANK": str(slot["rank"]),
           "HOROVOD_SIZE": str(slot["size"]), "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
           "HOROVOD_LOCAL_SIZE": str(slot["local_size"]), "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
           "HOROVOD_CROSS_SIZE": str(slot["cross_size"])}
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    if opts.get("fusion_threshold_mb") is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(opts["fusion_threshold_mb"] * 1024 * 1024))
    if opts.get("cycle_time_ms") is not None:
        env["HOROVOD_CYCLE_TIME"] = str(opts["cycle_time_ms"])
    if opts.get("timeline"):
        base = (config.get("log_dir") or ".").replace("file://", "")
        env["HOROVOD_TIMELINE"] = opts["timeline"] if os.path.isabs(opts["timeline"]) else \
            os.path.join(base, opts["timeline"])
    return env


class HorovodNode(NodeHooks):
    def env(self, me, nodes, config: dict) -> dict[str, str]:
        env = super().env(me, nodes, config)
        try:
            import psutil

            iface = interface_for(me.host, psutil.net_if_addrs())
        except ImportError:
            iface = None
        env.update(horovod_env(me.node_index, config, vars(self), iface))
        return env

    def run(self, main_fun, args, ctx):
        timeline = os.environ.get("HOROVOD_TIMELINE")
        if timeline:
            os.makedirs(os.path.dirname(os.path.abspath(timeline)), exist_ok=True)
        try:
            return main_fun(args, ctx)
        finally:
            hvd = sys.modules.get("horovod.tensorflow")
            if hvd is not None and hvd.is_initialized():
                hvd.shutdown()  # flushes the timeline; the TF process ends with os._exit (no atexit)


class HorovodBackend(Backend):
    """Horovod over Gloo. Options: ``timeline`` (a file name under log_dir; Horovod's timeline of
    every rank), ``fusion_threshold_mb`` (tensor fusion buffer), ``cycle_time_ms``. fp16
    compression is chosen where the optimizer is wrapped:
    ``hvd.DistributedOptimizer(opt, compression=ctx.horovod_compression())`` returns
    ``hvd.Compression.fp16`` when ``compression='fp16'``.
    """

    name = "horovod"
    node_class = HorovodNode

    def __init__(self, timeline: str | None = None, fusion_threshold_mb: float | None = None,
                 cycle_time_ms: float | None = None, compression: str | None = None, **kw):
        super().__init__(**kw)
        if compression not in (None, "none", "fp16"):
            raise ConfigError(f"compression must be None or 'fp16', got {compression!r}")
        self.timeline = timeline
        self.fusion_threshold_mb = fusion_threshold_mb
        self.cycle_time_ms = cycle_time_ms
        self.compression = compression
        self._server = None

    def validate(self, num_executors, num_ps, master_node) -> None:
        super().validate(num_executors, num_ps, master_node)
        if num_ps:
            raise ConfigError("backend='horovod' averages gradients with all-reduce: set num_ps=0")
        try:
            import horovod  # noqa: F401
            from horovod.runner.http.http_server import RendezvousServer  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"backend='horovod' needs Horovod with Gloo on the driver and executors ({e}). Install "
                              "it with `pip install tfos[horovod]` (Horovod 0.28.1 builds against TF <= 2.15: "
                              "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation "
                              "horovod==0.28.1)") from None

    def unprotected(self, num_gpus: int) -> list[str]:
        return super().unprotected(num_gpus) + [
            "Horovod's collectives between hosts (its own Gloo, MPI or NCCL connections) and its HTTP rendezvous on "
            "the driver, which accept any client"]

    def node_options(self) -> dict:
        return dict(super().node_options(), timeline=self.timeline, fusion_threshold_mb=self.fusion_threshold_mb,
                    cycle_time_ms=self.cycle_time_ms, compression=self.compression)

    def setup(self, nodes) -> dict:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        slots = horovod_slots(nodes)
        self._server = RendezvousServer(verbose=0)
        port = self._server.start()
        self._server.init([SlotInfo(s["hostname"], s["rank"], s["local_rank"], s["cross_rank"], s["size"],
                                    s["local_size"], s["cross_size"]) for s in slots])
        return {"rendezvous_port": port, "slots": slots}

    def teardown(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
