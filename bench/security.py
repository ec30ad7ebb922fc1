"""What encryption costs outside the feed (the feed and inference: ``bench/feed.py --only encryption``).

  channel     a feed chunk's frame (5,344 rows of 784 float32, in its Arrow parts) sent over one
              channel on loopback, clear vs encrypted, for sending record sizes of --records KiB:
              CPU-s per GB (sender and receiver together) and GB/s, medians of 3
  connect     opening a tfos channel and one request/reply with the driver's control service on
              loopback, clear vs encrypted (--connections each, --rounds rounds alternating): the
              handshake's cost, per connection and as a ratio; and one connection through a pair of
              node tunnels to a server in the other node's private namespace
  allreduce   two ranks (processes), each with its node tunnel (private namespaces) and the shim, as
              tfos starts them; in the same two processes two Gloo groups of torch.distributed, one
              direct on 127.0.0.1 and one on the nodes' private addresses, whose traffic the tunnels
              carry (encrypted records); all-reduces of --sizes MiB alternating between the groups,
              --rounds rounds; algorithm bandwidth (bytes / time) and tunnel / direct
  cluster     what a user of tfos sees: a clear cluster (encrypt=False) and an encrypted one (the
              default) up side by side on local-cluster[2,1,2048], each node running
              ``keras_dist.allreduce`` eagerly after ``init_collectives()`` (default settings: Gloo,
              the mean) on a --cluster-mib MiB tensor; in the clear cluster's two processes also
              PyTorch's own Gloo group (``torch.distributed``, a file store, on 127.0.0.1, in place,
              the sum); --rounds rounds, the clusters taking turns; encrypted / clear and tfos / torch

Both ranks, both tunnels and the crypto share this machine's 2 cores, so the ratio here is a floor:
on real hosts each node has its own cores for its tunnel.
Run:  bash scripts/bench.sh security [--only channel|connect|allreduce|cluster] [--sizes 16,64,256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

RANK = textwrap.dedent("""
    import datetime, json, sys, time
    import torch, torch.distributed as dist
    rank, store_port, private, sizes, rounds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", store_port, 2, is_master=rank == 0, timeout=timeout)

    def group(prefix, host):
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, opts)

    groups = {"direct": group("direct", "127.0.0.1"), "tunnel": group("tunnel", private)}
    out = {}
    for mib in map(int, sizes.split(",")):
        t = torch.ones(mib << 18)  # float32: MiB * 2**20 / 4
        for g in groups.values():  # warm-up: connections, buffers
            g.allreduce([t]).wait()
        for r in range(rounds):
            for name in (("direct", "tunnel") if r % 2 else ("tunnel", "direct")):
                groups[name].barrier().wait()
                t0 = time.perf_counter()
                groups[name].allreduce([t]).wait()
                out.setdefault(f"{mib}", {}).setdefault(name, []).append((mib << 20) / (time.perf_counter() - t0) / 1e6)
    out["cpu"] = time.process_time()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    else:
        print("CPU " + str(out["cpu"]), flush=True)
""")


def start_tunnels(tmp: str, netns: str = "auto"):
    """Two nodes' tunnels as the agent starts them, each told where the other is."""
    from tfos.tunnel import addresses
    from tfos.tunnel import node as tunnel_node
    from tfos.tunnel.agent import NodeTunnel
    from tfos.wire import messages as M
    from tfos.wire.channel import new_key

    key = new_key(True)
    tunnels = []
    for i in range(2):
        d = os.path.join(tmp, f"n{i}")
        os.mkdir(d, 0o700)
        cluster = M.ClusterConfig("bench-security", key, "127.0.0.1", 1, (("worker", 0), ("worker", 1)), 0, 60.0, "/l",
                                  "file:///")
        t = NodeTunnel(M.NodeConfig(cluster, i, "worker", i, "127.0.0.1", d, "/f", "/w", sys.executable), netns)
        t.start()
        tunnels.append(t)
    for i, t in enumerate(tunnels):
        other = tunnels[1 - i].info
        tunnel_node.request(t.info.control, "PEERS " + json.dumps(
            [[addresses.node_address(other.block, 1 - i), "127.0.0.1", other.port, False]]))
    return key, tunnels


def rank_env(tunnel) -> dict:
    from tfos.tunnel.agent import shim_environment

    env = dict(os.environ)
    env.update(shim_environment(tunnel.info, tunnel.shim, env))
    return env


