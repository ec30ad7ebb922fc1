"""TensorFlowOnSpark's ``TFNode`` module (TF process): ``TFNode.DataFeed(ctx.mgr, train_mode, qname_in,
qname_out, input_mapping)``, ``TFNode.hdfs_path(ctx, path)``, ``TFNode.release_port(ctx)``; the TF 1.x
calls TensorFlowOnSpark 2.x itself refused raise ConfigError naming what replaces them."""

from __future__ import annotations

from tfos.errors import ConfigError


def DataFeed(mgr, train_mode=True, qname_in="input", qname_out="output", input_mapping=None):  # noqa: N802
    from tfos.feed.node.datafeed import DataFeed

    return DataFeed(mgr, train_mode, qname_in, qname_out, input_mapping)


def hdfs_path(ctx, path):
    """TensorFlowOnSpark's ``TFNode.hdfs_path``: reads only ``ctx.defaultFS`` and
    ``ctx.working_dir``, so any context object of the older shape works."""
    import getpass

    from tfos.data.paths import absolute_path

    return absolute_path(path, ctx.defaultFS, ctx.working_dir, getpass.getuser())


def release_port(ctx) -> None:
    """Close the socket that holds this node's TF port (``ctx.release_port()``)."""
    ctx.release_port()


def start_cluster_server(ctx, num_gpus=1, rdma=False):
    raise ConfigError("TFNode.start_cluster_server is TF 1.x only (TensorFlowOnSpark 2.x refused it on TF 2 as "
                      "well): use a tf.distribute strategy (ctx.strategy(), or MultiWorkerMirroredStrategy "
                      "reads TF_CONFIG, which tfos sets)")


def export_saved_model(sess, export_dir, tag_set, signatures):
    raise ConfigError("TFNode.export_saved_model takes a TF 1.x Session (TensorFlowOnSpark 2.x refused it on "
                      "TF 2 as well): use tfos.compat.export_saved_model(model, export_dir, is_chief)")


def next_batch(mgr, batch_size, qname="input"):
    raise ConfigError("TFNode.next_batch was removed in TensorFlowOnSpark 2.x: use "
                      "TFNode.DataFeed(ctx.mgr).next_batch(batch_size)")


def batch_results(mgr, results, qname="output"):
    raise ConfigError("TFNode.batch_results was removed in TensorFlowOnSpark 2.x: use "
                      "TFNode.DataFeed(ctx.mgr, False).batch_results(results)")


def terminate(mgr, qname="input"):
    raise ConfigError("TFNode.terminate was removed in TensorFlowOnSpark 2.x: use TFNode.DataFeed(ctx.mgr).terminate()")
