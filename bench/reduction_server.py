"""All-reduce and training throughput of the reduction server against Gloo's ring, between
"hosts" with links of a given rate (no Spark).

Hosts are Linux network namespaces on this machine (bench/netns.py: each joined by a veth pair to
a bridge, addresses from 198.51.100.0/24, each link shaped by ``tc tbf`` to ``--rate`` in both
directions: what a host sends and what it receives). N workers (default 4) run on hosts 1..N and
R reducers (default 4) on hosts N+1..N+R. In ONE run, with fresh processes per measurement:

  * all-reduce, ring      ``tfos.keras_dist.init_collectives(implementation='gloo')``, then
                          ``keras_dist.allreduce(t, average=False)`` of a float32 tensor of
                          ``--size-mib`` (64 MiB) made in the same ``tf.function`` (as a gradient
                          is), ``--iters`` timed calls after ``--warmup`` (and one call on filled
                          tensors whose result is checked)
  * all-reduce, reduction server  the same with ``implementation='reduction_server'``
                          (``TFOS_REDUCERS=R``) and R reducer processes
                          (``python -m tfos.tf.reduction serve ...``) on the other R hosts
  * training, ring / reduction server  a Keras 3 MLP on sklearn's ``load_digits`` (64 inputs, 10
                          classes) widened to ~25M parameters (``--depth`` 3 Dense layers of
                          ``--width`` 3500), ``model.fit`` with ``tfos.keras_dist.DistributedOptimizer``
                          (SGD with momentum) and ``BroadcastInitialWeights``, each worker on its
                          own shard, ``--batch`` 32 per worker; ``--steps`` timed steps after
                          ``--warmup-steps``

For each it prints the algorithm bandwidth (tensor bytes / seconds per all-reduce; training:
steps/s), the bytes each worker sent and received per all-reduce (per step), read from its
interface's counters (``/sys/class/net/<dev>/statistics/{tx,rx}_bytes``, in the worker's
namespace; Ethernet, IP and TCP headers included, but a veth counts 64 KiB GSO packets, so they add
~0.3% here against ~5% on a 1500-byte-MTU NIC) around the timed loop, and the ratio reduction
server / ring; then a markdown table. Beside each: the CPU seconds of each worker (and of all the
reducers together) per all-reduce or step, how busy the machine's CPUs were meanwhile (the whole
machine: other users' work included) and the packets the shaping queues dropped, to tell a link
bound from a CPU bound. With K the tensor's bytes, a ring moves 2(N-1)/N K each way
per worker (1.5 K at N = 4) and the reduction server K (K/R to and from each reducer), so with
links that bound the all-reduce it should be up to 1.5x faster at N = 4.

``--encrypt`` runs every process as an encrypted tfos cluster does: each host gets a node tunnel
(``tfos-tunnel``, started in the host's namespace, with a private namespace of its own and the
cluster's secret), the processes get tfos's shim and the nodes' private addresses, and every byte
between hosts travels through two tunnels in AES-256-GCM records (the interface counters then
count the records).

Run (root; nothing else may use 198.51.100.0/24 meanwhile, e.g. the multi-host test suite):

    python bench/reduction_server.py --rate 1gbit
    python bench/reduction_server.py --rate 1gbit --encrypt --skip-training
    python bench/reduction_server.py --rate none --skip-training       # unshaped links
    python bench/reduction_server.py --modes ring --iters 5             # the ring alone

Every process runs with ``TF_CPP_MIN_LOG_LEVEL=2``, 1 intra-op and 2 inter-op TF threads and
``OMP_NUM_THREADS=1`` (this machine's 2 cores are shared by up to 8 processes: unshaped figures
are bounded by the CPU, not the links). Every wait has a deadline (``--timeout`` per measurement):
a process that does not finish in time is reported with the tail of its stderr, and every process
is terminated, then killed, and the namespaces removed, whatever happens.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PORT = 23456  # the port of the workers' TF_CONFIG addresses (+ 1 per measurement)
MIB = 1 << 20
MODES = {"ring": "gloo", "rs": "reduction_server"}
LABELS = {"ring": "ring (Gloo)", "rs": "reduction server"}


# ======================================================================== worker (in a namespace)
def _counters(dev: str) -> tuple[int, int]:
    base = f"/sys/class/net/{dev}/statistics/"
    with open(base + "tx_bytes") as f:
        tx = int(f.read())
    with open(base + "rx_bytes") as f:
        rx = int(f.read())
    return tx, rx


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat is not per namespace)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals) - idle, sum(vals)


def _busy(j0, j1) -> float:
    """Pure: the fraction of the machine's CPUs busy between two _machine_jiffies()."""
    return (j1[0] - j0[0]) / max(1, j1[1] - j0[1])


