"""The driver at cluster scale: reserve, start and shutdown of N simulated nodes (tfos.testing.fleet:
a separate process speaking the real control channel) against the real driver, N = 64 .. 2,048.

    python bench/scale.py [--nodes 64,128,256,512,1024,2048] [--run-secs 5]

Per N: seconds to reserve, to start (every node registered and given the cluster spec: RUNNING)
and to shut down after the nodes finished; the driver's CPU seconds over the run, and per
request while the nodes run (every node sends a heartbeat and a progress report each second: the
driver's CPU over a window of the run divided by the requests in it); the heartbeats' round trip
p50/p99 as the fleet saw them; the driver's peak threads, open files and RSS (sampled every
20 ms); nodes the driver took for lost while they ran (false losses: the fleet's nodes never
fail). Then the growth exponent of the start time fitted over the sweep (log time against log N;
the target is <= 1.2).

Then, at the largest N up to 2,048: the time from a node agent's end (its connection closed) to
the driver's failure of that node; and at 512 nodes the feed scheduler's decisions per second with
two feeding tasks asking as fast as they can, without and with every node waiting at its gate
(tfos.testing.fleet.feed_load, in a process of its own, over the real control channel).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
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
        k = 0
        while not self._stop.wait(self.interval):
            self.threads = max(self.threads, threading.active_count())
            k += 1
            try:
                if k % 10 == 0:  # listing thousands of descriptors costs the driver's CPU: less often
                    self.files = max(self.files, len(os.listdir("/proc/self/fd")))
                with open("/proc/self/statm") as f:
                    self.rss_mb = max(self.rss_mb, int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20)
            except OSError:
                pass


def cpu(who=resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def system_cpu() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def measure(n: int, run_secs: float, report_interval: float = 1.0) -> dict:
    from tfos import TFCluster
    from tfos.testing.fleet import NODES_PER_PROCESS, FleetSpark

    stats = os.path.join(tempfile.mkdtemp(prefix="tfos-scale-"), "fleet.json")
    spark = FleetSpark(n, run_secs=run_secs, stats=stats)
    per_request = system_share = 0.0
    with Sampler() as s:
        c0, t0, f0 = cpu(), time.monotonic(), cpu(resource.RUSAGE_CHILDREN)
        cluster = TFCluster.reserve(spark, n, progress=False, heartbeat_interval=1.0, report_interval=report_interval)
        t1 = time.monotonic()
        error = ""
        try:
            cluster.start(lambda args, ctx: None)
            t2 = time.monotonic()
            window = run_secs / 2  # the nodes run: a heartbeat and a report per node per second
            time.sleep(min(1.0, window / 4))
            w0, wc, ws = time.monotonic(), cpu(), system_cpu()
            time.sleep(window)
            per_request = (cpu() - wc) / ((time.monotonic() - w0) * (n + n / report_interval))
            system_share = (system_cpu() - ws) / max(1e-9, cpu() - wc)
            cluster.shutdown(timeout=run_secs + 600)
        except Exception as e:  # a failed start at this size is a result too
            t2 = time.monotonic()
            first = getattr(e, "failures", None) or []
            why = first[0].reason if first else str(e).splitlines()[0]
            error = f"{type(e).__name__}: {why[:160]}"
        t3 = time.monotonic()
        used = cpu() - c0
    fleet_cpu = cpu(resource.RUSAGE_CHILDREN) - f0  # the fleet processes, on the same two cores
    lost = len(cluster.lost_nodes) + len(cluster.restarts) + len(cluster.registry.failures)
    from tfos.testing.fleet import percentile

    rtts = []
    for first in range(0, n, NODES_PER_PROCESS):
        try:
            with open(f"{stats}.{first}") as f:
                rtts += json.load(f)["rtts"]
        except (OSError, ValueError, KeyError):
            pass
    fleet = {"rtt_p50": percentile(rtts, 0.5), "rtt_p99": percentile(rtts, 0.99)}
    return {"n": n, "reserve": t1 - t0, "start": t2 - t1, "shutdown": max(0.0, t3 - t2 - run_secs),
            "cpu": used, "fleet_cpu": fleet_cpu, "per_request_us": per_request * 1e6, "system_share": system_share, "rtt_p50_ms": fleet["rtt_p50"] * 1e3,
            "rtt_p99_ms": fleet["rtt_p99"] * 1e3, "threads": s.threads, "files": s.files, "rss_mb": s.rss_mb,
            "lost": lost, "error": error}


def detection(n: int) -> float:
    """Seconds from node 0's agent ending (its heartbeat connection closed) to the driver failing
    the node, with ``n`` nodes running."""
    from tfos import TFCluster
    from tfos.errors import TFOSError
    from tfos.testing.fake_spark import Does
    from tfos.testing.fleet import FleetSpark

    spark = FleetSpark(n, behaviour=lambda i, attempt: Does.GO_SILENT if i == 0 else Does.FINISH, run_secs=30)
    cluster = TFCluster.reserve(spark, n, progress=False, heartbeat_interval=1.0, report_interval=1.0)
    seen = []

    def watch():
        while not seen:
            if any(f.node_index == 0 for f in cluster.registry.failures):
                seen.append((time.monotonic(), cluster.registry.nodes[0].disconnected_at))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        cluster.start(lambda args, ctx: None)
        cluster.shutdown(timeout=120)
    except TFOSError:
        pass
    watcher.join(10)
    if not seen or seen[0][1] is None:
        return float("nan")
    return seen[0][0] - seen[0][1]


def registered(cluster_id: str, hubs: list[tuple[str, int]]):
    """A driver registry whose node i registered from ``hubs[i]`` = (host, feed port)."""
    from tfos.cluster.driver.registry import NodeRegistry
    from tfos.wire import messages as M

    reg = NodeRegistry(cluster_id, [("worker", i) for i in range(len(hubs))])
    for i, (host, port) in enumerate(hubs):
        reg.on_register(M.RegisterNode(cluster_id, M.NodeInfo(i, "worker", i, host, 0, port, 1000 + i)))
    return reg


def close_feeds(n: int, delay: float = 0.05) -> float:
    """Seconds the driver's close_feeds takes to end the feeds of ``n`` nodes whose hubs (in a
    process of their own) each answer after ``delay`` seconds."""
    from types import SimpleNamespace

    from tfos.feed.driver.jobs import FeedJobs
    from tfos.feed.driver.scheduler import FeedScheduler
    from tfos.host import limits
    from tfos.wire import messages as M
    from tfos.wire.channel import new_key

    limits.ensure_open_files(n)
    key = new_key(encrypt=True)
    code = ("import json, sys; from tfos.wire import messages as M; from tfos.testing.fleet import feed_hubs; "
            "from tfos.host import limits; limits.ensure_open_files(%d); "
            "key = M.decode(sys.stdin.buffer.readline()); hubs = feed_hubs(%d, key, %r); "
            "print(json.dumps([h.port for h in hubs]), flush=True); sys.stdin.read()" % (n, n, delay))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(M.encode(key) + b"\n")
        proc.stdin.flush()
        ports = json.loads(proc.stdout.readline())
        reg = registered("close", [("127.0.0.1", port) for port in ports])
        jobs = FeedJobs(None, reg, FeedScheduler(reg, list(range(n))), None, SimpleNamespace(key=key), None, None)
        t0 = time.monotonic()
        unreached = jobs.close_feeds(timeout=60)
        took = time.monotonic() - t0
        if unreached:
            raise RuntimeError(f"close_feeds did not reach {len(unreached)} nodes: {unreached[0]}")
        return took
    finally:
        proc.stdin.close()
        proc.wait(30)


def stall_report_bytes(n: int, distinct: bool) -> int:
    """The size of the driver's stall report for ``n`` nodes, each with a 40-line log tail."""
    from tfos.cluster.driver import stall

    def dump(line):
        return (f"Thread 0x00007f{line:08x} (most recent call first):\n"
                f'  File "/x/site-packages/tensorflow/ops.py", line 10 in all_reduce\n'
                f'  File "/home/u/train.py", line {line} in main_fun\n') * (20 if distinct else 1)

    nodes = [(f"node {i} (worker:{i} on fakehost-{i // 8})", dump(1000 + i if distinct else 42 + (i == 5)),
              f"log line of node {i}\n" * 40) for i in range(n)]
    return len(stall.stall_message(300, nodes).encode())


