"""A fleet simulator for measuring the driver at cluster scale: N simulated nodes in a process of
their own, on the real authenticated control channel.

``FakeSpark``'s nodes are threads of the driver's own process: they share its GIL and so cannot
measure it. ``FleetSpark`` is the same Spark entry point, but its barrier stage starts
``python -m tfos.testing.fleet`` with the attempt's ClusterConfig on stdin (a pipe, as a TF
process gets its NodeConfig), and that process plays every node as a real agent and TF process
would: the agent announces itself and keeps one connection for its heartbeats (every
``heartbeat_interval``; it answers stack requests and stops when told), the TF process registers
from host ``fakehost-<i // 8>``, waits for the cluster spec, reports progress every
``report_interval``, and reports its exit. The driver is the real one, untouched.

    spark = FleetSpark(512, run_secs=5)
    cluster = TFCluster.reserve(spark, 512, progress=False)
    cluster.start(lambda args, ctx: None)
    cluster.shutdown()

``bench/scale.py`` times the phases from 64 to 2,048 nodes. Each process plays up to
NODES_PER_PROCESS nodes. With ``stats=path`` each writes its heartbeats' round trips and the
reports it sent to ``path.<first node>`` (JSON) when it ends.
:func:`feed_load` plays feeding tasks and gated nodes against a driver's feed scheduler, and
:func:`feed_hubs` the nodes' feed hubs that a driver ends feeds on (``close_feeds``).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
import time

from tfos.errors import TFOSError
from tfos.host.deadline import Deadline
from tfos.testing.fake_spark import Does, FakeSpark
from tfos.topology import InputMode
from tfos.wire import messages as M
from tfos.wire.channel import Channel
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)

#: hosts are ``fakehost-<i // NODES_PER_HOST>``
NODES_PER_HOST = 8
#: nodes played by one fleet process: one process for thousands would be bound by its own GIL
#: (its handshakes, heartbeats and reports), and measure itself rather than the driver
NODES_PER_PROCESS = 256
#: each simulated node runs two threads (agent, TF process): small stacks keep thousands cheap
THREAD_STACK = 256 * 1024
#: what a simulated node does: the subset of :class:`Does` the fleet plays
FLEET_DOES = (Does.FINISH, Does.HANG, Does.RAISE, Does.GO_SILENT)


def host_of(index: int) -> str:
    """Pure: the simulated host of node ``index``."""
    return f"fakehost-{index // NODES_PER_HOST}"


class FleetSpark(FakeSpark):
    """:class:`FakeSpark` whose barrier stage runs its nodes in a separate fleet process.
    ``behaviour(i, attempt)`` is one of FLEET_DOES."""

    def __init__(self, slots: int, behaviour=None, run_secs: float = 1.0, stats: str = ""):
        super().__init__(slots, behaviour, run_secs)
        self.processes: list[subprocess.Popen] = []
        self.stats = stats  # where each fleet process writes its figures (see run_fleet)

    def barrier_stage(self, n: int, bootstrap):
        cluster: M.ClusterConfig = bootstrap.keyed()

        def action():
            with self._lock:
                cancelled = self._cancel.setdefault(self._jobs.get(threading.get_ident(), ""), threading.Event())
            does = [self.behaviour(i, cluster.attempt) for i in range(n)]
            if any(d not in FLEET_DOES for d in does):
                raise TFOSError(f"the fleet plays {[d.name for d in FLEET_DOES]} only")
            procs = []
            try:
                for first in range(0, n, NODES_PER_PROCESS):
                    last = min(n, first + NODES_PER_PROCESS)
                    stats = f"{self.stats}.{first}" if self.stats else ""
                    proc = subprocess.Popen([sys.executable, "-m", "tfos.testing.fleet", "--run-secs",
                                             str(self.run_secs), "--first", str(first), "--stats", stats,
                                             "--does", ",".join(d.name for d in does[first:last])],
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None)
                    procs.append(proc)
                    with self._lock:
                        self.processes.append(proc)
                    proc.stdin.write(M.encode(cluster) + b"\n")
                    proc.stdin.close()
                with self._lock:
                    self.started += [(i, cluster.attempt) for i in range(n)]
                while any(p.poll() is None for p in procs):  # the barrier tasks hold their slots until the nodes end
                    if cancelled.wait(0.2):
                        raise TFOSError("the fleet's barrier stage was cancelled")
                if cluster.input_mode != InputMode.TENSORFLOW:
                    return [f"node {i}: STARTED" for i in range(n)]
                return [f"node {i}: ended" for i in range(n)]
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.terminate()
                for proc in procs:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()

        return action


class SimulatedNode:
    """One node of the fleet: its agent's thread and its TF process's thread."""

    def __init__(self, cluster: M.ClusterConfig, index: int, does: Does, run_secs: float):
        self.cluster, self.index, self.does, self.run_secs = cluster, index, does, run_secs
        self.stop = threading.Event()  # the driver asked this node to stop
        self.ended = threading.Event()  # the TF process reported its exit
        self.process_registered = threading.Event()
        self.rtts: list[float] = []  # heartbeat round trips, seconds
        self.reports = 0
        self.agent = threading.Thread(target=self._agent, name=f"agent-{index}", daemon=True)
        self.process = threading.Thread(target=self._process, name=f"tf-{index}", daemon=True)

    def _client(self) -> DriverClient:
        c = self.cluster
        return DriverClient(c.driver_host, c.driver_port, c.key, c.cluster_id, self.index)

    def start(self) -> None:
        self.agent.start()

    def _agent(self) -> None:
        c = self.cluster
        client = self._client()
        client.keep_connection()  # as the node agent: the connection's end is the agent's end
        try:
            if client.agent_started(host_of(self.index), 0, 0, ""):
                self.stop.set()
            self.process.start()
            answered = 0
            while not self.ended.is_set():
                if self.does is Does.GO_SILENT and self.process_registered.is_set():
                    return  # a lost host: nothing more is sent
                t0 = time.monotonic()
                reply = client.heartbeat_reply(timeout=c.heartbeat_timeout)  # as the node agent
                self.rtts.append(time.monotonic() - t0)
                if reply.stop:
                    self.stop.set()
                if reply.dump > answered:
                    answered = reply.dump
                    client.node_stacks(reply.dump, f"Thread 0x1 (most recent call first):\n  File \"sim.py\", line 1 "
                                                   f"in run_node\n", f"fleet node {self.index}: last log line")
                self.ended.wait(max(0.05, c.heartbeat_interval))
        except (TFOSError, OSError) as e:
            logger.warning("fleet node %d's agent: %s", self.index, e)  # the driver will see it lost
        finally:
            client.close()

    def _process(self) -> None:
        c = self.cluster
        job, task_index = c.roles[self.index]
        client = self._client().keep_connection()  # its reports, as the TF process's reporter
        code, trace = -15, ""
        try:
            # as run_node: registration and the spec wait on one connection. The spec is received but
            # not decoded: a real node decodes it in a process of its own, while here thousands of
            # decodes would starve this process's heartbeats (the driver's cost is the same)
            with Channel.connect(c.driver_host, c.driver_port, c.key, timeout=60.0, what="tfos driver") as ch:
                ch.settimeout(c.reservation_timeout + 60.0)
                ch.request(M.RegisterNode(c.cluster_id, M.NodeInfo(self.index, job, task_index, host_of(self.index),
                                                                   20000 + self.index % 8, 0, 0)))
                self.process_registered.set()
                ch.send(M.GetClusterSpec(c.cluster_id, self.index, c.reservation_timeout))
                _, spec = ch.recv_frame(decode_json=False)
                if b'"type":"ClusterSpecReply"' not in spec[-200:]:
                    raise TFOSError(f"no cluster spec: {spec[:300]!r}")
            if self.does is Does.GO_SILENT:
                return
            run = Deadline(c.reservation_timeout + 60 if self.does is Does.HANG else self.run_secs)
            step = 0
            while not self.stop.is_set() and not run.expired():
                step += 1
                try:
                    client.report({"step": step}, [])
                    self.reports += 1
                except (TFOSError, OSError) as e:  # as the TF process's reporter: dropped, not fatal
                    logger.debug("fleet node %d's report not delivered: %s", self.index, e)
                self.stop.wait(run.slice(max(0.05, c.report_interval)))
            if not self.stop.is_set():
                code = 0 if self.does is Does.FINISH else 1
                if code:
                    trace = f"Traceback (most recent call last):\nRuntimeError: fleet node {self.index} failed on purpose"
            self._client().node_exited(code, trace, "", "", stopped_by_driver=self.stop.is_set(), reason="")
        except (TFOSError, OSError) as e:
            logger.warning("fleet node %d's TF process: %s", self.index, e)
        finally:
            client.close()
            if self.does is not Does.GO_SILENT:
                self.ended.set()


def percentile(values: list[float], q: float) -> float:
    """Pure: the ``q`` quantile (0..1) of ``values`` by the nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def run_fleet(cluster: M.ClusterConfig, does: list[Does], run_secs: float, stats: str = "", first: int = 0) -> None:
    """Play nodes ``first`` .. ``first + len(does) - 1`` of ``cluster`` until they end."""
    from tfos.host import limits

    threading.stack_size(THREAD_STACK)
    limits.ensure_open_files(len(does))  # two connections per node here, as the driver has
    nodes = [SimulatedNode(cluster, first + k, d, run_secs) for k, d in enumerate(does)]
    for node in nodes:
        node.start()
    deadline = Deadline(cluster.reservation_timeout + run_secs + 120)
    for node in nodes:
        if node.does is not Does.GO_SILENT:
            node.ended.wait(deadline.remaining())
    if stats:
        rtts = [r for node in nodes for r in node.rtts]
        with open(stats, "w") as f:
            json.dump({"heartbeats": len(rtts), "reports": sum(n.reports for n in nodes), "rtts": rtts}, f)


