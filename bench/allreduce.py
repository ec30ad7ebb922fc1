"""All-reduce bandwidth of the training backends vs PyTorch's Gloo, on 2 and 3 ranks on loopback.

For each tensor size (float32, default 16, 64 and 256 MiB) and rank count, in ONE run:
  * torch Gloo (ref)   torch.distributed's ProcessGroupGloo.allreduce on a torch tensor, in place:
                       the reference the issue names
  * torch in tf.function  the same call on the same torch tensor, made from a tf.py_function inside
                       a tf.function: no TF tensor, the same Gloo work; the ceiling of tfos's
                       tf.py_function path (without its op; TF's function-call cost included)
  * tfos gloo          tfos.keras_dist.allreduce(t) with implementation='gloo' (the default on CPU
                       hosts with PyTorch) inside tf.function, t made by the step and read by
                       nothing else (as a gradient is): reduced in its own memory (TF forwards it),
                       through tfos's op (scripts/bench.sh builds it; tfos.tf.gloo_kernel)
  * tfos gloo 4/call   4 such all-reduces, each on the last's result, in one tf.function call, the
                       time divided by 4: the all-reduce with TF's cost per function call spread
                       over 4, as in a training step, where it is one op of the step's function
  * tfos gloo grads    the DistributedOptimizer under model.fit: 4 such tensors of size/4 (gradients
                       pre-divided by the workers through its scale_loss), summed, each in its own
                       memory, all issued in one call to Gloo
  * tfos gloo grads loop  the same 4 from a custom loop's apply (no scale_loss): the mean, one
                       scaling pass after the sum
  * tfos gloo kept     allreduce(t) of a t the caller keeps: the result is a copy (chunked, each
                       chunk's all-reduce started while the next is copied)
  * tfos gloo eager    allreduce(t) called eagerly (a notebook, a custom loop without tf.function):
                       through tfos's op, a copy as for "kept"
  * eager, py_function the same call through the tf.py_function path (the op switched off for it)
  * tfos gloo fp16     tfos.keras_dist.allreduce(t, compression='fp16'): half the bytes
  * tfos gloo bf16     the same with compression='bf16' (Gloo sums bfloat16 faster than float16)
  * tfos tf            tfos.keras_dist.allreduce with implementation='tf' (TF collective ops)
  * MWMS RING          tf.distribute.MultiWorkerMirroredStrategy, CommunicationImplementation.RING
  * Horovod Gloo       horovod.tensorflow.allreduce, 2 ranks only (the TF 2.15 environment, if built:
                       bash scripts/horovod_env.sh)
  * socket copy        one process sends the same bytes to another over loopback TCP
Algorithm bandwidth = tensor bytes / seconds per all-reduce. Prints a table per rank count and
the ratios of tfos gloo to the torch reference and to MWMS RING.
Run: bash scripts/bench.sh allreduce [--sizes 16M,64M,256M] [--ranks 2,3] [--hvd-python PATH]
Workers run with the environment tfos's agent gives a TF process (tfos.cluster.agent.node_agent).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PER_CALL = {"tfos gloo 4/call": 4}  # all-reduces per call of these variants (their time is per all-reduce)


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(n: int) -> str:
    for u, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n // f} {u}"
    return f"{n} B"


def iterations(size: int) -> int:
    return max(8, min(200, (1 << 30) // max(size, 1)))


def tf_process_env() -> dict:
    """The environment the tfos agent adds for a TF process (malloc and allocator settings)."""
    sys.path.insert(0, ROOT)
    from tfos.cluster.agent.node_agent import memory_environment

    return memory_environment(os.environ)


# ------------------------------------------------------------------ workers
def timed(fn, size: int, rounds: int = 3) -> float:
    """Seconds per call of fn: the median of ``rounds`` rounds of :func:`iterations` calls, after 2
    warm-up calls."""
    fn()
    fn()
    n = iterations(size)
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - t0) / n)
    return sorted(per_call)[len(per_call) // 2]


def worker_tf(mode: str, rank: int, ports, sizes, pack: int) -> dict:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    import tensorflow as tf

    out = {}
    if mode == "mwms":
        comm = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING, bytes_per_pack=pack)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)

        def make_input(size):
            with strategy.scope():
                return tf.Variable(tf.ones([size // 4], tf.float32))

        @tf.function
        def reduce(v):
            def fn():
                return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v))
            return strategy.experimental_local_results(strategy.run(fn))[0]
    else:
        sys.path.insert(0, ROOT)
        from tfos import keras_dist

        keras_dist.init_collectives(implementation="tf" if mode == "keras_dist_tf" else "gloo")
        compression = mode.rsplit("_", 1)[1] if mode.endswith(("fp16", "bf16")) else None

        # A step's gradients are tensors the step made and nothing else reads: made here in the
        # step (tf.raw_ops.Empty: the memory, no work), as in worker_gloo_alternating.
        def make_input(size):
            return tf.constant(size // 4)

        @tf.function
        def reduce(n):  # a tensor the step made (the compression cast is one anyway)
            return keras_dist.allreduce(tf.raw_ops.Empty(shape=[n], dtype=tf.float32), average=False,
                                        compression=compression)

    for size in sizes:
        t = make_input(size)
        out[size] = timed(lambda: reduce(t), size)  # eager call: returns once the result is computed
    return out


def worker_gloo_alternating(rank: int, ports, sizes, rounds: int = 5, threads=()) -> dict:
    """The torch reference and tfos's Gloo variants in the same two processes, on the same Gloo
    connections (keras_dist's group), alternating round by round so that the machine's drift
    hits all alike; per variant the median round. ``threads``: also "grads" on extra Gloo groups
    of that many threads each (tfos.tf.gloo.THREADS is the group's own)."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    import datetime

    import tensorflow as tf
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    from tfos import keras_dist
    from tfos.tf.workers import _state

    keras_dist.init_collectives(implementation="gloo")
    group = _state.gloo
    pg = group.pg
    extra = {}
    for th in threads:  # the same ranks, another Gloo group with th threads (a store prefix of its own)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=group.timeout_seconds)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._threads = th
        extra[th] = dist.ProcessGroupGloo(dist.PrefixStore(f"bench-threads-{th}", group._store), rank, group.size,
                                          opts)

    def variants(size):
        n = size // 4  # static shapes, as a model's gradients have

        @tf.function
        def fresh():  # a tensor the step made and nothing else reads, as a gradient
            return keras_dist.allreduce(tf.raw_ops.Empty(shape=[n], dtype=tf.float32), average=False)

        @tf.function
        def fresh_4():  # 4 in one call, each on the last's result (forwarded: in the same memory)
            x = tf.raw_ops.Empty(shape=[n], dtype=tf.float32)
            for _ in range(PER_CALL["tfos gloo 4/call"]):
                x = keras_dist.allreduce(x, average=False)
            return x

        def four():
            return [tf.raw_ops.Empty(shape=[n // 4], dtype=tf.float32) for _ in range(4)]

        @tf.function
        def grads():  # 4 of them, the DistributedOptimizer under model.fit: scale_loss pre-divided, summed
            return keras_dist._all_reduce_list(four(), average=False)

        @tf.function
        def grads_loop():  # 4 of them, a custom loop's apply without scale_loss: the mean after the sum
            return keras_dist._all_reduce_list(four(), average=True)

        @tf.function
        def kept(t):  # the caller keeps t: the result is a copy
            return keras_dist.allreduce(t, average=False)

        def on(group_pg):  # grads on another group's connections
            def run():
                group.pg = group_pg
                try:
                    return grads()
                finally:
                    group.pg = pg
            return run

        @tf.function
        def torch_in_tf_function():  # the reference's own call on its own tensor, from a py_function in a
            # tf.function: the ceiling of any path that enters Gloo the way tfos does
            return tf.py_function(lambda: pg.allreduce([ref]).wait() or 0, [], tf.int32)

        def eager_through_py_function():  # the eager path without tfos's op (as before it took eager calls)
            kernel, group._kernel = group._kernel, None
            try:
                return keras_dist.allreduce(t, average=False)
            finally:
                group._kernel = kernel

        ref, t = torch.ones(n), tf.ones([n], tf.float32)
        fns = {"torch Gloo (ref)": lambda: pg.allreduce([ref]).wait(), "torch in tf.function": torch_in_tf_function,
               "tfos gloo": fresh, "tfos gloo 4/call": fresh_4,
               "tfos gloo grads": grads, "tfos gloo grads loop": grads_loop, "tfos gloo kept": lambda: kept(t),
               "tfos gloo eager": lambda: keras_dist.allreduce(t, average=False),
               "eager, py_function": eager_through_py_function}
        fns.update({f"grads, {th} threads": on(p) for th, p in extra.items()})
        return fns

    out = {}
    for size in sizes:
        fns = variants(size)
        for fn in fns.values():
            fn()
            fn()
        n = iterations(size)
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times[name].append((time.perf_counter() - t0) / n / PER_CALL.get(name, 1))
        for name, ts in times.items():
            out.setdefault(name, {})[size] = sorted(ts)[len(ts) // 2]
    return out


def worker_hvd(sizes) -> dict:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    out = {}
    for size in sizes:
        t = tf.ones([size // 4], tf.float32)
        hvd.allreduce(t, op=hvd.Sum)
        n = iterations(size)
        t0 = time.perf_counter()
        for i in range(n):
            r = hvd.allreduce(t, op=hvd.Sum, name=f"t{size}_{i}")
        _ = r.numpy()
        out[size] = (time.perf_counter() - t0) / n
    return out if hvd.rank() == 0 else {}


def run_ranks(mode: str, sizes, ranks: int = 2, pack: int = 0, timeout: float = 1800, threads: str = "") -> dict:
    sys.path.insert(0, ROOT)
    from tfos.testing.ports import free_ports

    ports = free_ports(ranks)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **tf_process_env())
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", mode, "--rank", str(r),
                               "--ports", ",".join(map(str, ports)), "--pack", str(pack),
                               "--sizes", ",".join(map(str, sizes)), "--gloo-threads", threads],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, start_new_session=True) for r in range(ranks)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for line in outs[0].decode().splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            if mode == "alternating":
                return {name: {int(k): v for k, v in r.items()} for name, r in res.items()}
            return {int(k): v for k, v in res.items()}
    raise RuntimeError(f"{mode} workers produced no result")


def run_horovod(hvd_python: str, sizes, timeout: float = 900) -> dict:
    hvdrun = os.path.join(os.path.dirname(hvd_python), "horovodrun")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([hvdrun, "-np", "2", "--gloo", "-H", "localhost:2", hvd_python, __file__, "--worker",
                          "horovod", "--sizes", ",".join(map(str, sizes))], capture_output=True, text=True,
                         timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return {int(k): v for k, v in json.loads(line.split("RESULT ", 1)[1]).items()}
    raise RuntimeError("horovod workers produced no result:\n" + out.stdout[-2000:] + out.stderr[-2000:])


def socket_copy(sizes) -> dict:
    """Seconds to move each size from one process to another over loopback TCP (best of 3)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = ("import socket,sys\n"
            f"s=socket.create_connection(('127.0.0.1',{port}))\n"
            "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
            "buf=bytearray(1<<20)\n"
            "while True:\n"
            "    h=s.recv(8)\n"
            "    if not h: break\n"
            "    n=int.from_bytes(h,'big'); got=0\n"
            "    while got<n: got+=s.recv_into(buf, min(len(buf), n-got))\n"
            "    s.sendall(b'k')\n")
    peer = subprocess.Popen([sys.executable, "-c", code])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = {}
    try:
        for size in sizes:
            data = bytes(size)
            best = float("inf")
            for _ in range(3):
                n = iterations(size)
                t0 = time.perf_counter()
                for _ in range(n):
                    conn.sendall(size.to_bytes(8, "big") + data if size <= 65536 else size.to_bytes(8, "big"))
                    if size > 65536:
                        conn.sendall(data)
                    conn.recv(1)
                best = min(best, (time.perf_counter() - t0) / n)
            out[size] = best
    finally:
        conn.close()
        srv.close()
        peer.wait(timeout=30)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="16M,64M,256M")
    p.add_argument("--ranks", default="2,3", help="rank counts, e.g. 2,3")
    p.add_argument("--skip", default="", help="comma-separated columns to leave out, e.g. 'MWMS RING,tfos tf'")
    p.add_argument("--hvd-python", default=os.path.join(ROOT, ".venv-hvd", "bin", "python"))
    p.add_argument("--worker", default=None)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--ports", default="")
    p.add_argument("--pack", type=int, default=0)
    p.add_argument("--gloo-threads", default="", help="also run 'grads' on Gloo groups of these thread counts, "
                   "e.g. 2,4 (alternating with the rest)")
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        if args.worker == "horovod":
            res = worker_hvd(sizes)
        elif args.worker == "alternating":
            res = worker_gloo_alternating(args.rank, [int(x) for x in args.ports.split(",")], sizes,
                                          rounds=7 if args.gloo_threads else 5,
                                          threads=[int(x) for x in args.gloo_threads.split(",") if x])
        else:
            res = worker_tf(args.worker, args.rank, [int(x) for x in args.ports.split(",")], sizes, args.pack)
        if res and (args.rank == 0 or args.worker == "horovod"):
            print("RESULT " + json.dumps(res), flush=True)
        return 0

    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    print(f"all-reduce benchmark: ranks {args.ranks} on loopback, float32 SUM, {os.cpu_count()} cores, "
          f"TF process environment {tf_process_env()}")
    # the reference and tfos's fp32 Gloo paths: alternating in one pair of processes (see
    # worker_gloo_alternating); the other columns each in processes of their own
    columns = [("tfos gloo fp16", "keras_dist_gloo_fp16"), ("tfos gloo bf16", "keras_dist_gloo_bf16"),
               ("tfos tf", "keras_dist_tf"), ("MWMS RING", "mwms")]
    for ranks in [int(r) for r in args.ranks.split(",")]:
        results = {}
        if ranks == 2 and "socket copy" not in skip:
            results["socket copy"] = socket_copy(sizes)
        results.update(run_ranks("alternating", sizes, ranks, threads=args.gloo_threads))
        for name, mode in columns:
            if name not in skip:
                results[name] = run_ranks(mode, sizes, ranks)
        if ranks == 2 and "Horovod Gloo" not in skip:
            if os.path.exists(args.hvd_python):
                try:
                    results["Horovod Gloo"] = run_horovod(args.hvd_python, sizes)
                except Exception as e:  # reported, not hidden
                    print(f"Horovod run failed: {e}")
            else:
                print(f"Horovod skipped: {args.hvd_python} not found (bash scripts/horovod_env.sh builds it)")
        print_table(ranks, sizes, results)
    return 0


def print_table(ranks: int, sizes, results) -> None:
    names = list(results)
    print(f"\n{ranks} ranks, algorithm bandwidth in MB/s")
    print(f"{'size':>9} | " + " | ".join(f"{n[:16]:>16}" for n in names))
    for size in sizes:
        row = [f"{size / results[n][size] / 1e6:16,.0f}" if size in results[n] else f"{'-':>16}" for n in names]
        print(f"{human(size):>9} | " + " | ".join(row))
    ref = results.get("torch Gloo (ref)")
    mwms = results.get("MWMS RING")
    print(f"ratios, {ranks} ranks (>1: faster than the reference)")
    for size in sizes:
        parts = []
        for name in ("torch in tf.function", "tfos gloo", "tfos gloo 4/call", "tfos gloo grads", "tfos gloo grads loop",
                     "tfos gloo kept", "tfos gloo eager", "eager, py_function", "tfos gloo fp16", "tfos gloo bf16", *(n for n in names if n.startswith("grads, "))):
            if name in results:
                if ref:
                    parts.append(f"{name}/torch {ref[size] / results[name][size]:.2f}")
                if mwms:
                    parts.append(f"{name}/MWMS {mwms[size] / results[name][size]:.1f}")
        print(f"  {human(size):>9}  " + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
