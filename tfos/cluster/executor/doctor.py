"""``tfos doctor``'s probe: what one executor (or the driver) has that a tfos job needs (runs in a
Spark task's Python worker, and on the driver for comparison).

Everything is read without importing TensorFlow: versions from the installed distributions,
builds from their cache paths, GPUs from Spark's task resources and nvidia-smi. The driver's
address is tried with a TCP connection that must be answered with the banner the doctor's
listener sends, within a deadline. That connection is the one socket of the doctor outside
tfos.wire: it carries no job data and no secret, only the route test a node's first connection
makes (a tfos channel would add a handshake whose failure would hide which of the two failed).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys

#: What the doctor's listener sends to every connection (the probe checks it: the right service answered).
BANNER = b"tfos-doctor\n"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def versions() -> dict:
    from tfos.host.versions import local_versions

    found = local_versions()
    return {"python": platform.python_version(), "python_path": sys.executable, "tfos": found["tfos"],
            "tensorflow": found["tensorflow"], "pyarrow": _version("pyarrow"), "torch": _version("torch")}


def builds() -> dict:
    """Which compiled parts exist here (built into this user's cache) and whether they could be built."""
    from tfos.data import tfhdfs
    from tfos.tunnel import build as tunnel

    binary, shim = tunnel.built_paths()
    out = {"tunnel": os.path.isfile(binary) and os.path.isfile(shim), "cargo": bool(tunnel._cargo()),
           "hdfs_plugin": False, "gloo_op": False}
    try:
        out["hdfs_plugin"] = tfhdfs.built_path().is_file()
    except Exception:  # no TensorFlow to build it against, or an unreadable cache: not built
        out["hdfs_plugin"] = False
    try:  # the op's module lives with the TF helpers: ask it in a child, not by import here
        path = subprocess.run([sys.executable, "-m", "tfos.tf.gloo_kernel", "path"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
        out["gloo_op"] = bool(path) and os.path.isfile(path)
    except (OSError, subprocess.TimeoutExpired):
        out["gloo_op"] = False
    return out


def gpus(task_addresses) -> dict:
    from tfos.host.gpus import _smi_gpus

    return {"spark": list(task_addresses), "nvidia_smi": len(_smi_gpus()),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def reach(host: str, port: int, timeout: float) -> str:
    """"" when the doctor's listener at ``host:port`` answered with its banner, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            got = b""
            while len(got) < len(BANNER):
                chunk = s.recv(len(BANNER) - len(got))
                if not chunk:
                    break
                got += chunk
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return "" if got == BANNER else f"something else answered at {host}:{port}"


def probe(host: str, port: int, timeout: float, task_addresses=()) -> dict:
    """This process's report (a JSON-able dict)."""
    return {"host": socket.gethostname(), "versions": versions(), "builds": builds(), "gpus": gpus(task_addresses),
            "reach": reach(host, port, timeout) if port else "", "java": bool(shutil.which("java")),
            "hadoop_conf_dir": os.environ.get("HADOOP_CONF_DIR", "")}


def task(host: str, port: int, timeout: float):
    """The mapPartitions function of the doctor's Spark job: one report per task, as JSON text. It
    refers to nothing of tfos until it runs (it travels by value), so an executor without tfos
    reports that instead of failing the job."""

    def run(_rows):
        import json
        import platform
        import socket as _socket
        import sys as _sys

        from pyspark import TaskContext

        ctx = TaskContext.get()
        res = ctx.resources() if ctx is not None else {}
        addresses = list(res["gpu"].addresses) if "gpu" in res else []
        try:
            from tfos.cluster.executor.doctor import probe as _probe
        except ImportError as e:
            yield json.dumps({"host": _socket.gethostname(), "import_error": f"{type(e).__name__}: {e}",
                              "versions": {"python": platform.python_version(), "python_path": _sys.executable},
                              "gpus": {"spark": addresses}})
            return
        yield json.dumps(_probe(host, port, timeout, addresses))

    return run