def feed_load(host: str, port: int, key: M.ChannelKey, cluster_id: str, nodes: int, feeders: int, secs: float,
              gated: bool, rows: int = 256) -> dict:
    """Feeding tasks and gated nodes against the feed scheduler of the driver at ``host:port``
    (its ``nodes`` nodes registered): ``feeders`` threads ask where chunks of ``rows`` rows go,
    each on one connection, for ``secs`` seconds; with ``gated``, every node also waits at its
    gate for the next ``rows`` rows (as equal steps do), on its own connection, again and again.
    Returns the decisions made, per second, and the gate answers."""
    threading.stack_size(THREAD_STACK)
    stop = threading.Event()
    counts = {"decisions": 0, "gates": 0}
    lock = threading.Lock()

    def feeder():
        client = DriverClient(host, port, key, cluster_id)
        with client.session(timeout=60.0):
            while not stop.is_set():
                client.assign_chunk("load", rows)
                with lock:
                    counts["decisions"] += 1

    def gate(node):
        client = DriverClient(host, port, key, cluster_id, node)
        need = rows
        with client.session(timeout=60.0):
            while not stop.is_set():
                reply = client.feed_gate("load", need, wait=1.0)
                need = max(need, reply.safe + rows)
                with lock:
                    counts["gates"] += 1

    threads = [threading.Thread(target=gate, args=(i,), daemon=True) for i in range(nodes if gated else 0)]
    for t in threads:
        t.start()
    time.sleep(1.0 if gated else 0.0)  # every gate waiting before the clock starts
    start = dict(counts)
    feeding = [threading.Thread(target=feeder, daemon=True) for _ in range(feeders)]
    t0 = time.monotonic()
    for t in feeding:
        t.start()
    time.sleep(secs)
    stop.set()
    made = counts["decisions"] - start["decisions"]
    took = time.monotonic() - t0
    for t in feeding + threads:
        t.join(5)
    return {"decisions": made, "per_sec": made / took, "gate_answers": counts["gates"] - start["gates"]}


