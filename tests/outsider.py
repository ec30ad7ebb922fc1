"""What a process that is not part of a tfos job, and holds no secret, can do to it: TensorFlow's
remote eager client (``experimental_connect_to_host`` then ``tf.io.read_file`` on the remote
device, as an attacker would), a torch TCPStore client, raw TCP. Each probe runs in a fresh
process, optionally inside a test host's network namespace and as another user (uid 65534 with
only the capability to read files, so that it can load the test environment's Python: no network
privilege)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

EAGER = r"""
import json, sys
address, job = sys.argv[1], sys.argv[2]
try:
    import tensorflow as tf
    tf.config.experimental_connect_to_host(address, job_name=job)
    with tf.device(f"/job:{job}/replica:0/task:0/device:CPU:0"):
        out = tf.io.read_file("/proc/self/cmdline").numpy()
    print(json.dumps({"ran": True, "answer": out.decode(errors="replace")[:200]}))
except Exception as e:
    print(json.dumps({"ran": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}))
"""

STORE = r"""
import datetime, json, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    import torch.distributed as dist
    store = dist.TCPStore(host, port, 2, is_master=False, timeout=datetime.timedelta(seconds=10))
    keys = store.num_keys()
    print(json.dumps({"ran": True, "answer": f"{keys} keys"}))
except Exception as e:
    print(json.dumps({"ran": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}))
"""

AS_OTHER_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
                 "--ambient-caps=+dac_read_search"]


def _run(code: str, args, namespace: str | None, other_user: bool, timeout: float) -> dict:
    cmd = [sys.executable, "-c", code, *map(str, args)]
    if other_user:
        cmd = AS_OTHER_USER + cmd
    if namespace:
        cmd = ["ip", "netns", "exec", namespace] + cmd
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MPLCONFIGDIR="/tmp")
    env.pop("TFOS_NODE_CONFIG", None)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env).stdout
    except subprocess.TimeoutExpired:
        return {"ran": False, "error": f"no answer within {timeout:.0f}s", "probe": args}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ran": False, "error": f"probe printed {out[-300:]!r}"}
    result["probe"] = list(args)
    return result


def remote_eager(address: str, job: str = "worker", namespace: str | None = None, other_user: bool = False,
                 timeout: float = 90.0) -> dict:
    """``{"ran": bool, ...}``: whether TF's remote eager client ran an operation at ``address``."""
    return _run(EAGER, [address, job], namespace, other_user, timeout)


def store_client(host: str, port: int, namespace: str | None = None, other_user: bool = False,
                 timeout: float = 60.0) -> dict:
    """Whether a torch TCPStore client got into a store at ``host:port`` (Gloo's old rendezvous)."""
    return _run(STORE, [host, port], namespace, other_user, timeout)