def allreduce(args) -> None:
    from tfos.testing.ports import free_port

    with tempfile.TemporaryDirectory() as tmp:
        _key, tunnels = start_tunnels(tmp)
        try:
            print(f"  tunnels: {tunnels[0].info.mode}; {args.rounds} rounds alternating per size", flush=True)
            port = free_port()
            procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port), t.info.address, args.sizes,
                                       str(args.rounds)], stdout=subprocess.PIPE, text=True, env=rank_env(t))
                     for r, t in enumerate(tunnels)]
            out = procs[0].communicate(timeout=1800)[0]
            other = procs[1].communicate(timeout=60)[0]
            tunnel_cpu = sum(_cpu(t.proc.pid) for t in tunnels)
        finally:
            for t in tunnels:
                t.stop()
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    rank_cpu = result.pop("cpu") + float(next(line for line in other.splitlines() if line.startswith("CPU "))[4:])
    print(f"  {'MiB':>5} {'direct MB/s (per round)':<40} {'tunnel MB/s (per round)':<40} tunnel/direct median")
    for mib, runs in result.items():
        med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
        ratios = sorted(t / d for t, d in zip(runs["tunnel"], runs["direct"]))
        print(f"  {mib:>5} {' '.join(f'{x:7.0f}' for x in runs['direct']):<40} "
              f"{' '.join(f'{x:7.0f}' for x in runs['tunnel']):<40} {med['tunnel'] / med['direct']:5.2f} "
              f"(per round {' '.join(f'{r:.2f}' for r in ratios)})" + ("   (target >= 0.5)" if mib == "64" else ""))
    relayed = sum(int(mib) * 2 * (args.rounds + 1) for mib in result) / 1024  # GiB: each rank sends its size per all-reduce
    print(f"  CPU-s: both ranks {rank_cpu:.1f} (direct and tunnel groups together), both tunnels {tunnel_cpu:.1f} "
          f"for ~{relayed:.1f} GiB relayed ({tunnel_cpu / relayed:.2f} CPU-s per GiB: a read, a seal or open, a write)")


def _cpu(pid: int) -> float:
    """CPU-s of a process and its children (the tunnel and its namespace helper)."""
    import psutil

    p = psutil.Process(pid)
    t = p.cpu_times()
    return t.user + t.system + sum(c.cpu_times().user + c.cpu_times().system for c in p.children(recursive=True))


