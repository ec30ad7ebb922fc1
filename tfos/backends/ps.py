"""Parameter servers: tf.distribute.Server on ps/worker nodes, ParameterServerStrategy +
ClusterCoordinator on the chief (driver and TF-process halves)."""

from __future__ import annotations

import logging

from tfos.backends.base import Backend, NodeHooks
from tfos.errors import ConfigError
from tfos.topology import CHIEF_JOBS

logger = logging.getLogger(__name__)


class PSNode(NodeHooks):
    def run(self, main_fun, args, ctx):
        if ctx.job_name in ("ps", "worker"):
            import tensorflow as tf

            logger.info("starting tf.distribute.Server for %s:%d", ctx.job_name, ctx.task_index)
            server = tf.distribute.Server(tf.train.ClusterSpec(ctx.cluster_spec), job_name=ctx.job_name,
                                          task_index=ctx.task_index, protocol="grpc", start=True)
            server.join()  # runs until tfos stops this node after the chief finished
            return None
        return main_fun(args, ctx)

    def strategy(self, ctx):
        import tensorflow as tf

        from tfos.tf.collectives import stop_on_sigterm

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        stop_on_sigterm()  # TF's coordination service took SIGTERM over
        return strategy


class PSBackend(Backend):
    """Parameter servers: ps and worker nodes run ``tf.distribute.Server`` (tfos starts it; main_fun
    runs on the chief only), the chief runs ParameterServerStrategy + ClusterCoordinator. The job
    ends when the chief's main_fun returns; ps and worker servers are then stopped.

    With ``max_restarts`` > 0, losing a worker (while another one runs) restarts nothing: the
    coordinator goes on with the other workers (``cluster.lost_nodes`` lists it). Losing a ps or
    the chief restarts every node.

    With InputMode.SPARK only the chief receives fed data (it dispatches batches to the workers
    through the coordinator); InputMode.TENSORFLOW per-worker dataset functions reading file
    shards are the scalable choice.
    """

    name = "ps"
    node_class = PSNode
    finishing_jobs = CHIEF_JOBS
    feed_jobs = CHIEF_JOBS
    # A lost worker: the chief's ClusterCoordinator runs its scheduled functions on the other
    # workers (at least once: a function the lost worker was running may run again). A lost ps
    # takes its variables with it and the coordinator raises, so that restarts every node.
    survivable_jobs = ("worker",)

    def validate(self, num_executors, num_ps, master_node) -> None:
        super().validate(num_executors, num_ps, master_node)
        if num_ps < 1:
            raise ConfigError("backend='ps' needs num_ps >= 1 parameter server node(s)")
        if not master_node:
            raise ConfigError("backend='ps' needs a chief (master_node='chief') to run the ClusterCoordinator")
        if num_executors - num_ps < 2:
            raise ConfigError("backend='ps' needs at least one worker besides the chief: raise num_executors")
