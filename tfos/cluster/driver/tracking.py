"""One MLflow run per cluster, logged from the driver (``reserve(..., mlflow=True | mlflow_run=...)``).

Nodes never talk to the MLflow server: their ``ctx.report(...)`` calls (and the Keras progress
callback's) reach the driver in the Report messages they already send, and this module logs them:

* params: the reserve()/run() arguments and ``args`` (prefixed ``args.``), at start;
* metrics: every reported number with its ``step`` (a per-node counter when the call gave none),
  per rank as ``rank<r>/<name>`` (``<job><task>/<name>`` for ps/evaluator nodes), and, when every
  training rank reported the same step, their mean as ``<name>``;
* artifacts at shutdown: ``tfos/summary.json`` (nodes, last values, exit codes), ``tfos/ranks.txt``
  (the per-rank table) and the merged timeline if one was written;
* the model named by ``ctx.log_model(path)`` (the chief's if several), as an MLflow pyfunc model
  wrapping the SavedModel (``mlflow.pyfunc.load_model(uri).predict(df)``), if the run succeeded.

MLflow calls run on one background thread fed by a bounded queue, so a slow tracking server
never stalls the control service; failures to log are warnings, never training errors.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import tempfile
import threading
import time

import mlflow
import numpy as np
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

#: Entries waiting to be logged; beyond this the newest are dropped (and counted).
MAX_PENDING = 50000
#: How long shutdown waits for the queued metrics to reach the tracking server.
FINISH_TIMEOUT_SECS = 60.0
_SKIP = {"t", "step", "time", "epoch_time"}
_BAD_KEY = re.compile(r"[^\w\-. /]")


def metric_points(entries, node_label: str, counter_start: int = 0):
    """Pure: ``[(key, value, step, timestamp_ms)]`` for one node's report entries (numbers only);
    returns them and the next counter value (the step of entries that gave none)."""
    points, counter = [], counter_start
    for e in entries:
        step = e.get("step")
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            step, counter = counter, counter + 1
        ts = int(float(e.get("t", time.time())) * 1000)
        for k, v in e.items():
            if k in _SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                continue
            points.append((f"{node_label}/{_BAD_KEY.sub('_', k)}", float(v), int(step), ts))
    return points, counter


def flatten_params(values: dict, prefix: str = "") -> dict[str, str]:
    """Pure: nested dicts flattened with dots, values as strings of at most 500 characters."""
    out = {}
    for k, v in values.items():
        key = _BAD_KEY.sub("_", f"{prefix}{k}")
        if isinstance(v, dict) and v:
            out.update(flatten_params(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


def args_params(args) -> dict[str, str]:
    """``main_fun``'s args as params: an argparse Namespace/dict by name, an argv list as one value."""
    if args is None:
        return {}
    if isinstance(args, dict):
        return flatten_params(args, "args.")
    if hasattr(args, "__dict__") and not isinstance(args, (str, bytes, list, tuple)):
        return flatten_params({k: v for k, v in vars(args).items() if not k.startswith("_")}, "args.")
    return {"args": str(args)[:500]}


def chosen_model(roles, paths: dict) -> str | None:
    """Pure: the model to log: the chief's (or master's) ``ctx.log_model`` path, else any node's."""
    for i, (job, _) in enumerate(roles):
        if job in ("chief", "master") and i in paths:
            return paths[i]
    return next(iter(paths.values()), None)


def attach(registry, roles, cluster_id: str, run, experiment, params: dict) -> "MlflowTracker":
    """Open the cluster's run, log the reserve arguments and route the nodes' report history to it."""
    from tfos.topology import training_rank

    ranks = [training_rank(job, idx, roles) for job, idx in roles]
    tracker = MlflowTracker(run, experiment, run_name=f"tfos-{cluster_id}",
                            training_ranks=sum(r is not None for r in ranks))
    tracker.log_params(dict(flatten_params(params), cluster_id=cluster_id))

    def on_history(node_index: int, entries: list) -> None:
        job, idx = roles[node_index]
        rank = ranks[node_index]
        tracker.add(node_index, f"rank{rank}" if rank is not None else f"{job}{idx}", rank, entries)

    registry.on_history = on_history
    return tracker


