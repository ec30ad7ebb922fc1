"""``ctx``: what ``main_fun(args, ctx)`` learns about its node (runs in the TF process)."""

from __future__ import annotations

import dataclasses
import getpass
import socket

from tfos import topology
from tfos.data.paths import absolute_path, context_default_fs
from tfos.errors import ConfigError, TFOSTimeoutError
from tfos.host.deadline import Deadline
from tfos.wire.messages import NodeConfig, NodeInfo


class NodeContext:
    """What ``main_fun(args, ctx)`` learns about its node (TensorFlowOnSpark-compatible fields).

    Attributes: ``job_name``, ``task_index``, ``node_index`` (== ``executor_id`` == ``worker_num``),
    ``rank`` / ``num_workers`` (index / count among chief+workers; None for ps/evaluator),
    ``num_nodes``, ``nodes``, ``cluster_spec``, ``tf_config``, ``gpus``, ``host``, ``defaultFS``,
    ``working_dir``, ``log_dir``, ``input_mode``, ``mgr`` (the feed hub in InputMode.SPARK),
    ``attempt`` (0, or k after the k-th restart: ``max_restarts``) and ``checkpoint_dir`` (the
    same on every attempt: restore from it). On hdfs://, viewfs:// or s3://, which TensorFlow
    cannot open, ``checkpoint_dir`` and ``log_dir`` are local directories mirrored there
    (``checkpoint_uri``, ``log_uri``; see :mod:`tfos.cluster.node.staging`).
    """

    def __init__(self, cfg: NodeConfig, nodes: tuple[NodeInfo, ...], held_port: socket.socket | None,
                 hub=None, hooks=None, reporter=None, spec_nodes: tuple[NodeInfo, ...] | None = None):
        self._hooks = hooks
        self._cfg = cfg
        self._save_point = None  # ctx.should_checkpoint's place in the driver's save rounds (its first call)
        self._strategy = None
        self._held_port = held_port
        self.reporter = reporter
        self.node_index = cfg.node_index
        self.executor_id = self.node_index
        self.worker_num = self.node_index
        self.job_name = cfg.job_name
        self.task_index = cfg.task_index
        roles = cfg.cluster.roles
        self.rank = topology.training_rank(self.job_name, self.task_index, roles)
        self.num_workers = topology.num_training_nodes(roles)
        self.num_nodes = len(roles)
        self.nodes = [dataclasses.asdict(n) for n in nodes]
        # TF's view: the nodes at their private addresses when the cluster is encrypted (tfos.tunnel)
        self.spec_nodes = tuple(spec_nodes or nodes)  # NodeInfos as TF names them
        self.cluster_spec = topology.cluster_spec(spec_nodes or nodes)
        self.tf_config = topology.tf_config(spec_nodes or nodes, self.node_index)
        self.gpus = list(cfg.gpus)
        self.encrypted = cfg.cluster.key.encrypt  # TF's and Gloo's traffic goes through the node tunnel
        self.host = cfg.host
        self.defaultFS = context_default_fs(cfg.cluster.default_fs)
        self.working_dir = cfg.working_dir
        self.node_dir = cfg.node_dir  # this node's private directory on the executor host (0700)
        self.log_dir = cfg.cluster.log_dir
        self.attempt = cfg.cluster.attempt  # 0 on the first start, k after the k-th restart (max_restarts)
        self.checkpoint_dir = cfg.cluster.checkpoint_dir  # the same on every attempt: restore from it
        # what reserve() named; checkpoint_dir / log_dir are local stand-ins for schemes TF cannot
        # open (hdfs://, viewfs://, s3://), mirrored to these (tfos.cluster.node.staging)
        self.checkpoint_uri = self.checkpoint_dir
        self.log_uri = self.log_dir
        self.input_mode = topology.InputMode(cfg.cluster.input_mode)
        self.mgr = hub
        self.tmp_socket = held_port

    @property
    def is_chief(self) -> bool:
        """True on the node that should write checkpoints / exports (chief, else worker 0)."""
        return self.rank == 0

    def absolute_path(self, path: str) -> str:
        """Resolve ``path`` against the cluster's default filesystem (hdfs://... or file://)."""
        return absolute_path(path, self.defaultFS, self.working_dir, getpass.getuser())

    def strategy(self):
        """The backend's ``tf.distribute`` strategy (MultiWorkerMirroredStrategy with the configured
        CommunicationOptions, or ParameterServerStrategy on the chief), created once."""
        if self._strategy is None:
            self.release_port()
            self._strategy = self._hooks.strategy(self)
        return self._strategy

    def horovod_compression(self):
        """``hvd.Compression.fp16`` when the cluster was reserved with compression='fp16', else none."""
        import horovod.tensorflow as hvd

        return hvd.Compression.fp16 if getattr(self._hooks, "compression", None) == "fp16" else hvd.Compression.none

    def release_port(self) -> None:
        """Free the held TF server port (done before main_fun unless release_port=False)."""
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None
            self.tmp_socket = None

    def all_gather(self, key: str, value: int, timeout: float = 600.0) -> list[int]:
        """Every training rank's ``value`` (an int) for ``key``, by rank, once every rank gave its own:
        a barrier with data, through the driver, for small things such as record counts or step
        plans (tensors go through the collectives). Every chief/worker must call it with the same
        key; ps/evaluator nodes cannot. Raises TFOSTimeoutError naming the ranks still missing after
        ``timeout`` seconds."""
        return [v for v, _ in self._gather(key, int(value), "", timeout)]

    def all_gather_text(self, key: str, text: str, timeout: float = 600.0) -> list[str]:
        """:meth:`all_gather` for strings (at most 64 KiB each): every training rank's ``text``, by rank."""
        if not isinstance(text, str):
            raise TypeError(f"all_gather_text takes a str, got {type(text).__name__}")
        return [t for _, t in self._gather(key, 0, text, timeout)]

    def _gather(self, key: str, value: int, text: str, timeout: float) -> list[tuple[int, str]]:
        if self.rank is None:
            raise ConfigError(f"all_gather is for the training ranks (chief and workers), not {self.job_name}")
        deadline = Deadline(timeout)
        while True:
            reply = self.reporter.driver.gather(key, value, wait=deadline.slice(5.0), text=text)
            if reply.values:
                return list(zip(reply.values, reply.texts or ("",) * len(reply.values)))
            if deadline.expired():
                raise TFOSTimeoutError(f"ranks {list(reply.missing)} did not give their value for all_gather({key!r}) "
                                       f"within {timeout:.0f}s; raise all_gather(timeout=...)")

    def get_data_feed(self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                      input_mapping=None):
        """The data feed of InputMode.SPARK (see :class:`tfos.DataFeed`)."""
        from tfos.feed.node.datafeed import DataFeed

        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def report(self, **values) -> None:
        """Progress values (step, loss, examples_per_sec, ...) for the driver's progress bar and
        ``cluster.metrics()``, and the metric history of the MLflow run (``mlflow=True``; with its
        ``step`` when given). Cheap to call every step: sent at most once per report_interval."""
        self.reporter.record(values)

    def log_model(self, path: str) -> None:
        """Name the exported model (a SavedModel directory) that the driver logs with the MLflow
        run at shutdown; ``path`` must be readable by the driver (shared storage)."""
        self.reporter.flush()
        self.reporter.driver.log_model(self.absolute_path(path))

    def checkpoint_saved(self, step: int | None = None, rows: int | None = None) -> None:
        """Tell the driver that this rank just wrote a checkpoint (at ``step``, the program's step or
        epoch): a safe point. A cluster running smaller than ``num_executors`` grows back there when
        Spark offers more slots (a planned restart from that checkpoint; docs/elastic.md). Rank 0's
        call counts; cheap enough to call after every save. After a save that
        ``should_checkpoint`` asked for (a node must go), every rank's call waits here for the
        restart from it (at most ``eviction_grace``), so no step is done that the checkpoint lacks.

        InputMode.SPARK: call it on every rank after each save, with the step. Each rank then sends
        the rows of the current feed its steps have taken (its position), and a restart from this
        checkpoint feeds the rest of the epoch instead of all of it (docs/elastic.md). By default
        those are the rows ``next_batch``/``batches`` handed out; with ``dataset()``, whose
        tf.data pipeline reads ahead of the steps, give ``rows``: the rows this rank's steps took
        from the current feed in this attempt (its steps on it times its batch size)."""
        hub = self.mgr if self.rank is not None and step is not None else None
        at = hub.position(rows) if hasattr(hub, "position") else None
        if at is not None:
            self.reporter.driver.feed_position(at[0], int(step), at[1])
        if self.rank == 0:
            self.reporter.flush()
            self.reporter.driver.checkpoint_saved(-1 if step is None else int(step))
        if self._save_point is not None and step is not None:
            self._save_point.after_save(step)

    def should_checkpoint(self, step: int) -> bool:
        """Call on every training rank after each step with the steps done so far (the count
        ``ctx.checkpoint_saved`` gets): True on every rank at the same step when a node of the
        cluster must go (an eviction notice, docs/elastic.md). Then save a checkpoint (on every rank,
        as the backend saves) and, on rank 0, call ``ctx.checkpoint_saved(step)``: the cluster goes
        on without that node from this checkpoint, and the next call waits for that restart, so no
        step is lost. While a save is being agreed on a call may wait (at most ``eviction_grace``)
        for the step every rank checkpoints at. Cheap otherwise: a lock and a comparison."""
        if self._save_point is None:
            if self.rank is None:
                raise ConfigError(f"should_checkpoint is for the training ranks (chief and workers), not "
                                  f"{self.job_name}")
            self._save_point = self._new_save_point()
        return self._save_point.check(step)

    def _new_save_point(self, on_round=None):
        """This rank's place in the driver's save rounds, with a driver connection of its own
        (``on_round``: TF's preemption handler agrees on the step, :mod:`tfos.cluster.node.preemption`)."""
        from tfos.cluster.node.saving import SavePoint
        from tfos.wire.clients import DriverClient

        return SavePoint(DriverClient.for_node(self._cfg), self._cfg.cluster.eviction_grace, on_round)

    def send_result(self, value) -> None:
        """Hand ``value`` to the driver as this node's result (``cluster.results``; TFDistributor
        returns rank 0's). It crosses without pickle (:mod:`tfos.wire.values`): numbers, strings,
        bytes, numpy arrays and lists/tuples/dicts of them; ConfigError names anything else."""
        from tfos.wire import values

        tree = values.encode(value, f"the result of rank {self.rank}")
        self.reporter.flush()
        self.reporter.driver.send_result(tree)

    def trace(self, name: str, cat: str = "step", **args):
        """Context manager recording a span on the cluster timeline (``timeline=`` on reserve)."""
        return self.reporter.trace(name, cat, **args)

    def __repr__(self):
        return (f"NodeContext(node_index={self.node_index}, job_name={self.job_name!r}, "
                f"task_index={self.task_index}, rank={self.rank}, gpus={self.gpus})")