def _result(obj: dict) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def worker_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="reduction_server.py _worker")
    p.add_argument("--kind", choices=("allreduce", "train"), required=True)
    p.add_argument("--impl", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=3500)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--collective-timeout", type=float, default=300.0)
    a = p.parse_args(argv)

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from tfos import keras_dist

    t_init = time.perf_counter()
    rank, size = keras_dist.init_collectives(implementation=a.impl, timeout_seconds=a.collective_timeout)
    init_s = time.perf_counter() - t_init
    if size < 2:
        raise SystemExit(f"expected several workers in TF_CONFIG, got size {size}")
    if a.kind == "allreduce":
        out = _worker_allreduce(a, tf, keras_dist, rank, size)
    else:
        out = _worker_train(a, tf, keras_dist, rank, size)
    out.update(rank=rank, size=size, init_s=init_s, implementation=keras_dist._state.implementation)
    _result(out)


def _worker_allreduce(a, tf, keras_dist, rank: int, size: int) -> dict:
    n = a.size_mib * MIB // 4

    @tf.function
    def filled(v):
        return keras_dist.allreduce(tf.fill([n], v), average=False)

    @tf.function
    def fresh():  # a tensor the step made and nothing else reads, as a gradient (the memory, no work)
        return keras_dist.allreduce(tf.raw_ops.Empty(shape=[n], dtype=tf.float32), average=False)

    @tf.function
    def barrier():
        return keras_dist.allreduce(tf.ones([1]), average=False)

    t = time.perf_counter()
    r = filled(tf.constant(float(rank + 1)))
    first_s = time.perf_counter() - t
    expect = size * (size + 1) / 2
    lo, hi = float(tf.reduce_min(r)), float(tf.reduce_max(r))
    del r
    for _ in range(a.warmup):
        fresh()
    barrier()
    c0 = _counters(a.dev)
    j0, cpu0, wall0 = _machine_jiffies(), time.process_time(), time.time()
    per = []
    t0 = time.perf_counter()
    for _ in range(a.iters):
        t = time.perf_counter()
        fresh()
        per.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    j1, cpu1, wall1 = _machine_jiffies(), time.process_time(), time.time()
    barrier()  # every peer is done with the loop's traffic before the counters are read
    c1 = _counters(a.dev)
    return {"correct": lo == hi == expect, "check": [lo, hi, expect], "first_s": first_s,
            "seconds": elapsed / a.iters, "median_s": statistics.median(per), "min_s": min(per),
            "tx": (c1[0] - c0[0]) / a.iters, "rx": (c1[1] - c0[1]) / a.iters, "bytes": n * 4,
            "cpu_s": (cpu1 - cpu0) / a.iters, "busy": _busy(j0, j1), "window": [wall0, wall1], "calls": a.iters}


