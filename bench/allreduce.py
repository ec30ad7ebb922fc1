"""All-reduce bandwidth of the training backends vs a plain socket copy, 2 ranks on loopback.

For tensor sizes 4 KiB .. 256 MiB (float32), in ONE run:
  * MWMS RING          tf.distribute.MultiWorkerMirroredStrategy, CommunicationImplementation.RING
  * MWMS RING packed   the same with bytes_per_pack=4 MiB (TF's tensor fusion)
  * tfos keras_dist    tfos.keras_dist.allreduce (TF collective ops without a strategy), fp32 and fp16
  * Horovod Gloo       horovod.tensorflow.allreduce (in the TF 2.15 environment, if built:
                       bash scripts/horovod_env.sh)
  * socket copy        the limit: one process sends the same bytes to another over loopback TCP
Algorithm bandwidth = tensor bytes / seconds per all-reduce. Prints a table and the ratios to
the socket copy. Run: bash scripts/bench.sh allreduce [--sizes 4K,1M,64M] [--hvd-python PATH]
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


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(n: int) -> str:
    for u, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n // f} {u}"
    return f"{n} B"


def iterations(size: int) -> int:
    return max(3, min(200, (256 << 20) // max(size, 1) // 4))


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()  # bench only: the workers bind these right away
    return ports


# ------------------------------------------------------------------ workers
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

        keras_dist.init_collectives()
        compression = "fp16" if mode == "keras_dist_fp16" else None

        def make_input(size):
            return tf.ones([size // 4], tf.float32)

        @tf.function
        def reduce(t):
            return keras_dist.allreduce(t, average=False, compression=compression)
    for size in sizes:
        t = make_input(size)
        reduce(t)
        reduce(t)
        n = iterations(size)
        t0 = time.perf_counter()
        for _ in range(n):
            r = reduce(t)
        _ = r.numpy() if hasattr(r, "numpy") else r
        out[size] = (time.perf_counter() - t0) / n
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


def run_pair(mode: str, sizes, pack: int = 0, timeout: float = 900) -> dict:
    ports = free_ports(2)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", mode, "--rank", str(r),
                               "--ports", ",".join(map(str, ports)), "--pack", str(pack),
                               "--sizes", ",".join(map(str, sizes))], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, start_new_session=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for line in outs[0].decode().splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
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
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M")
    p.add_argument("--hvd-python", default=os.path.join(ROOT, ".venv-hvd", "bin", "python"))
    p.add_argument("--worker", default=None)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--ports", default="")
    p.add_argument("--pack", type=int, default=0)
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        if args.worker == "horovod":
            res = worker_hvd(sizes)
        else:
            res = worker_tf(args.worker, args.rank, [int(x) for x in args.ports.split(",")], sizes, args.pack)
        if res and (args.rank == 0 or args.worker == "horovod"):
            print("RESULT " + json.dumps(res), flush=True)
        return 0

    print(f"all-reduce benchmark: 2 ranks on loopback, float32 SUM, {os.cpu_count()} cores")
    results = {"socket copy (limit)": socket_copy(sizes)}
    results["MWMS RING"] = run_pair("mwms", sizes)
    results["MWMS RING bytes_per_pack=4MiB"] = run_pair("mwms", sizes, pack=4 << 20)
    results["tfos keras_dist"] = run_pair("keras_dist", sizes)
    results["tfos keras_dist fp16"] = run_pair("keras_dist_fp16", sizes)
    if os.path.exists(args.hvd_python):
        try:
            results["Horovod Gloo (TF 2.15)"] = run_horovod(args.hvd_python, sizes)
        except Exception as e:  # reported, not hidden
            print(f"Horovod run failed: {e}")
    else:
        print(f"Horovod skipped: {args.hvd_python} not found (bash scripts/horovod_env.sh builds it)")

    names = list(results)
    print(f"\n{'size':>9} | " + " | ".join(f"{n[:22]:>22}" for n in names) + "   (algorithm bandwidth, MB/s)")
    for size in sizes:
        row = [f"{size / results[n][size] / 1e6:22,.0f}" if size in results[n] else f"{'-':>22}" for n in names]
        print(f"{human(size):>9} | " + " | ".join(row))
    limit = results["socket copy (limit)"]
    print("\nratio to the socket copy:")
    for size in sizes:
        parts = [f"{n}: {limit[size] / results[n][size]:.2f}" for n in names[1:] if size in results[n]]
        print(f"  {human(size):>9}  " + ", ".join(parts))
    ref = 64 << 20
    if ref in limit:
        best = max(names[1:], key=lambda n: (ref / results[n][ref]) if ref in results[n] else 0)
        print(f"\nbest backend at 64 MiB: {best}, {limit[ref] / results[best][ref]:.2f} x the socket copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
