"""Training backends: how gradients are averaged. Plug-ins behind one small interface.

The core calls the same hooks whatever the backend; no code outside this module branches on
a backend's name.

* ``driver_setup(nodes)``: driver, once every node registered; returns JSON-able config that
  every TF process receives with the cluster spec (e.g. Horovod's rendezvous address).
* ``node_env(me, nodes, config)``: pure; extra environment of one TF process, set before
  ``main_fun`` runs (e.g. HOROVOD_RANK).
* ``run_node(main_fun, args, ctx)``: TF process; default calls ``main_fun(args, ctx)``.
* ``strategy(ctx)``: TF process; the ``tf.distribute`` strategy behind ``ctx.strategy()``.
* ``finishing_jobs``: roles whose completion ends the job; the others are stopped afterwards.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from tfos.cluster.decisions import TRAINING_JOBS
from tfos.errors import ConfigError

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- RDMA

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


# --------------------------------------------------------------------------- base

class Backend:
    name = "base"
    finishing_jobs: tuple[str, ...] = TRAINING_JOBS
    feed_jobs: tuple[str, ...] = TRAINING_JOBS  # roles that receive data in InputMode.SPARK

    def __init__(self, transport: str = "grpc", socket_ifname: str | None = None):
        if transport not in ("grpc", "rdma"):
            raise ConfigError(f"transport must be 'grpc' or 'rdma', got {transport!r}")
        self.transport = transport
        self.socket_ifname = socket_ifname

    # driver
    def validate(self, num_executors: int, num_ps: int, master_node) -> None:
        if self.transport == "rdma":
            rdma_environment(rdma_devices(), self.socket_ifname)  # raises on hosts without RDMA

    def driver_setup(self, nodes: list[dict]) -> dict:
        return {}

    def driver_teardown(self) -> None:
        pass

    def options(self) -> dict:
        """JSON-able settings shipped to the TF processes."""
        return {"name": self.name, "transport": self.transport, "socket_ifname": self.socket_ifname}

    # TF process
    def node_env(self, me: dict, nodes: list[dict], config: dict) -> dict[str, str]:
        if self.transport == "rdma":
            return rdma_environment(rdma_devices(), self.socket_ifname)
        return {}

    def run_node(self, main_fun, args, ctx) -> None:
        main_fun(args, ctx)

    def strategy(self, ctx):
        raise ConfigError(f"the {self.name} backend has no tf.distribute strategy")


class MWMSBackend(Backend):
    """Ring all-reduce: MultiWorkerMirroredStrategy from TF_CONFIG.

    ``communication``: 'auto' | 'ring' | 'nccl'; ``bytes_per_pack`` > 0 packs gradients into
    chunks of that size before all-reducing (TF's tensor fusion); ``timeout_seconds`` bounds
    each collective. transport='rdma' selects NCCL.
    """

    name = "mwms"

    def __init__(self, communication: str = "auto", bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 **kw):
        super().__init__(**kw)
        if communication not in ("auto", "ring", "nccl"):
            raise ConfigError(f"communication must be 'auto', 'ring' or 'nccl', got {communication!r}")
        self.communication = "nccl" if self.transport == "rdma" else communication
        self.bytes_per_pack = int(bytes_per_pack)
        self.timeout_seconds = timeout_seconds

    def options(self) -> dict:
        return dict(super().options(), communication=self.communication, bytes_per_pack=self.bytes_per_pack,
                    timeout_seconds=self.timeout_seconds)

    def strategy(self, ctx):
        import tensorflow as tf

        impl = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}[self.communication]
        comm = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.bytes_per_pack, timeout_seconds=self.timeout_seconds, implementation=impl)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)


class PSBackend(Backend):
    """Parameter servers: ps and worker nodes run ``tf.distribute.Server`` (tfos starts it; main_fun
    runs on the chief only), the chief runs ParameterServerStrategy + ClusterCoordinator. The job
    ends when the chief's main_fun returns; ps and worker servers are then stopped.

    With InputMode.SPARK only the chief receives fed data (it dispatches batches to the workers
    through the coordinator); InputMode.TENSORFLOW per-worker dataset functions reading file
    shards are the scalable choice.
    """

    name = "ps"
    finishing_jobs = ("chief", "master")
    feed_jobs = ("chief", "master")

    def validate(self, num_executors, num_ps, master_node) -> None:
        super().validate(num_executors, num_ps, master_node)
        if num_ps < 1:
            raise ConfigError("backend='ps' needs num_ps >= 1 parameter server node(s)")
        if not master_node:
            raise ConfigError("backend='ps' needs a chief (master_node='chief') to run the ClusterCoordinator")
        if num_executors - num_ps < 2:
            raise ConfigError("backend='ps' needs at least one worker besides the chief: raise num_executors")

    def run_node(self, main_fun, args, ctx) -> None:
        if ctx.job_name in ("ps", "worker"):
            import tensorflow as tf

            logger.info("starting tf.distribute.Server for %s:%d", ctx.job_name, ctx.task_index)
            server = tf.distribute.Server(tf.train.ClusterSpec(ctx.cluster_spec), job_name=ctx.job_name,
                                          task_index=ctx.task_index, protocol="grpc", start=True)
            server.join()  # runs until tfos stops this node after the chief finished
            return
        main_fun(args, ctx)

    def strategy(self, ctx):
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)


def horovod_slots(nodes: Sequence[dict]) -> list[dict]:
    """Horovod rank layout of the training nodes (ordered by rank: chief first, then workers).

    local_rank counts nodes on the same host; cross_rank is the index of the host among hosts
    that have a node with that local_rank (Horovod's definition).
    """
    def order(n):
        return (0 if n["job_name"] in ("chief", "master") else 1, n["task_index"])

    trainers = sorted((n for n in nodes if n["job_name"] in TRAINING_JOBS), key=order)
    hosts: list[str] = []
    for n in trainers:
        if n["host"] not in hosts:
            hosts.append(n["host"])
    per_host = {h: [n for n in trainers if n["host"] == h] for h in hosts}
    slots = []
    for rank, n in enumerate(trainers):
        local = per_host[n["host"]]
        local_rank = local.index(n)
        cross_hosts = [h for h in hosts if len(per_host[h]) > local_rank]
        slots.append(dict(node_index=n["node_index"], hostname=n["host"], rank=rank, size=len(trainers),
                          local_rank=local_rank, local_size=len(local), cross_rank=cross_hosts.index(n["host"]),
                          cross_size=len(cross_hosts)))
    return slots


def interface_for(ip: str, addrs: dict) -> str | None:
    """Name of the network interface carrying ``ip`` (``addrs`` as from psutil.net_if_addrs())."""
    for name, entries in addrs.items():
        for e in entries:
            if getattr(e, "address", None) == ip:
                return name
    return None


class HorovodBackend(Backend):
    """Horovod over Gloo: the driver runs Horovod's rendezvous server; every training node gets its
    HOROVOD_* rank/size/local-rank environment, so ``hvd.init()`` in main_fun just works.

    Options: ``timeline`` (a file name under log_dir; Horovod's timeline of every rank),
    ``fusion_threshold_mb`` (tensor fusion buffer), ``cycle_time_ms``. fp16 compression is chosen
    where the optimizer is wrapped: ``hvd.DistributedOptimizer(opt, compression=ctx.horovod_compression())``
    returns ``hvd.Compression.fp16`` when ``compression='fp16'``.
    """

    name = "horovod"

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

    def options(self) -> dict:
        return dict(super().options(), timeline=self.timeline, fusion_threshold_mb=self.fusion_threshold_mb,
                    cycle_time_ms=self.cycle_time_ms, compression=self.compression)

    def run_node(self, main_fun, args, ctx) -> None:
        timeline = os.environ.get("HOROVOD_TIMELINE")
        if timeline:
            os.makedirs(os.path.dirname(os.path.abspath(timeline)), exist_ok=True)
        try:
            main_fun(args, ctx)
        finally:
            import sys

            hvd = sys.modules.get("horovod.tensorflow")
            if hvd is not None and hvd.is_initialized():
                hvd.shutdown()  # flushes the timeline; the TF process ends with os._exit (no atexit)

    def driver_setup(self, nodes: list[dict]) -> dict:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        slots = horovod_slots(nodes)
        self._server = RendezvousServer(verbose=0)
        port = self._server.start()
        self._server.init([SlotInfo(s["hostname"], s["rank"], s["local_rank"], s["cross_rank"], s["size"],
                                    s["local_size"], s["cross_size"]) for s in slots])
        return {"rendezvous_port": port, "slots": slots}

    def node_env(self, me: dict, nodes: list[dict], config: dict) -> dict[str, str]:
        env = super().node_env(me, nodes, config)
        try:
            import psutil

            iface = interface_for(me["host"], psutil.net_if_addrs())
        except ImportError:
            iface = None
        env.update(self.env_for(me, config, self.options(), config["driver_host"], iface, config.get("log_dir")))
        return env

    def driver_teardown(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @staticmethod
    def env_for(me: dict, config: dict, opts: dict, driver_host: str, iface: str | None,
                log_dir: str | None) -> dict[str, str]:
        """Pure: the HOROVOD_* environment of node ``me``."""
        slot = next((s for s in config["slots"] if s["node_index"] == me["node_index"]), None)
        if slot is None:
            return {}
        env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": driver_host,
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
            base = log_dir or "."
            env["HOROVOD_TIMELINE"] = opts["timeline"] if os.path.isabs(opts["timeline"]) else \
                os.path.join(base.replace("file://", ""), opts["timeline"])
        return env


BACKENDS = {"mwms": MWMSBackend, "ps": PSBackend, "horovod": HorovodBackend}


def make_backend(spec, num_ps: int, transport: str = "grpc", **options) -> Backend:
    """A Backend from a name ('mwms' | 'ps' | 'horovod'), an instance, or None ('mwms').

    The default runs main_fun on every node (as TensorFlowOnSpark did, ps nodes included);
    'ps' must be asked for explicitly, since it runs the servers itself and main_fun on the chief only.
    """
    if isinstance(spec, Backend):
        return spec
    name = spec or "mwms"
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {sorted(BACKENDS)}, got {spec!r}")
    try:
        return BACKENDS[name](transport=transport, **options)
    except TypeError as e:
        raise ConfigError(f"bad option for backend {name!r}: {e}") from None


def from_options(opts: dict) -> Backend:
    """Rebuild the backend in the TF process from ``Backend.options()``."""
    opts = dict(opts)
    name = opts.pop("name")
    return BACKENDS[name](**opts)
