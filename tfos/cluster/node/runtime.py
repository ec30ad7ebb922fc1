"""Start-up of the TF process and the call of ``main_fun`` (runs in the TF process).

Watch the agent (exit when it dies), hold a TF server port (or, with the node tunnel, check
that TF and Gloo will live in the node's private network), start the feed hub
(InputMode.SPARK), register with the driver, wait for the whole cluster spec, hand the tunnel the
other nodes, set TF_CONFIG (private addresses with the tunnel) and the backend's environment,
then call ``main_fun(args, ctx)`` through the backend's node hooks. The process's entry point
(``python -m tfos.cluster.node``, ``tfos/cluster/node/__main__.py``) writes a raised exception to
``error.txt`` in the node directory (the agent forwards it to the driver) and exits non-zero.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
import threading

from tfos.errors import CollectiveError, TFOSError, TFOSTimeoutError, collective_error
from tfos.data import tfhdfs
from tfos.host import claims
from tfos.cluster.node import control, staging
from tfos.cluster.node.context import NodeContext
from tfos.cluster.node.reporting import LineTee, Reporter, streams_output
from tfos.topology import REDUCER_JOB, InputMode, reducers_environment
from tfos.tunnel import node as tunnel_node
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)


def load_function_file(path: str):
    """``(main_fun, args, node_hooks)`` from the node's private function file (written by the
    barrier task with cloudpickle; deleted once read)."""
    from pyspark import cloudpickle

    # The file is 0600 in a fresh 0700 directory of this user (tfos.host.private); never follow a link.
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        loaded = cloudpickle.load(f)
    os.remove(path)
    return loaded


def preimport_tensorflow() -> threading.Thread | None:
    """Import TensorFlow in a daemon thread, so that its import (seconds) overlaps the wait for the
    other nodes and main_fun finds it loaded. Join the thread before anything else may import
    TF: a concurrent import of its modules can see them half initialised. None when TensorFlow
    is not installed."""
    if importlib.util.find_spec("tensorflow") is None:
        return None

    def run():
        try:
            importlib.import_module("tensorflow")
        except Exception as e:  # main_fun's own import reports it
            logger.debug("pre-importing tensorflow failed: %s", e)

    thread = threading.Thread(target=run, name="tfos-import-tensorflow", daemon=True)
    thread.start()
    return thread


def run_main(hooks, main_fun, args, ctx):
    """``main_fun`` through the backend's hooks. A TF error that carries a tfos collective op's
    error (the reduction server's) is raised as :class:`tfos.errors.CollectiveError`, from it."""
    try:
        return hooks.run(main_fun, args, ctx)
    except Exception as e:
        message = getattr(e, "message", None)
        carried = collective_error(message) if isinstance(message, str) else None
        if carried is not None and not isinstance(e, CollectiveError):
            raise carried from e
        raise


def run_node(cfg: M.NodeConfig) -> int:
    c = cfg.cluster
    driver = DriverClient.for_node(cfg)
    tunnel = cfg.tunnel
    if tunnel is not None:  # TF and Gloo live in the node's private network: refuse to run if they would not
        tunnel_node.require_shim()
        # TF's port is in the private network, where nothing else listens: held only for ctx.tmp_socket
        held = None if c.release_port else tunnel_node.hold_tf_port(tunnel)
    else:
        held = claims.reserve_tf_port(os.getpid())
    control.publish(cfg)  # for the code main_fun runs (Gloo's rendezvous through the driver, run_script)
    hub = None
    if c.input_mode == InputMode.SPARK:
        from tfos.feed.node.hub import FeedHub

        hub = FeedHub(c.key, c.feed_queue_chunks, on_terminate=driver.feed_terminated,
                      gate_client=lambda: DriverClient.for_node(cfg)).start()
    info = M.NodeInfo(cfg.node_index, cfg.job_name, cfg.task_index, cfg.host,
                      tunnel.tf_port if tunnel else held.getsockname()[1], hub.port if hub else 0, os.getpid(),
                      tunnel.port if tunnel else 0, tunnel.mode if tunnel else "",
                      tunnel.control if tunnel and tunnel.mode == "netns" else "")
    with DriverClient.for_node(cfg).session(timeout=c.reservation_timeout + 60.0) as start:  # one handshake
        start.register(info)
        # a reducer never imports TF (tfos.tf.reduction sums with PyTorch's kernels)
        importing = preimport_tensorflow() if c.preimport_tensorflow and cfg.job_name != REDUCER_JOB else None
        reply = start.cluster_spec(c.reservation_timeout)
    if importing is not None:  # nothing else may import TF meanwhile (it would see half a module)
        importing.join(c.reservation_timeout)
        if importing.is_alive():
            raise TFOSTimeoutError(f"importing tensorflow took longer than {c.reservation_timeout:g} s "
                                   "(reservation_timeout)")
    if "tensorflow" in sys.modules:  # TF opens hdfs:// itself when tfos's plugin is built (tfos.data.tfhdfs)
        tfhdfs.register(build_missing=c.default_fs.startswith(("hdfs:", "viewfs:")))
    main_fun, args, hooks = load_function_file(cfg.fn_path)
    if tunnel is not None:  # before TF or Gloo may connect to another node
        tunnel_node.connect_peers(tunnel, reply.nodes, cfg.node_index, cfg.host)
    # the reports keep one connection: thousands of nodes reporting each second cost the driver
    # no handshake each (the node's other requests are rare and take their own)
    reporter = Reporter(DriverClient.for_node(cfg).keep_connection(), c.report_interval, c.timeline,
                        c.metric_history)
    ctx = NodeContext(cfg, reply.nodes, held, hub, hooks, reporter,
                      spec_nodes=tunnel_node.spec_nodes(tunnel, reply.nodes))
    if streams_output(c.node_output, ctx.rank):  # main_fun's prints: the node log and the driver's console
        sys.stdout = LineTee(sys.stdout, reporter.output)
        sys.stderr = LineTee(sys.stderr, reporter.output)
    if hub is not None:
        hub.reporter = reporter
    os.environ["TF_CONFIG"] = json.dumps(ctx.tf_config)
    me = next(n for n in reply.nodes if n.node_index == cfg.node_index)
    os.environ.update(hooks.env(me, reply.nodes, reply.backend))
    os.environ.update(reducers_environment(reply.nodes))  # the workers may all-reduce through them
    logger.info("node %d is %s:%d; TF_CONFIG=%s", ctx.node_index, ctx.job_name, ctx.task_index,
                os.environ["TF_CONFIG"])
    if c.release_port:
        ctx.release_port()
    mirrors = staging.stage(ctx, cfg.node_dir)  # hdfs:// checkpoint_dir / log_dir: local stand-ins
    failed = True
    try:
        with ctx.trace("main_fun", "node"):
            if cfg.job_name == REDUCER_JOB:  # no main_fun: the reduction server, until the workers end
                result = hooks.serve_reducer(cfg, ctx.spec_nodes)
            else:
                result = run_main(hooks, main_fun, args, ctx)
        if isinstance(result, str) and result and ctx.is_chief:  # main_fun returned its export path
            ctx.log_model(result)
        failed = False
    finally:
        reporter.close()
        for m in mirrors:  # the last uploads, before the node reports its exit
            try:
                m.close()
            except TFOSError:
                if not failed:
                    raise
                logger.exception("after main_fun failed, its files could not all be uploaded")
    if hub is not None:
        hub.close()
    return 0
