"""What a process that is not part of a tfos job, and holds no secret, can do to it: TensorFlow's
remote eager client (``experimental_connect_to_host`` then ``tf.io.read_file`` on the remote
device, as an attacker would) and a torch TCPStore client. Each probe is a fresh process,
optionally inside a test host's network namespace and as another user (uid 65534 with only the
capability to read files, so that it can load the test environment's Python: no network privilege).

TF's client never gives up on an address that does not answer gRPC (it retries forever), so a probe
gets a fixed ``window`` to answer, counted from the moment it has loaded its libraries and starts to
connect; a probe that never gets that far is an error, not a refusal. The probes run concurrently."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

EAGER = r"""
import json, sys
address, job = sys.argv[1], sys.argv[2]
import tensorflow as tf
print("CONNECTING", flush=True)
try:
    tf.config.experimental_connect_to_host(address, job_name=job)
    with tf.device(f"/job:{job}/replica:0/task:0/device:CPU:0"):
        out = tf.io.read_file("/proc/self/cmdline").numpy()
    print(json.dumps({"ran": True, "answer": out.decode(errors="replace")[:200]}), flush=True)
except Exception as e:
    print(json.dumps({"ran": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
"""

STORE = r"""
import datetime, json, sys
host, port = sys.argv[1], int(sys.argv[2])
import torch.distributed as dist
print("CONNECTING", flush=True)
try:
    store = dist.TCPStore(host, port, 2, is_master=False, timeout=datetime.timedelta(seconds=10))
    print(json.dumps({"ran": True, "answer": f"{store.num_keys()} keys"}), flush=True)
except Exception as e:
    print(json.dumps({"ran": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
"""

AS_OTHER_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
                 "--ambient-caps=+dac_read_search"]
LOAD_TIMEOUT = 300.0


def eager(address: str, job: str = "worker", namespace: str | None = None, other_user: bool = False) -> dict:
    """A probe: TF's remote eager client runs an operation at ``address`` (as task 0 of ``job``)."""
    return {"code": EAGER, "args": [address, job], "namespace": namespace, "other_user": other_user}


def store(host: str, port: int, namespace: str | None = None, other_user: bool = False) -> dict:
    """A probe: a torch TCPStore client gets into a store at ``host:port`` (Gloo's old rendezvous)."""
    return {"code": STORE, "args": [host, str(port)], "namespace": namespace, "other_user": other_user}


def _run(probe: dict, window: float) -> dict:
    cmd = [sys.executable, "-u", "-c", probe["code"], *probe["args"]]
    if probe["other_user"]:
        cmd = AS_OTHER_USER + cmd
    if probe["namespace"]:
        cmd = ["ip", "netns", "exec", probe["namespace"]] + cmd
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MPLCONFIGDIR="/tmp")
    env.pop("TFOS_NODE_CONFIG", None)
    result = {"probe": probe["args"], "namespace": probe["namespace"], "other_user": probe["other_user"]}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT
        answering = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                result.update(ran=False, error=(f"no answer within {window:.0f}s of connecting" if answering else
                                                f"never started to connect within {LOAD_TIMEOUT:.0f}s"),
                              loaded=answering)
                return result
            if not select.select([proc.stdout], [], [], left)[0]:
                continue
            line = proc.stdout.readline()
            if not line:
                result.update(ran=False, error="the probe exited without an answer", loaded=answering)
                return result
            if line.startswith("CONNECTING"):
                answering = True
                deadline = time.monotonic() + window
            elif line.startswith("{"):
                result.update(json.loads(line), loaded=True)
                return result
    finally:
        proc.kill()
        proc.wait(30)


def run_all(probes: list[dict], window: float = 20.0, parallel: int = 32) -> list[dict]:
    """Every probe's result (``ran``: it got in; ``loaded``: it reached the connecting stage), run at
    most ``parallel`` at a time (all at once for any test here: each waits ``window`` after it has
    loaded, so rounds of a few would each cost a window)."""
    results: list = [None] * len(probes)
    gate = threading.Semaphore(parallel)

    def one(i):
        with gate:
            results[i] = _run(probes[i], window)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(probes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