def connect(args) -> None:
    from tfos.cluster.driver.registry import NodeRegistry
    from tfos.cluster.driver.service import ControlService
    from tfos.feed.driver.scheduler import FeedScheduler
    from tfos.wire.channel import new_key
    from tfos.wire.clients import DriverClient

    results: dict = {}
    for r in range(args.rounds):
        for encrypt in ((False, True) if r % 2 else (True, False)):
            registry = NodeRegistry("c", [("chief", 0)])
            key = new_key(encrypt)
            service = ControlService(registry, FeedScheduler(registry, [0]).handlers(), key, "127.0.0.1").start()
            try:
                client = DriverClient("127.0.0.1", service.port, key, "c", 0)
                client.heartbeat()  # warm
                t0 = time.perf_counter()
                for _ in range(args.connections):
                    client.heartbeat()  # one connection each: handshake + request + reply
                results.setdefault(encrypt, []).append((time.perf_counter() - t0) / args.connections * 1e6)
            finally:
                service.stop()
    med = {k: sorted(v)[len(v) // 2] for k, v in results.items()}
    print(f"  a connection + one request/reply on loopback, {args.connections} per round, microseconds per round:")
    print("  clear     " + " ".join(f"{x:7.0f}" for x in results[False]) + f"   median {med[False]:7.0f}")
    print("  encrypted " + " ".join(f"{x:7.0f}" for x in results[True]) + f"   median {med[True]:7.0f}")
    print(f"  encrypted / clear time: {med[True] / med[False]:.2f} (the X25519 exchange, HKDF and two records)")
    with tempfile.TemporaryDirectory() as tmp:
        _key, tunnels = start_tunnels(tmp)
        try:
            b = tunnels[1]
            port = 7321
            server = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
                import socket, sys
                s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(128); print("up", flush=True)
                while True:
                    c, _ = s.accept(); c.sendall(b"x"); c.close()
            """), b.info.address, str(port)], stdout=subprocess.PIPE, text=True, env=rank_env(b))
            assert server.stdout.readline().strip() == "up"
            client = subprocess.run([sys.executable, "-c", textwrap.dedent("""
                import socket, sys, time
                n = int(sys.argv[3]); t0 = time.perf_counter()
                for _ in range(n):
                    s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); assert s.recv(1) == b"x"; s.close()
                print((time.perf_counter() - t0) / n * 1e6)
            """), b.info.address, str(port), str(args.connections)], capture_output=True, text=True,
                env=rank_env(tunnels[0]), timeout=600)
            server.kill()
            print(f"  through two node tunnels (TCP connect, tunnel handshake, one byte back): "
                  f"{float(client.stdout.strip()):.0f} us per connection")
        finally:
            for t in tunnels:
                t.stop()


def channel(args) -> None:
    import threading

    import numpy as np

    from tfos.wire import arrow
    from tfos.wire import channel as C

    def pair(encrypt):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        key, box = C.new_key(encrypt), {}

        def accept():
            conn, _ = srv.accept()
            box["server"] = C.Channel(conn, "client")
            box["server"].server_handshake(key)

        t = threading.Thread(target=accept)
        t.start()
        client = C.Channel.connect("127.0.0.1", srv.getsockname()[1], key, timeout=10)
        t.join()
        srv.close()
        client.settimeout(None)
        box["server"].settimeout(None)
        return client, box["server"]

    rows = 5344  # a ~16 MiB chunk, as the producer cuts them
    x = np.random.default_rng(0).random((rows, 784), dtype=np.float32)
    parts = arrow.ipc_parts(arrow.rows_to_batch([(x[i], i) for i in range(rows)]))
    gb = args.frames * sum(memoryview(p).nbytes for p in parts) / 1e9

    def one(encrypt):
        a, b = pair(encrypt)
        sender = threading.Thread(target=lambda: [a.send_data(parts) for _ in range(args.frames)])
        t0, c0 = time.perf_counter(), time.process_time()
        sender.start()
        for _ in range(args.frames):
            b.recv_frame()
        sender.join()
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        a.close()
        b.close()
        return cpu / gb, gb / secs

    default = C._SEND_RECORD, C._STAGE
    print(f"  {args.frames} frames of {gb / args.frames * 1e3:.1f} MB over loopback; CPU-s per GB (both ends), GB/s:")
    try:
        for kib in map(int, args.records.split(",")):
            C._SEND_RECORD, C._STAGE = kib << 10, max(2 * (kib << 10), 512 << 10)
            runs = {False: [], True: []}
            for encrypt in (False, True) * 3:
                runs[encrypt].append(one(encrypt))
            med = {k: (sorted(r[0] for r in v)[1], sorted(r[1] for r in v)[1]) for k, v in runs.items()}
            mark = "  (the default)" if (kib << 10) == default[0] else ""
            print(f"  records of {kib:5d} KiB: clear {med[False][0]:.3f} / {med[False][1]:.2f}, encrypted "
                  f"{med[True][0]:.3f} / {med[True][1]:.2f}: +{med[True][0] - med[False][0]:.3f} CPU-s per GB{mark}")
    finally:
        C._SEND_RECORD, C._STAGE = default


def cluster_rounds(args, ctx):
    """A node of --only cluster: all-reduce rounds when the driver's go file for them appears."""
    import datetime
    import json
    import os
    import time

    import tensorflow as tf

    from tfos import keras_dist

    work, name, mib, rounds, reps = args
    rank, _ = keras_dist.init_collectives()
    n = mib << 18  # float32 elements
    x = tf.ones([n], tf.float32)
    keras_dist.allreduce(x)  # the first call starts Gloo's connections
    # in a training step: a tensor the step made and nothing else reads, as a gradient is
    # (tf.raw_ops.Empty: the memory, no work), which the all-reduce may overwrite
    step = tf.function(lambda: keras_dist.allreduce(tf.raw_ops.Empty(shape=[n], dtype=tf.float32)))
    step()
    ours = {"tfos": lambda: keras_dist.allreduce(x), "step": step}
    if name == "clear":
        import torch
        import torch.distributed as dist

        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=300)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(dist.FileStore(os.path.join(work, "torch-store"), 2), rank, 2, opts)
        t = torch.ones(n)
        ours["torch"] = lambda: pg.allreduce([t]).wait()
        ours["torch"]()
    with open(os.path.join(ctx.node_dir, "tunnel.log") if name != "clear" else os.devnull, errors="replace") as f:
        straight = "connections to it go straight into its namespace" in f.read()
    for i in range(rounds):
        while not os.path.exists(os.path.join(work, f"go-{name}-{i}")):
            time.sleep(0.02)
        out = {"straight": straight}
        for key, fn in ours.items():
            fn()  # lines the ranks up
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            out[key] = (time.perf_counter() - t0) / reps
        path = os.path.join(work, f"res-{name}-{i}-{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)


def cluster(args) -> None:
    from tfos import InputMode, TFCluster
    from tfos.testing import local_cluster_session, wait_for

    spark = local_cluster_session(2, 1, 2048, app_name="tfos-bench-security")
    spark.sparkContext.setLogLevel("ERROR")
    mib, rounds, reps = args.cluster_mib, args.rounds, args.reps
    results: dict = {"clear": [], "encrypted": []}
    clusters = {}
    with tempfile.TemporaryDirectory() as work:
        try:
            for name in results:  # InputMode.SPARK frees the executors' slots once the nodes run
                clusters[name] = TFCluster.run(spark.sparkContext, cluster_rounds, (work, name, mib, rounds, reps), 2,
                                               0, input_mode=InputMode.SPARK, progress=False,
                                               encrypt=name == "encrypted")
            for i in range(rounds):
                for name in (("clear", "encrypted") if i % 2 else ("encrypted", "clear")):
                    open(os.path.join(work, f"go-{name}-{i}"), "w").close()
                    res = [os.path.join(work, f"res-{name}-{i}-{r}.json") for r in (0, 1)]
                    assert wait_for(lambda: all(map(os.path.exists, res)), 600), f"round {i} of {name} never ended"
                    ranks = []
                    for path in res:
                        with open(path) as f:
                            ranks.append(json.load(f))
                    results[name].append(dict(ranks[0], straight=any(r["straight"] for r in ranks)))
        finally:
            for c in clusters.values():
                c.shutdown(timeout=300)
            spark.stop()
    mb = mib * (1 << 20) / 1e6

    def col(name, key):
        return [mb / r[key] for r in results[name]]

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    enc, clear, torch = col("encrypted", "tfos"), col("clear", "tfos"), col("clear", "torch")
    print(f"  {mib} MiB, 2 ranks, {reps} all-reduces per measurement, {rounds} rounds (the clusters take turns); "
          f"MB/s (algorithm bandwidth):")
    for label, xs in (("tfos eager, encrypted", enc), ("tfos eager, clear", clear),
                      ("tfos in a step, encrypted", col("encrypted", "step")),
                      ("tfos in a step, clear", col("clear", "step")), ("torch Gloo, clear cluster", torch)):
        print(f"  {label:<27} " + " ".join(f"{x:7,.0f}" for x in xs) + f"   median {med(xs):7,.0f}")
    straight = all(r["straight"] for r in results["encrypted"])
    ratios = [e / c for e, c in zip(enc, clear)]
    path = "met straight in their namespaces" if straight else "went through the tunnels"
    print("  encrypted / clear per round " + " ".join(f"{x:.2f}" for x in ratios) + f", median {med(ratios):.2f}"
          f"   (target >= 0.8; same-host nodes {path})")
    ratios = [e / c for e, c in zip(col("encrypted", "step"), col("clear", "step"))]
    print("  in a step, encrypted / clear per round " + " ".join(f"{x:.2f}" for x in ratios)
          + f", median {med(ratios):.2f}")
    for label, xs in (("eager", clear), ("in a step", col("clear", "step"))):
        ratios = [c / t for c, t in zip(xs, torch)]
        print(f"  tfos {label}, clear / torch Gloo per round " + " ".join(f"{x:.2f}" for x in ratios)
              + f", median {med(ratios):.2f}   (target >= 1.0)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("all", "channel", "connect", "allreduce", "cluster"), default="all")
    p.add_argument("--cluster-mib", type=int, default=64, help="the all-reduce's size in MiB of --only cluster")
    p.add_argument("--reps", type=int, default=10, help="all-reduces per measurement of --only cluster")
    p.add_argument("--frames", type=int, default=60, help="frames per run of --only channel")
    p.add_argument("--records", default="1024,256,128,64", help="sending record sizes of --only channel, KiB")
    p.add_argument("--sizes", default="16,64,256", help="all-reduce sizes in MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--connections", type=int, default=300)
    args = p.parse_args(argv)
    print(f"security benchmark: {os.cpu_count()} cores")
    if args.only in ("all", "channel"):
        channel(args)
    if args.only in ("all", "connect"):
        connect(args)
    if args.only in ("all", "allreduce"):
        allreduce(args)
    if args.only in ("all", "cluster"):
        cluster(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
