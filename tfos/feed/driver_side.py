"""Driver side of InputMode.SPARK: run the feeding Spark jobs, end feeds, watch the nodes."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid

from tfos import protocol as P
from tfos.errors import FeedError, FeedTimeoutError, TFOSError
from tfos.feed.consumer import SHUTDOWN_FEED
from tfos.feed.producer import make_inference_feeder, make_train_feeder

logger = logging.getLogger(__name__)


def _is_dataframe(data) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


def feed_config(cluster, qname: str, feed_timeout: float, chunk_rows) -> dict:
    nodes = {n["node_index"]: n for n in cluster.nodes}
    feed_nodes = [i for i in cluster.state.feed_ranks]
    return dict(cluster_id=cluster.cluster_id, secret=cluster._secret, driver_host=cluster.driver_host,
                driver_port=cluster.server.port, feed_id=uuid.uuid4().hex[:12], qname=qname,
                feed_timeout=float(feed_timeout), chunk_rows=chunk_rows, feed_nodes=feed_nodes,
                feed_addresses={str(i): (nodes[i]["host"], nodes[i]["feed_port"]) for i in feed_nodes})


def _spark_error(e: BaseException) -> TFOSError:
    """Turn a failed feeding job's Py4J error into the tfos error raised in the task."""
    text = str(e)
    for cls in (FeedTimeoutError, FeedError):
        marker = f"tfos.errors.{cls.__name__}: "
        if marker in text:
            detail = text.split(marker, 1)[1].split("\n", 1)[0]
            return cls(detail)
    return TFOSError(f"the feeding Spark job failed: {text.strip().splitlines()[0] if text.strip() else e!r}")


def run_job(cluster, description: str, action):
    """Run ``action()`` (a Spark action) in a job group; fail fast if a node fails meanwhile."""
    group = f"tfos-feed-{uuid.uuid4().hex[:8]}"
    box: dict = {}
    done = threading.Event()

    def target():
        try:
            cluster.sc.setJobGroup(group, description, interruptOnCancel=True)
            box["result"] = action()
        except BaseException as e:
            box["error"] = e
        finally:
            done.set()
            with cluster.state.cond:
                cluster.state.cond.notify_all()

    t = threading.Thread(target=target, name=group, daemon=True)
    t.start()
    with cluster.state.cond:
        while not done.is_set() and not cluster.state.failures:
            cluster.state.cond.wait(0.5)
    if cluster.state.failures and not done.is_set():
        cluster.sc.cancelJobGroup(group)
        t.join(30)
        cluster.raise_if_failed()
    t.join()
    if "error" in box:
        with cluster.state.cond:
            cluster.state.cond.wait_for(lambda: bool(cluster.state.failures), timeout=3.0)
        cluster.raise_if_failed()
        err = _spark_error(box["error"])
        cluster._abort(err)  # a broken feed leaves nodes waiting for data: stop them; later calls re-raise
        raise err from None
    return box["result"]


def train(cluster, data, num_epochs: int, feed_timeout: float, qname: str, chunk_rows=None) -> int:
    cfg = feed_config(cluster, qname, feed_timeout, chunk_rows)
    if _is_dataframe(data):
        feeder = make_train_feeder(cfg, arrow_input=True)
        epochs = functools.reduce(lambda a, b: a.unionAll(b), [data] * num_epochs)
        action = lambda: sum(r[0] for r in epochs.mapInArrow(feeder, "rows long").collect())  # noqa: E731
    else:
        feeder = make_train_feeder(cfg, arrow_input=False)
        epochs = data if num_epochs == 1 else cluster.sc.union([data] * num_epochs)
        action = lambda: sum(epochs.mapPartitionsWithIndex(feeder).collect())  # noqa: E731
    t0 = time.monotonic()
    wall0 = time.time()
    total = run_job(cluster, f"tfos feed {cfg['feed_id']} ({num_epochs} epochs)", action)
    with cluster.state.cond:
        per_node = dict(cluster.state.feed_rows.pop(cfg["feed_id"], {}))
    for node, rows in per_node.items():
        cluster.feed_rows_total[node] = cluster.feed_rows_total.get(node, 0) + rows
    cluster.driver_events.append({"name": f"feed job {cfg['feed_id']}", "cat": "feed", "ph": "X",
                                  "ts": int(wall0 * 1e6), "dur": int((time.time() - wall0) * 1e6),
                                  "args": {"rows": total, "epochs": num_epochs, "per_node": str(per_node)}})
    for node in cfg["feed_nodes"]:
        with cluster.state.cond:
            if cluster.state.finished_reading(node):
                continue
        host, port = cfg["feed_addresses"][str(node)]
        try:
            P.call((host, port), cfg["secret"], P.FeedEnd(cfg["feed_id"], qname, per_node.get(node, 0)),
                   timeout=feed_timeout, what=f"feed of node {node}", setting="feed_timeout", retry=False)
        except (TFOSError, OSError):
            with cluster.state.cond:
                cluster.state.cond.wait_for(lambda: cluster.state.nodes[node].exited is not None, timeout=5)
                if cluster.state.finished_reading(node):
                    continue
            cluster.raise_if_failed()
            err = TFOSError(f"could not end the feed on node {node}")
            cluster._abort(err)
            raise
    secs = time.monotonic() - t0
    logger.info("tfos fed %d rows in %.1fs (%.0f rows/s); per node: %s", total, secs, total / max(secs, 1e-9),
                per_node)
    return total


def inference(cluster, data, feed_timeout: float, qname: str, chunk_rows=None, output_column="prediction",
              output_type=None):
    cfg = feed_config(cluster, qname, feed_timeout, chunk_rows)
    cfg["result_column"] = output_column
    if _is_dataframe(data):
        if output_type is None:
            raise FeedError("DataFrame inference needs output_type, the Spark SQL type of one result "
                            "(e.g. 'double', 'array<float>')")
        from pyspark.sql.types import StructField, StructType, _parse_datatype_string

        from pyspark.sql.pandas.types import to_arrow_type

        result_type = _parse_datatype_string(output_type)
        cfg["result_arrow_type"] = to_arrow_type(result_type)
        schema = StructType(list(data.schema.fields) + [StructField(output_column, result_type)])
        return data.mapInArrow(make_inference_feeder(cfg, arrow_input=True), schema)
    return data.mapPartitionsWithIndex(make_inference_feeder(cfg, arrow_input=False))


def close_feeds(cluster) -> None:
    """Tell every feeding node that no more data will come (their feeds end)."""
    for n in cluster.nodes:
        if n["node_index"] not in cluster.state.feed_ranks or not n.get("feed_port"):
            continue
        if cluster.state.nodes[n["node_index"]].exited is not None:
            continue
        try:
            P.call((n["host"], n["feed_port"]), cluster._secret, P.FeedEnd(SHUTDOWN_FEED, "input", 0),
                   timeout=10.0, what=f"feed of node {n['node_index']}", retry=False)
        except (TFOSError, OSError) as e:
            logger.info("could not close the feed of node %d: %s", n["node_index"], e)
