"""Progress on the driver: one progress bar per cluster, a per-rank table at the end, and the
merged cluster timeline (Chrome trace JSON). Runs in the Spark driver."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)



def rank_table(roles, nodes_state, feed_rows: dict) -> str:
    """Pure: the end-of-run table, one line per node; the rows a node dropped or padded for equal
    steps (``uneven``) get columns when any node has some."""
    extra = [k for k in ("rows_dropped", "rows_padded")
             if any(st.get("metrics", {}).get(k) for st in nodes_state.values())]
    head = f"{'node':>4} {'role':<12} {'host':<16} {'step':>7} {'loss':>9} {'ex/s':>9} {'rows fed':>9} {'exit':>5}"
    head += "".join(f" {k.replace('rows_', ''):>8}" for k in extra)
    lines = [head, "-" * len(head)]
    for i, (job, idx) in enumerate(roles):
        st = nodes_state.get(i, {})
        m = st.get("metrics", {})
        loss = m.get("loss")
        eps = m.get("examples_per_sec")
        lines.append(f"{i:>4} {job + ':' + str(idx):<12} {str(st.get('host', '?'))[:16]:<16} "
                     f"{str(m.get('step', '-')):>7} {('%.4f' % loss) if isinstance(loss, (int, float)) else '-':>9} "
                     f"{('%.0f' % eps) if isinstance(eps, (int, float)) else '-':>9} "
                     f"{feed_rows.get(i, 0):>9} {str(st.get('exit', '-')):>5}"
                     + "".join(f" {m.get(k, 0):>8}" for k in extra))
    return "\n".join(lines)


def chrome_trace(roles, hosts: dict, node_events: dict, driver_events: list) -> dict:
    """Pure: merge per-node events into one Chrome/Perfetto trace (pid = node index, driver last)."""
    events = []
    driver_pid = len(roles)
    cats: dict[str, int] = {}
    for i, (job, idx) in enumerate(roles):
        events.append({"name": "process_name", "ph": "M", "pid": i,
                       "args": {"name": f"node {i} {job}:{idx} @ {hosts.get(i, '?')}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": i, "args": {"sort_index": i}})
    events.append({"name": "process_name", "ph": "M", "pid": driver_pid, "args": {"name": "driver (Spark feeding)"}})
    for pid, evs in list(node_events.items()) + [(driver_pid, driver_events)]:
        for ev in evs:
            tid = cats.setdefault(ev.get("cat", "misc"), len(cats) + 1)
            events.append(dict(ev, pid=pid, tid=tid))
    for pid in list(node_events) + [driver_pid]:
        for cat, tid in cats.items():
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": cat}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def quiet_py4j() -> None:
    """py4j logs every gateway connection at INFO ("Closing down clientserver connection"): keep that
    out of a console that shows INFO, unless the user set py4j's level themselves."""
    for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)


class NodeOutput:
    """Prints the lines the nodes' main_fun printed (reserve(node_output=...)) on the driver's
    console, each with its node's role, above the progress bar when there is one."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._lock = threading.Lock()

    def __call__(self, node_index: int, lines: list) -> None:
        job, idx = self.cluster.roles[node_index]
        text = "".join(f"[{job}:{idx}] {line}\n" for line in lines)
        bar = getattr(self.cluster._progress, "_bar", None)
        with self._lock:
            if bar is not None:
                bar.write(text.rstrip("\n"), file=sys.stdout)
            else:
                sys.stdout.write(text)
                sys.stdout.flush()


class ProgressMonitor:
    """Shows a tqdm bar (console or notebook) with the slowest rank's step, mean loss and total
    examples/s, refreshed from the nodes' reports."""

    def __init__(self, cluster, interval: float = 0.5):
        self.cluster = cluster
        self.interval = interval
        self._stop = threading.Event()
        self._bar = None
        self._thread = threading.Thread(target=self._loop, name=f"tfos-progress-{cluster.cluster_id}", daemon=True)

    def start(self) -> "ProgressMonitor":
        self._thread.start()
        return self

    def _trainers(self):
        return [i for i, (job, _) in enumerate(self.cluster.roles) if job in self.cluster.backend.finishing_jobs]

    def _update(self) -> None:
        metrics = self.cluster.metrics()
        trainers = self._trainers()
        steps = [metrics[i].get("step") for i in trainers if isinstance(metrics.get(i, {}).get("step"), (int, float))]
        rows = sum(int(metrics[i].get("rows_read", 0)) for i in metrics)
        if not steps and not rows:
            return
        unit = "step" if steps else "row"  # steps only when a node reports them; rows/s while feeding
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(desc=f"tfos {self.cluster.cluster_id}", unit=unit, dynamic_ncols=True, leave=True)
            self.cluster.spark.quiet_console()
        elif self._bar.unit != unit:  # steps began after a feed: the same line counts steps from now on
            self._bar.reset()
            self._bar.unit = unit
        count = int(min(steps)) if steps else rows
        if count > self._bar.n:
            self._bar.update(count - self._bar.n)
        losses = [metrics[i]["loss"] for i in trainers if isinstance(metrics.get(i, {}).get("loss"), (int, float))]
        eps = sum(metrics[i].get("examples_per_sec", 0) or 0 for i in trainers)
        post = {}
        if losses:
            post["loss"] = f"{sum(losses) / len(losses):.4f}"
        if eps:
            post["ex/s"] = f"{eps:.0f}"
        if rows and steps:
            post["rows fed"] = rows
        if self.cluster.attempt:
            post["attempt"] = self.cluster.attempt  # after a restart (max_restarts)
        self._bar.set_postfix(post, refresh=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._update()
            except Exception as e:  # a display problem must never break training
                logger.debug("progress display failed: %s", e)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._update()
        except Exception:
            pass
        if self._bar is not None:
            self._bar.close()


def end_of_run(cluster_id: str, roles, summary, rows_total: dict, driver_events: list, timeline_request):
    """Log the per-rank table and write the merged timeline (if asked); returns ``(table, timeline
    path or None)``. ``summary`` is the registry's ``(state, events, hosts)``, None if no node started."""
    if summary is None:
        return "", None
    nodes_state, events, hosts = summary
    table = rank_table(roles, nodes_state, rows_total)
    logger.info("tfos cluster %s per-rank summary:\n%s", cluster_id, table)
    logs = [f"  node {i} ({job}:{idx}) on {st.get('host', '?')}: {st['log']}"
            for i, ((job, idx), st) in enumerate(zip(roles, (nodes_state.get(i, {}) for i in range(len(roles)))))
            if st.get("log")]
    if logs:
        logger.info("tfos cluster %s node logs (kept on each host):\n%s", cluster_id, "\n".join(logs))
    if not timeline_request:
        return table, None
    path = write_timeline(timeline_request, chrome_trace(roles, hosts, events, driver_events))
    logger.info("tfos cluster timeline written to %s (open in chrome://tracing or Perfetto)", path)
    return table, path


def write_timeline(path: str, trace: dict) -> str:
    path = path.replace("file://", "")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return path


def finish_reporting(cluster) -> None:
    """At the end of a cluster: close its progress bar, log the per-rank table, write the merged
    timeline (``cluster.timeline_path``), close its MLflow run."""
    if cluster._progress is not None:
        cluster._progress.close()
        cluster._progress = None
    summary = cluster.registry.summary()
    table, cluster.timeline_path = end_of_run(cluster.config.cluster_id, cluster.roles, summary,
                                              cluster.feeds.rows_total, cluster.feeds.events, cluster._timeline_request)
    tracker, cluster._tracker = cluster._tracker, None
    if tracker is not None:
        tracker.close_run(cluster, summary, table)
