"""Start-up of the TF process and the call of ``main_fun`` (runs in the TF process).

Watch the agent (exit when it dies), hold a TF server port, start the feed hub
(InputMode.SPARK), register with the driver, wait for the whole cluster spec, set TF_CONFIG
and the backend's environment, then call ``main_fun(args, ctx)`` through the backend's node
hooks. The process's entry point (``python -m tfos.node``, ``tfos/node/__main__.py``) writes a
raised exception to ``error.txt`` in the node directory (the agent forwards it to the driver)
and exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os

from tfos.host import claims
from tfos.node.context import NodeContext
from tfos.node.reporting import Reporter
from tfos.topology import InputMode
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


def run_node(cfg: M.NodeConfig) -> int:
    c = cfg.cluster
    driver = DriverClient.for_node(cfg)
    held = claims.reserve_tf_port(os.getpid())
    hub = None
    if c.input_mode == InputMode.SPARK:
        from tfos.node.hub import FeedHub

        hub = FeedHub(c.secret, c.feed_queue_chunks, on_terminate=driver.feed_terminated).start()
    info = M.NodeInfo(cfg.node_index, cfg.job_name, cfg.task_index, cfg.host, held.getsockname()[1],
                      hub.port if hub else 0, os.getpid())
    driver.register(info)
    reply = driver.cluster_spec(c.reservation_timeout)
    main_fun, args, hooks = load_function_file(cfg.fn_path)
    reporter = Reporter(driver, c.report_interval, c.timeline, c.metric_history)
    ctx = NodeContext(cfg, reply.nodes, held, hub, hooks, reporter)
    if hub is not None:
        hub.reporter = reporter
    os.environ["TF_CONFIG"] = json.dumps(ctx.tf_config)
    me = next(n for n in reply.nodes if n.node_index == cfg.node_index)
    os.environ.update(hooks.env(me, reply.nodes, reply.backend))
    logger.info("node %d is %s:%d; TF_CONFIG=%s", ctx.node_index, ctx.job_name, ctx.task_index,
                os.environ["TF_CONFIG"])
    if c.release_port:
        ctx.release_port()
    try:
        with ctx.trace("main_fun", "node"):
            result = hooks.run(main_fun, args, ctx)
        if isinstance(result, str) and result and ctx.is_chief:  # main_fun returned its export path
            ctx.log_model(result)
    finally:
        reporter.close()
    if hub is not None:
        hub.close()
    return 0