class _Averager:
    """Means across training ranks of a metric at one step, once every rank reported it."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.pending: dict[tuple[str, int], dict[int, tuple[float, int]]] = {}

    def add(self, name: str, step: int, rank: int, value: float, ts: int):
        seen = self.pending.setdefault((name, step), {})
        seen[rank] = (value, ts)
        if len(seen) < self.ranks:
            return None
        del self.pending[(name, step)]
        return name, float(np.mean([v for v, _ in seen.values()])), step, max(t for _, t in seen.values())


class MlflowTracker:
    def __init__(self, run=None, experiment: str | None = None, run_name: str | None = None, training_ranks: int = 1):
        """``run``: None (create a run, end it at shutdown), a run id or an ``mlflow.ActiveRun``
        (log into it; the caller ends it)."""
        self.client = MlflowClient()
        if run is None:
            exp_name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
            exp = self.client.get_experiment_by_name(exp_name)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(exp_name)
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags={"tfos": "1"}).info.run_id
            self.owns_run = True
        else:
            self.run_id = run if isinstance(run, str) else run.info.run_id
            self.owns_run = False
        self._queue: queue.Queue = queue.Queue(MAX_PENDING)
        self._counters: dict[int, int] = {}
        self._averager = _Averager(max(1, training_ranks))
        self._dropped = 0
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="tfos-mlflow", daemon=True)
        self._thread.start()
        logger.info("tfos logs this cluster to MLflow run %s (%s)", self.run_id, mlflow.get_tracking_uri())

    def _warn(self, what: str, e: Exception) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("MLflow: could not %s (%s: %s); training goes on", what, type(e).__name__, e)

    def log_params(self, params: dict[str, str]) -> None:
        items = [Param(k, v) for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i:i + 100])
        except Exception as e:  # noqa: BLE001 (logging must not fail the cluster)
            self._warn("log params", e)

    def add(self, node_index: int, node_label: str, rank: int | None, entries: list) -> None:
        """Called by the control service with one node's new report entries (never blocks)."""
        try:
            self._queue.put_nowait((node_index, node_label, rank, entries))
        except queue.Full:
            self._dropped += len(entries)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < 200:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._log_points(batch)
                    return
                batch.append(nxt)
            self._log_points(batch)

    def _log_points(self, batch) -> None:
        metrics = []
        for node_index, label, rank, entries in batch:
            points, self._counters[node_index] = metric_points(entries, label, self._counters.get(node_index, 0))
            for key, value, step, ts in points:
                metrics.append(Metric(key, value, ts, step))
                if rank is not None:
                    mean = self._averager.add(key.split("/", 1)[1], step, rank, value, ts)
                    if mean is not None:
                        metrics.append(Metric(mean[0], mean[1], mean[3], mean[2]))
        try:
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        except Exception as e:  # noqa: BLE001
            self._warn("log metrics", e)

    def close_run(self, cluster, summary, table: str) -> None:
        """End of the cluster: detach from its registry and finish the run with its summary."""
        from tfos.cluster.driver.lifecycle import Phase

        cluster.registry.on_history = None
        state = {"cluster_id": cluster.cluster_id, "roles": cluster.roles, "nodes": cluster.nodes,
                 "per_node": summary[0] if summary else {}, "rows_fed": cluster.feeds.rows_total}
        self.log_feed_totals(state["per_node"])
        self.finish(cluster.lifecycle.phase is not Phase.FAILED, state, table, cluster.timeline_path,
                    chosen_model(cluster.roles, cluster.registry.model_paths))

    def log_feed_totals(self, per_node: dict) -> None:
        """The rows the nodes dropped or padded for equal steps (``train(uneven=...)``), as run metrics."""
        ts = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ts, 0) for k in ("rows_dropped", "rows_padded")
                   if (v := sum(int(st.get("metrics", {}).get(k) or 0) for st in per_node.values()))]
        try:
            if metrics:
                self.client.log_batch(self.run_id, metrics=metrics)
        except Exception as e:  # noqa: BLE001
            self._warn("log metrics", e)

    def finish(self, ok: bool, summary: dict | None, rank_table: str, timeline_path: str | None,
               model_path: str | None) -> None:
        """Flush the metrics (bounded by FINISH_TIMEOUT_SECS), log the artifacts and the model, end the run."""
        self._queue.put(None)
        self._thread.join(FINISH_TIMEOUT_SECS)
        if self._thread.is_alive():
            logger.warning("MLflow: metrics still being logged after %.0fs; the run may miss some", FINISH_TIMEOUT_SECS)
        if self._dropped:
            logger.warning("MLflow: %d metric entries dropped (more than %d pending)", self._dropped, MAX_PENDING)
        try:
            with tempfile.TemporaryDirectory(prefix="tfos-mlflow-") as tmp:
                with open(os.path.join(tmp, "summary.json"), "w") as f:
                    json.dump(summary or {}, f, indent=1, default=str)
                with open(os.path.join(tmp, "ranks.txt"), "w") as f:
                    f.write(rank_table)
                self.client.log_artifacts(self.run_id, tmp, "tfos")
            if timeline_path and os.path.exists(timeline_path):
                self.client.log_artifact(self.run_id, timeline_path, "tfos")
        except Exception as e:  # noqa: BLE001
            self._warn("log artifacts", e)
        if ok and model_path:
            self._log_model(model_path)
        if self.owns_run:
            try:
                self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")
            except Exception as e:  # noqa: BLE001
                self._warn("end the run", e)

    def _log_model(self, path: str) -> None:
        local = path[len("file://"):] if path.startswith("file://") else path
        if not os.path.exists(os.path.join(local, "saved_model.pb")):
            logger.warning("MLflow: ctx.log_model(%s) is not a SavedModel directory readable by the driver; "
                           "no model logged", path)
            return
        try:
            with tempfile.TemporaryDirectory(prefix="tfos-mlflow-model-") as tmp:
                # saved then logged as the run's artifacts: no start_run (the caller's run stays as it
                # is) and no LoggedModel copy of the run's metrics
                mlflow.pyfunc.save_model(os.path.join(tmp, "model"), python_model=SavedModelPredictor(),
                                         artifacts={"saved_model": local})
                self.client.log_artifacts(self.run_id, os.path.join(tmp, "model"), "model")
        except Exception as e:  # noqa: BLE001
            self._warn("log the model", e)


class SavedModelPredictor(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of a SavedModel's ``serving_default`` signature: a DataFrame (numeric
    columns, or one column of equal-length arrays) in, the signature's first output out."""

    def load_context(self, context):
        import tensorflow as tf

        self._model = tf.saved_model.load(context.artifacts["saved_model"])
        self._fn = self._model.signatures["serving_default"]

    def predict(self, context, model_input, params=None):
        import tensorflow as tf

        name, spec = next(iter(self._fn.structured_input_signature[1].items()))
        if model_input.shape[1] == 1 and isinstance(model_input.iloc[0, 0], (list, tuple, np.ndarray)):
            x = np.stack([np.asarray(v) for v in model_input.iloc[:, 0]])
        else:
            x = model_input.to_numpy()
        out = self._fn(**{name: tf.cast(x, spec.dtype)})
        return next(iter(out.values())).numpy()
