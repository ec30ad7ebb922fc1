"""The driver at cluster scale: reserve, start and shutdown of N simulated nodes (tfos.testing.fleet:
a separate process speaking the real control channel) against the real driver, N = 64 .. 2,048.

    python bench/scale.py [--nodes 64,128,256,512,1024,2048] [--run-secs 5]

Per N: seconds to reserve, to start (every node registered and given the cluster spec: RUNNING)
and to shut down after the nodes finished; the driver's CPU seconds over the run; its peak
threads, open files and RSS (sampled every 20 ms); nodes the driver took for lost while they
ran (false losses: the fleet's nodes never fail). Then the growth exponent of the start time
fitted over the sweep (log time against log N; the target is <= 1.2).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Sampler:
    """Peak threads, open files and RSS of this process, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.threads = self.files = self.rss_mb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(self.interval):
            self.threads = max(self.threads, threading.active_count())
            try:
                self.files = max(self.files, len(os.listdir("/proc/self/fd")))
                with open("/proc/self/statm") as f:
                    self.rss_mb = max(self.rss_mb, int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20)
            except OSError:
                pass


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(n: int, run_secs: float) -> dict:
    from tfos import TFCluster
    from tfos.testing.fleet import FleetSpark

    spark = FleetSpark(n, run_secs=run_secs)
    with Sampler() as s:
        c0, t0 = cpu(), time.monotonic()
        cluster = TFCluster.reserve(spark, n, progress=False, heartbeat_interval=1.0, report_interval=1.0)
        t1 = time.monotonic()
        error = ""
        try:
            cluster.start(lambda args, ctx: None)
            t2 = time.monotonic()
            cluster.shutdown(timeout=run_secs + 600)
        except Exception as e:  # a failed start at this size is a result too
            t2 = time.monotonic()
            first = getattr(e, "failures", None) or []
            why = first[0].reason if first else str(e).splitlines()[0]
            error = f"{type(e).__name__}: {why[:160]}"
        t3 = time.monotonic()
        used = cpu() - c0
    lost = len(cluster.lost_nodes) + len(cluster.restarts) + len(cluster.registry.failures)
    return {"n": n, "reserve": t1 - t0, "start": t2 - t1, "shutdown": max(0.0, t3 - t2 - run_secs),
            "cpu": used, "threads": s.threads, "files": s.files, "rss_mb": s.rss_mb, "lost": lost, "error": error}


def exponent(rows: list[dict], key: str) -> float | None:
    """Least-squares slope of log(value) against log(N)."""
    pts = [(math.log(r["n"]), math.log(r[key])) for r in rows if r[key] > 0 and not r["error"]]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="64,128,256,512,1024,2048")
    p.add_argument("--run-secs", type=float, default=5.0, help="how long the simulated nodes run")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    rows = []
    print("| N | reserve s | start s | shutdown s | driver CPU s | peak threads | peak files | peak RSS MB | "
          "false losses | error |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in map(int, args.nodes.split(",")):
        r = measure(n, args.run_secs)
        rows.append(r)
        print(f"| {n} | {r['reserve']:.2f} | {r['start']:.2f} | {r['shutdown']:.2f} | {r['cpu']:.1f} | "
              f"{r['threads']} | {r['files']} | {r['rss_mb']} | {r['lost']} | {r['error']} |", flush=True)
    for key in ("start", "cpu"):
        k = exponent(rows, key)
        print(f"growth exponent of {key} over N: {'n/a' if k is None else f'{k:.2f}'}")


if __name__ == "__main__":
    main()