def feed_hubs(count: int, key: M.ChannelKey, delay: float = 0.0) -> list:
    """``count`` started listeners that answer a feed's end as a node's feed hub does (after
    ``delay`` seconds: a node whose queue is full takes a while); the caller closes them."""
    from tfos.wire.listener import Listener

    def serve(ch: Channel) -> None:
        msg = ch.recv()
        if not isinstance(msg, M.FeedEnd):
            raise TFOSError(f"a feed hub takes FeedEnd here, not {type(msg).__name__}")
        time.sleep(delay)
        ch.send(M.FeedAck(msg.rows))

    threading.stack_size(THREAD_STACK)
    return [Listener(key, serve, f"hub-{i}", "127.0.0.1").start() for i in range(count)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="simulated tfos nodes (see tfos.testing.fleet)")
    p.add_argument("--run-secs", type=float, required=True)
    p.add_argument("--does", required=True, help="comma-separated Does names, one per node")
    p.add_argument("--first", type=int, default=0, help="the index of the first node this process plays")
    p.add_argument("--stats", default="", help="write the fleet's figures (JSON) to this file")
    args = p.parse_args(argv)
    cluster = M.decode(sys.stdin.buffer.readline())
    if not isinstance(cluster, M.ClusterConfig):
        raise TFOSError(f"the fleet expects a ClusterConfig on stdin, got {type(cluster).__name__}")
    run_fleet(cluster, [Does[name] for name in args.does.split(",")], args.run_secs, args.stats, args.first)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