def _worker_train(a, tf, keras_dist, rank: int, size: int) -> dict:
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    per = len(x) // size  # the same shard size on every worker
    xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    ds = (tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(per, seed=rank).repeat()
          .batch(a.batch, drop_remainder=True).prefetch(2))

    keras.utils.set_random_seed(1234)
    model = keras.Sequential([keras.Input((x.shape[1],))]
                             + [keras.layers.Dense(a.width, activation="relu") for _ in range(a.depth)]
                             + [keras.layers.Dense(10)])
    opt = keras_dist.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.01, momentum=0.9))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    warm, steps = a.warmup_steps, a.steps
    marks = {}

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch in (warm - 1, warm + steps - 1):
                marks[batch] = (time.perf_counter(), _counters(a.dev), _machine_jiffies(), time.process_time(),
                                time.time())

    t = time.perf_counter()
    hist = model.fit(ds, epochs=1, steps_per_epoch=warm + steps, verbose=0,
                     callbacks=[keras_dist.BroadcastInitialWeights(root_rank=0), Timer()])
    total_s = time.perf_counter() - t
    (t0, c0, j0, cpu0, wall0), (t1, c1, j1, cpu1, wall1) = marks[warm - 1], marks[warm + steps - 1]
    checksum = float(sum(np.sum(w.astype(np.float64)) for w in model.get_weights()))
    return {"params": int(model.count_params()), "steps_per_s": steps / (t1 - t0), "total_s": total_s,
            "tx": (c1[0] - c0[0]) / steps, "rx": (c1[1] - c0[1]) / steps,
            "loss": float(hist.history["loss"][-1]), "checksum": checksum,
            "cpu_s": (cpu1 - cpu0) / steps, "busy": _busy(j0, j1), "window": [wall0, wall1], "calls": steps,
            "grad_bytes": 4 * int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))}


# ======================================================================== the driver (root namespace)
class Failed(RuntimeError):
    pass


def tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class Proc:
    def __init__(self, name: str, host, cmd: list[str], env: dict, logs: str):
        self.name = name
        self.host = host
        self.out = os.path.join(logs, f"{name}.out")
        self.err = os.path.join(logs, f"{name}.err")
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.popen = subprocess.Popen(host.exec_args(*cmd), stdout=o, stderr=e, env=env, cwd=ROOT,
                                          start_new_session=True)

    def poll(self):
        return self.popen.poll()

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the process so far (``ip netns exec`` execs the command, so
        the Popen's pid is it); None once it has ended."""
        try:
            with open(f"/proc/{self.popen.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s (the process group: ``ip netns exec`` execs the command)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # the namespace teardown kills whatever is left

    def result(self) -> dict:
        with open(self.out, encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise Failed(f"{self.name} printed no result; stderr:\n{tail(self.err)}")
        return json.loads(lines[-1][len("RESULT "):])

    def report(self, what: str) -> str:
        return f"{self.name} ({self.host.netns} {self.host.address}) {what}; its stderr ends:\n{tail(self.err)}"


class Tunnels:
    """``--encrypt``: one tfos node tunnel per host, started in the host's namespace as a node agent
    starts it, each told where the others' are; :meth:`env` is what a process on host i needs (the
    shim, its private address), :meth:`address` the address its peers reach it at."""

    def __init__(self, hosts, logs: str, timeout: float = 30.0):
        import select

        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        from tfos.tunnel import addresses, build
        from tfos.tunnel import node as tunnel_node
        from tfos.tunnel.agent import parse_ready
        from tfos.wire.channel import new_key

        binary, self.shim = build.require()
        self.block = addresses.block_for("bench-reduction-server")
        key = new_key(True)
        self.procs, self.controls, ports = [], [], []
        try:
            for i, h in enumerate(hosts):
                control = os.path.join(logs, f"tunnel{i}.sock")
                with open(os.path.join(logs, f"tunnel{i}.err"), "wb") as err:
                    p = subprocess.Popen(h.exec_args(binary), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, start_new_session=True)
                self.procs.append(p)
                p.stdin.write(json.dumps({"secret": key.secret, "self_ip": self.address(i), "block": self.block,
                                          "control": control, "bind_host": h.address}).encode() + b"\n")
                p.stdin.flush()  # stays open: the tunnel ends with it
                if not select.select([p.stdout], [], [], timeout)[0]:
                    raise Failed(f"the tunnel of {h} did not start within {timeout:.0f}s")
                port, mode, reason = parse_ready(p.stdout.readline().decode(errors="replace"))
                if mode != "netns":
                    raise Failed(f"the tunnel of {h} runs in {mode} mode ({reason}), not in a private namespace")
                self.controls.append(control)
                ports.append(port)
            for i in range(len(hosts)):
                tunnel_node.request(self.controls[i], "PEERS " + json.dumps(
                    [[self.address(j), h.address, ports[j], False] for j, h in enumerate(hosts) if j != i]))
        except BaseException:
            self.stop()
            raise

    def address(self, i: int) -> str:
        from tfos.tunnel import addresses

        return addresses.node_address(self.block, i)

    def env(self, i: int, port: int) -> dict:
        from tfos.tunnel.agent import shim_environment
        from tfos.wire import messages as M

        info = M.TunnelInfo(0, "netns", self.controls[i], self.block, self.address(i), port)
        return shim_environment(info, self.shim, {})

    def stop(self) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def child_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("TFOS_") and k != "TFOS_CACHE_DIR") and k not in ("TF_CONFIG", "PYTHONPATH")}
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tfos.cluster.agent.node_agent import memory_environment  # the malloc/allocator settings of a TF process

    env.update(memory_environment(env))
    env.update({"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_measurement(args, net, kind: str, mode: str, port: int, logs: str, timeout: float,
                    tunnels: Tunnels | None = None) -> list[dict]:
    """Start the workers (and the reducers for mode 'rs'), wait for them all within ``timeout`` s;
    the workers' results in rank order. Failed with the culprit's stderr if anything fails or hangs."""
    workers_h = net.hosts[:args.workers]
    reducers_h = net.hosts[args.workers:args.workers + args.reducers]
    impl = MODES[mode]

    def address(i: int) -> str:  # host i's address for the others (its private one with --encrypt)
        return tunnels.address(i) if tunnels else net.hosts[i].address

    def shim(i: int) -> dict:
        return tunnels.env(i, port) if tunnels else {}

    addresses = [f"{address(i)}:{port}" for i in range(len(workers_h))]
    extra = {"TFOS_REDUCERS": str(args.reducers)} if mode == "rs" else {}
    workers, reducers = [], []
    tag = f"{kind}-{mode}"
    started = time.monotonic()
    drops0 = net.drops()
    try:
        for i, h in enumerate(workers_h):
            tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
            cmd = [sys.executable, os.path.abspath(__file__), "_worker", "--kind", kind, "--impl", impl,
                   "--dev", h.dev, "--size-mib", str(args.size_mib), "--iters", str(args.iters),
                   "--warmup", str(args.warmup), "--steps", str(args.steps),
                   "--warmup-steps", str(args.warmup_steps), "--batch", str(args.batch),
                   "--width", str(args.width), "--depth", str(args.depth),
                   "--collective-timeout", str(args.collective_timeout)]
            workers.append(Proc(f"{tag}-worker{i}", h, cmd,
                                child_env({"TF_CONFIG": json.dumps(tf_config), **extra, **shim(i)}), logs))
        if mode == "rs":
            for r, h in enumerate(reducers_h):
                cmd = [sys.executable, "-m", "tfos.tf.reduction", "serve", "--index", str(r),
                       "--workers", str(args.workers), "--reducers", str(args.reducers),
                       "--store", addresses[0], "--host", address(args.workers + r),
                       "--timeout", str(args.collective_timeout)]
                reducers.append(Proc(f"{tag}-reducer{r}", h, cmd, child_env(shim(args.workers + r)), logs))
        deadline = started + timeout
        samples = []  # (wall time, CPU seconds of each reducer): their CPU in the workers' timed window
        while True:
            if reducers:
                samples.append((time.time(), [p.cpu_seconds() for p in reducers]))
            for p in workers + reducers:
                rc = p.poll()
                if rc not in (None, 0):
                    raise Failed(p.report(f"exited with {rc} after {time.monotonic() - started:.0f}s"))
            if all(p.poll() == 0 for p in workers):
                break
            if time.monotonic() > deadline:
                hung = [p for p in workers if p.poll() is None]
                raise Failed(f"{len(hung)} worker(s) did not finish within {timeout:.0f}s:\n"
                             + "\n".join(p.report("still running") for p in hung))
            time.sleep(0.2)
        # the reducers serve until the workers' processes end, then exit 0
        deadline = time.monotonic() + args.reducer_grace
        while any(p.poll() is None for p in reducers) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in reducers:
            rc = p.poll()
            if rc is None:
                raise Failed(p.report(f"still running {args.reducer_grace:.0f}s after the workers ended"))
            if rc != 0:
                raise Failed(p.report(f"exited with {rc}"))
        res = sorted((p.result() for p in workers), key=lambda r: r["rank"])
        drops = net.drops() - drops0  # the whole measurement's, start-up and warm-up included
        reducer_cpu = window_cpu(samples, res[0]["window"], res[0]["calls"]) if reducers else None
        for r in res:
            r["drops"] = drops
            r["reducer_cpu_s"] = reducer_cpu
        return res
    finally:
        for p in workers + reducers:
            p.stop()


def window_cpu(samples, window, calls: int) -> float | None:
    """Pure: the CPU seconds all reducers used per call within ``window`` (wall times), from the
    samples nearest its ends (taken every 0.2 s); None if the samples do not cover it."""
    inside = [(t, c) for t, c in samples if None not in c]
    before = [s for s in inside if s[0] <= window[0]]
    after = [s for s in inside if s[0] >= window[1]]
    if not before or not after:
        return None
    (ta, ca), (tb, cb) = before[-1], after[0]
    return (sum(cb) - sum(ca)) / calls * (window[1] - window[0]) / (tb - ta)


def default_timeout(args, kind: str) -> float:
    """Seconds a measurement may take: start-up and the Gloo op's first build, plus each
    all-reduce (or step) at a tenth of the link rate's ideal ring time (at least 5 s)."""
    from netns import rate_bits

    rate = rate_bits(args.rate) if args.rate else 10e9
    if kind == "allreduce":
        k = args.size_mib * MIB
        calls = args.iters + args.warmup + 3
    else:
        k = 4 * (args.width * (64 + 10) + (args.depth - 1) * args.width * args.width)
        calls = args.steps + args.warmup_steps + 2
    per_call = max(5.0, 10 * 2 * k * 8 / rate)
    return 300.0 + calls * per_call


def summarize_allreduce(res: list[dict]) -> dict:
    k = res[0]["bytes"]
    seconds = max(r["seconds"] for r in res)  # synchronous: the slowest worker's view is the all-reduce's
    return {"bytes": k, "seconds": seconds, "median_s": max(r["median_s"] for r in res),
            "algbw": k / seconds, "tx": statistics.mean(r["tx"] for r in res),
            "rx": statistics.mean(r["rx"] for r in res), "tx_max": max(r["tx"] for r in res),
            "rx_max": max(r["rx"] for r in res), "correct": all(r["correct"] for r in res),
            "check": res[0]["check"], "init_s": max(r["init_s"] for r in res),
            "cpu_s": statistics.mean(r["cpu_s"] for r in res), "busy": res[0]["busy"], "drops": res[0]["drops"],
            "reducer_cpu_s": res[0]["reducer_cpu_s"],
            "implementation": res[0]["implementation"]}


def summarize_train(res: list[dict]) -> dict:
    sums = {r["checksum"] for r in res}
    return {"steps_per_s": min(r["steps_per_s"] for r in res), "params": res[0]["params"],
            "grad_bytes": res[0]["grad_bytes"], "tx": statistics.mean(r["tx"] for r in res),
            "rx": statistics.mean(r["rx"] for r in res), "identical": len(sums) == 1,
            "loss": res[0]["loss"], "implementation": res[0]["implementation"],
            "cpu_s": statistics.mean(r["cpu_s"] for r in res), "busy": res[0]["busy"], "drops": res[0]["drops"],
            "reducer_cpu_s": res[0]["reducer_cpu_s"]}


def mib(x: float) -> str:
    return f"{x / MIB:,.1f}"


def print_allreduce(mode: str, s: dict) -> None:
    k = s["bytes"]
    print(f"  {LABELS[mode]:<17} {s['seconds'] * 1e3:8.1f} ms per all-reduce (median {s['median_s'] * 1e3:.1f}), "
          f"algorithm bandwidth {s['algbw'] / 1e6:8.1f} MB/s; per worker sent {mib(s['tx'])} MiB "
          f"({s['tx'] / k:.2f} K), received {mib(s['rx'])} MiB ({s['rx'] / k:.2f} K); "
          f"result {'correct' if s['correct'] else 'WRONG ' + str(s['check'])}", flush=True)


def print_train(mode: str, s: dict) -> None:
    g = s["grad_bytes"]
    print(f"  {LABELS[mode]:<17} {s['steps_per_s']:6.3f} steps/s; per worker per step sent {mib(s['tx'])} MiB "
          f"({s['tx'] / g:.2f} G), received {mib(s['rx'])} MiB ({s['rx'] / g:.2f} G); last loss {s['loss']:.3f}; "
          f"replicas {'identical' if s['identical'] else 'DIFFER'}", flush=True)


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def markdown(args, results: dict) -> str:
    modes = [m for m in ("ring", "rs") if m in args.modes]
    head = "| | " + " | ".join(LABELS[m] for m in modes) + (" | RS / ring |" if len(modes) == 2 else " |")
    sep = "|---|" + "---:|" * (len(modes) + (1 if len(modes) == 2 else 0))
    rows = []

    def row(label, key, fmt, kind, ratio_of=None):
        vals = [results.get((kind, m)) for m in modes]
        cells = [fmt(v[key]) if v else "failed" for v in vals]
        if len(modes) == 2:
            cells.append(ratio(*(v[ratio_of or key] if v else None for v in reversed(vals))))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    k = args.size_mib
    row(f"{k} MiB all-reduce: algorithm bandwidth (MB/s)", "algbw", lambda v: f"{v / 1e6:,.0f}", "allreduce")
    row("ms per all-reduce", "seconds", lambda v: f"{v * 1e3:,.0f}", "allreduce")
    row("MiB sent per worker per all-reduce", "tx", lambda v: f"{v / MIB:,.1f} ({v / (k * MIB):.2f} K)", "allreduce")
    row("MiB received per worker per all-reduce", "rx", lambda v: f"{v / MIB:,.1f} ({v / (k * MIB):.2f} K)",
        "allreduce")
    if not args.skip_training:
        row("training: steps/s", "steps_per_s", lambda v: f"{v:.3f}", "train")
        row("MiB sent per worker per step", "tx", lambda v: f"{v / MIB:,.1f}", "train")
    return "\n".join([head, sep] + rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="1gbit", help="each host's link rate, both directions (tc tbf), or 'none'")
    p.add_argument("--tc-latency-ms", type=float, default=50.0, help="the tbf queue, in ms of the rate")
    p.add_argument("--size-mib", type=int, default=64, help="all-reduced tensor (float32), MiB")
    p.add_argument("--iters", type=int, default=10, help="timed all-reduces")
    p.add_argument("--warmup", type=int, default=2, help="untimed all-reduces first")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reducers", type=int, default=4)
    p.add_argument("--modes", default="ring,rs", help="ring, rs (reduction server) or both: ring,rs")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--width", type=int, default=3500, help="units of each hidden Dense layer")
    p.add_argument("--depth", type=int, default=3, help="hidden Dense layers")
    p.add_argument("--timeout", type=float, default=0.0, help="seconds per measurement (default: from the rate)")
    p.add_argument("--collective-timeout", type=float, default=300.0,
                   help="init_collectives(timeout_seconds=...) of the workers, --timeout of the reducers")
    p.add_argument("--reducer-grace", type=float, default=60.0,
                   help="seconds the reducers may take to exit after the workers ended")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (always kept on failure)")
    p.add_argument("--encrypt", action="store_true",
                   help="as an encrypted tfos cluster: a node tunnel per host carries every byte between hosts")
    args = p.parse_args(argv)
    args.rate = None if args.rate.lower() in ("none", "0", "") else args.rate
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error("--modes: ring, rs or ring,rs")
    if args.workers < 2 or args.reducers < 1:
        p.error("at least 2 workers and 1 reducer")
    sys.path.insert(0, HERE)
    import netns

    def terminated(signum, frame):  # SIGTERM: clean up as on Ctrl-C (processes, namespaces, links)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, terminated)

    hosts = args.workers + (args.reducers if "rs" in args.modes else 0)
    logs = tempfile.mkdtemp(prefix="tfos-bench-rs-")
    results, failures = {}, []
    kinds = ["allreduce"] + ([] if args.skip_training else ["train"])
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# reduction server vs ring: {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, "
          f"{args.workers} workers, {args.reducers} reducers, links {args.rate or 'unshaped'}, "
          f"{args.size_mib} MiB float32, {args.iters} timed all-reduces, "
          f"{'encrypted (node tunnels)' if args.encrypt else 'clear'}; logs in {logs}", flush=True)
    try:
        with netns.Net(hosts, rate=args.rate, latency_ms=args.tc_latency_ms) as net:
            tunnels = Tunnels(net.hosts, logs) if args.encrypt else None
            try:
                if args.rate:
                    print(f"  links: {net.qdiscs(net.hosts[0])}", flush=True)
                port = PORT
                for kind in kinds:
                    print(f"\n## {kind}" + (f": {args.size_mib} MiB float32" if kind == "allreduce" else
                                            f": MLP {args.depth}x{args.width} on load_digits, batch {args.batch}"
                                            f" per worker, {args.steps} timed steps"), flush=True)
                    for mode in args.modes:
                        timeout = args.timeout or default_timeout(args, kind)
                        t = time.monotonic()
                        try:
                            res = run_measurement(args, net, kind, mode, port, logs, timeout, tunnels)
                        except Failed as e:
                            failures.append(f"{kind} {LABELS[mode]}: {e}")
                            print(f"  {LABELS[mode]:<17} FAILED after {time.monotonic() - t:.0f}s:\n{e}", flush=True)
                            continue
                        finally:
                            port += 1  # fresh ports: no wait for the last measurement's sockets
                        if kind == "allreduce":
                            results[(kind, mode)] = s = summarize_allreduce(res)
                            print_allreduce(mode, s)
                        else:
                            results[(kind, mode)] = s = summarize_train(res)
                            print_train(mode, s)
                        per = "all-reduce" if kind == "allreduce" else "step"
                        red = (f", all reducers' CPU {s['reducer_cpu_s']:.2f} s per {per}"
                               if s["reducer_cpu_s"] is not None else "")
                        print(f"  {'':<17} (CPU of each worker {s['cpu_s']:.2f} s per {per}{red}, machine's CPUs "
                              f"{s['busy']:.0%} busy "
                              f"meanwhile; {s['drops']} packets dropped by the shaping queues; "
                              f"{time.monotonic() - t:.0f}s with start-up; implementation {s['implementation']})",
                              flush=True)
                    if len(args.modes) == 2 and all((kind, m) in results for m in args.modes):
                        a, b = results[(kind, "rs")], results[(kind, "ring")]
                        key = "algbw" if kind == "allreduce" else "steps_per_s"
                        print(f"  reduction server / ring: {a[key] / b[key]:.2f}x "
                              f"({'algorithm bandwidth' if kind == 'allreduce' else 'steps/s'}), "
                              f"bytes sent per worker {a['tx'] / b['tx']:.2f}x", flush=True)
            finally:
                if tunnels:
                    tunnels.stop()
    except KeyboardInterrupt:
        failures.append("interrupted")
    print("\n" + markdown(args, results), flush=True)
    if failures or args.keep_logs:
        print(f"\nlogs kept in {logs}", flush=True)
    else:
        shutil.rmtree(logs, ignore_errors=True)
    if failures:
        print("\nFAILED: " + "; ".join(f.splitlines()[0] for f in failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        worker_main(sys.argv[2:])
    else:
        sys.exit(main())
