"""How a feeding task gets the cluster's secret (runs in the executors' Python workers, and on
the driver to make the task's function). Spark ships a task's closure as a broadcast block, which
its block managers serve to anyone while spark.authenticate is off, so the closure's FeedConfig
holds no secret; the task takes it from its local property (classic Spark: inside the task launch
message) or from the file a node of the cluster left on this host (docs/security.md)."""

from __future__ import annotations

import dataclasses

from tfos.errors import FeedError
from tfos.host import private
from tfos.wire import messages as M


def closure_config(cfg: M.FeedConfig) -> M.FeedConfig:
    """``cfg`` as a feeding task's closure carries it: without the cluster's secret. Spark ships
    closures as broadcast blocks, which it serves to anyone while spark.authenticate is off."""
    return dataclasses.replace(cfg, key=cfg.key.without_secret())


def task_config(sealed: M.FeedConfig) -> M.FeedConfig:
    """In the feeding task: ``sealed`` with the cluster's secret, from the task's local property
    (classic Spark: the task launch message) or else from the file the cluster's barrier task left
    in this user's private directory on this host (``tfos.host.private.store_cluster_secret``)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    secret = (tc.getLocalProperty(private.SECRET_PROPERTY) if tc is not None else None) or \
        private.load_cluster_secret(sealed.cluster_id)
    if not secret:
        raise FeedError(f"no node of tfos cluster {sealed.cluster_id} ran on this host, so this feeding task of a "
                        "Spark Connect session cannot get the cluster's secret (a node leaves it in this user's "
                        "private directory; it is never in a task's closure: docs/security.md). Under Spark "
                        "Connect, feeding tasks run on the executors that hold the cluster's nodes: reserve a "
                        "node on every executor of the application")
    return dataclasses.replace(sealed, key=sealed.key.with_secret(secret))
