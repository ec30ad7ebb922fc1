"""The TF process: one per node, started by the node agent. Runs the user's ``main_fun``.

Startup: watch the agent (exit when it dies), hold a TF server port, start the feed hub
(InputMode.SPARK), register with the driver, wait for the whole cluster spec, set TF_CONFIG,
then call ``main_fun(args, ctx)``. A raised exception is written to ``error.txt`` in the
node directory (the agent forwards it to the driver) and the process exits non-zero.

Run as ``python -m tfos.cluster.tf_node`` with the node configuration as one JSON line on stdin.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import sys
import traceback

from tfos import protocol as P
from tfos.cluster import decisions, host

logger = logging.getLogger("tfos.cluster.tf_node")


class NodeContext:
    """What ``main_fun(args, ctx)`` learns about its node (TensorFlowOnSpark-compatible fields).

    Attributes: ``job_name``, ``task_index``, ``node_index`` (== ``executor_id`` == ``worker_num``),
    ``rank`` / ``num_workers`` (index / count among chief+workers; None for ps/evaluator),
    ``num_nodes``, ``cluster_spec``, ``tf_config``, ``gpus``, ``host``, ``defaultFS``,
    ``working_dir``, ``log_dir``, ``mgr`` (the feed hub in InputMode.SPARK).
    """

    def __init__(self, cfg: dict, nodes: list[dict], held_port: socket.socket | None, hub=None, backend=None):
        self._cfg = cfg
        self._backend = backend
        self._strategy = None
        self._held_port = held_port
        self.node_index = cfg["node_index"]
        self.executor_id = self.node_index
        self.worker_num = self.node_index
        self.job_name = cfg["job_name"]
        self.task_index = cfg["task_index"]
        roles = [tuple(r) for r in cfg["roles"]]
        self.rank = decisions.training_rank(self.job_name, self.task_index, roles)
        self.num_workers = decisions.num_training_nodes(roles)
        self.num_nodes = len(roles)
        self.nodes = nodes
        self.cluster_spec = decisions.cluster_spec(nodes)
        self.tf_config = decisions.tf_config(nodes, self.node_index)
        self.gpus = list(cfg["gpus"])
        self.host = cfg["host"]
        self.defaultFS = cfg["default_fs"]
        self.working_dir = cfg["working_dir"]
        self.log_dir = cfg.get("log_dir")
        self.input_mode = decisions.InputMode(cfg["input_mode"])
        self.mgr = hub
        self.tmp_socket = held_port

    @property
    def is_chief(self) -> bool:
        """True on the node that should write checkpoints / exports (chief, else worker 0)."""
        return self.rank == 0

    def absolute_path(self, path: str) -> str:
        """Resolve ``path`` against the cluster's default filesystem (hdfs://... or file://)."""
        return decisions.absolute_path(path, self.defaultFS, self.working_dir, getpass.getuser())

    def strategy(self):
        """The backend's ``tf.distribute`` strategy (MultiWorkerMirroredStrategy with the configured
        CommunicationOptions, or ParameterServerStrategy on the chief), created once."""
        if self._strategy is None:
            self.release_port()
            self._strategy = self._backend.strategy(self)
        return self._strategy

    def horovod_compression(self):
        """``hvd.Compression.fp16`` when the cluster was reserved with compression='fp16', else none."""
        import horovod.tensorflow as hvd

        return hvd.Compression.fp16 if self._cfg["backend"].get("compression") == "fp16" else hvd.Compression.none

    def release_port(self) -> None:
        """Free the held TF server port (done before main_fun unless release_port=False)."""
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None
            self.tmp_socket = None

    def get_data_feed(self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                      input_mapping=None):
        """The data feed of InputMode.SPARK (see tfos.feed)."""
        from tfos.feed.consumer import DataFeed

        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def report(self, **values) -> None:
        """Progress values (step, loss, examples_per_sec, ...) for the driver's progress bar and
        ``cluster.metrics()``. Cheap to call every step: sent at most once per report_interval."""
        self.reporter.report(values)

    def trace(self, name: str, cat: str = "step", **args):
        """Context manager recording a span on the cluster timeline (``timeline=`` on reserve)."""
        return self.reporter.trace(name, cat, **args)

    def __repr__(self):
        return (f"NodeContext(node_index={self.node_index}, job_name={self.job_name!r}, "
                f"task_index={self.task_index}, rank={self.rank}, gpus={self.gpus})")


def run_node(cfg: dict) -> int:
    driver = (cfg["driver_host"], cfg["driver_port"])
    held = host.reserve_tf_port(os.getpid())
    hub = None
    feed_port = 0
    if cfg["input_mode"] == decisions.InputMode.SPARK:
        from tfos.feed.consumer import FeedHub

        def on_terminate(qname):
            P.call(driver, cfg["secret"], P.FeedTerminated(cfg["cluster_id"], cfg["node_index"], qname), timeout=10.0)

        hub = FeedHub(cfg["secret"], cfg.get("feed_queue_chunks", 4), on_terminate=on_terminate).start()
        feed_port = hub.port
    info = P.NodeInfo(cfg["node_index"], cfg["job_name"], cfg["task_index"], cfg["host"],
                      held.getsockname()[1], feed_port, os.getpid())
    P.call(driver, cfg["secret"], P.RegisterNode(cfg["cluster_id"], info.__dict__), timeout=30.0)
    timeout = float(cfg["reservation_timeout"])
    reply = P.call(driver, cfg["secret"], P.GetClusterSpec(cfg["cluster_id"], cfg["node_index"], timeout),
                   timeout=timeout + 30.0, setting="reservation_timeout")
    nodes = reply.nodes
    from tfos.backends import from_options

    backend = from_options(cfg["backend"])
    ctx = NodeContext(cfg, nodes, held, hub, backend)
    from tfos.cluster.node_reporting import Reporter

    ctx.reporter = Reporter(cfg, cfg.get("report_interval", 1.0), bool(cfg.get("timeline")))
    if hub is not None:
        hub.reporter = ctx.reporter
    os.environ["TF_CONFIG"] = json.dumps(ctx.tf_config)
    me = next(n for n in nodes if n["node_index"] == ctx.node_index)
    os.environ.update(backend.node_env(me, nodes, reply.backend))
    logger.info("node %d is %s:%d; TF_CONFIG=%s", ctx.node_index, ctx.job_name, ctx.task_index,
                os.environ["TF_CONFIG"])
    from pyspark import cloudpickle

    with open(cfg["fn_path"], "rb") as f:
        main_fun, args = cloudpickle.load(f)
    os.remove(cfg["fn_path"])
    if cfg.get("release_port", True):
        ctx.release_port()
    try:
        with ctx.trace("main_fun", "node"):
            backend.run_node(main_fun, args, ctx)
    finally:
        ctx.reporter.close()
    if hub is not None:
        hub.close()
    return 0


def main() -> int:
    cfg = json.loads(sys.stdin.readline())
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host.start_pipe_watchdog(cfg["watchdog_fd"], lambda: os._exit(70))
    if cfg.get("sys_path"):
        sys.path[:0] = [p for p in cfg["sys_path"] if p not in sys.path]
    code = 1
    try:
        code = run_node(cfg)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _write_error(cfg, traceback.format_exc())
    except BaseException:
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        _write_error(cfg, tb)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: TF's and user threads must not keep a finished node alive at interpreter exit.
    os._exit(code)


def _write_error(cfg: dict, tb: str) -> None:
    try:
        with open(os.path.join(cfg["node_dir"], "error.txt"), "w") as f:
            f.write(tb)
    except OSError:
        pass


if __name__ == "__main__":
    main()