def feed_decisions(n: int, gated: bool, secs: float = 5.0) -> dict:
    """The feed scheduler's decisions per second over the real control channel, ``n`` nodes
    registered, two feeding tasks; with ``gated`` every node waits at its gate meanwhile."""
    from tfos.cluster.driver.service import ControlService
    from tfos.feed.driver.scheduler import FeedScheduler
    from tfos.host import limits
    from tfos.wire import messages as M
    from tfos.wire.channel import new_key

    limits.ensure_open_files(n)
    key = new_key(encrypt=True)
    reg = registered("load", [(f"fakehost-{i // 8}", 1000 + i) for i in range(n)])
    sched = FeedScheduler(reg, list(range(n)))
    service = ControlService(reg, sched.handlers(), key, "127.0.0.1").start()
    code = ("import json, sys; from tfos.wire import messages as M; from tfos.testing.fleet import feed_load; "
            "key = M.decode(sys.stdin.buffer.readline()); "
            f"print(json.dumps(feed_load('127.0.0.1', {service.port}, key, 'load', {n}, 2, {secs}, {gated})))")
    try:
        c0 = cpu()
        out = subprocess.run([sys.executable, "-c", code], input=M.encode(key) + b"\n", capture_output=True,
                             timeout=secs + 120, check=True).stdout
        result = json.loads(out.decode().strip().splitlines()[-1])
        result["driver_cpu_us"] = (cpu() - c0) * 1e6 / max(1, result["decisions"] + result["gate_answers"])
        return result
    finally:
        service.stop()


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
    logging.basicConfig(level=logging.ERROR)
    p.add_argument("--skip-extra", action="store_true", help="only the sweep (no detection, no feed)")
    args = p.parse_args(argv)
    rows = []
    print("| N | reserve s | start s | shutdown s | driver CPU s | fleet CPU s | CPU us/request | "
          "heartbeat p50/p99 ms | peak threads | peak files | peak RSS MB | false losses | error |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    sizes = list(map(int, args.nodes.split(",")))
    for n in sizes:
        r = measure(n, args.run_secs)
        rows.append(r)
        print(f"| {n} | {r['reserve']:.2f} | {r['start']:.2f} | {r['shutdown']:.2f} | {r['cpu']:.1f} | "
              f"{r['fleet_cpu']:.1f} | "
              f"{r['per_request_us']:.0f} ({r['system_share']:.0%} system) | {r['rtt_p50_ms']:.1f} / {r['rtt_p99_ms']:.1f} | {r['threads']} | "
              f"{r['files']} | {r['rss_mb']} | {r['lost']} | {r['error']} |", flush=True)
    for key in ("start", "cpu"):
        k = exponent(rows, key)
        print(f"growth exponent of {key} over N: {'n/a' if k is None else f'{k:.2f}'}")
    if args.skip_extra:
        return
    n = max(sizes)
    beats = measure(min(512, n), args.run_secs, report_interval=3600.0)  # the first report only: heartbeats alone
    print(f"driver CPU per heartbeat at {min(512, n)} nodes (no reports): {beats['per_request_us']:.0f} us "
          f"({beats['system_share']:.0%} system)", flush=True)
    print(f"stall report at 2,048 nodes: {stall_report_bytes(2048, False) / 1e3:.0f} kB with one stack shared by "
          f"all but one rank, {stall_report_bytes(2048, True) / 1e3:.0f} kB with every rank's stack different")
    print(f"killed agent detected after {detection(n):.2f} s at {n} nodes (heartbeat_interval 1 s)", flush=True)
    feed_n = min(512, n)
    print(f"close_feeds at {feed_n} nodes (each hub answers after 50 ms): {close_feeds(feed_n):.2f} s", flush=True)
    for gated in (False, True):
        r = feed_decisions(feed_n, gated)
        print(f"feed decisions/s at {feed_n} nodes, {'every node at its gate' if gated else 'no gate waiting'}: "
              f"{r['per_sec']:.0f} ({r['gate_answers']} gate answers; driver CPU {r['driver_cpu_us']:.0f} us per "
              "request)", flush=True)


if __name__ == "__main__":
    main()
