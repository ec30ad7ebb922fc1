"""GPU choice for one node (node agent): Spark's resource scheduling first, else the least-used
free GPUs reported by nvidia-smi, claimed in the host-wide registry. The decisions are pure
functions tested from tables."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Iterable, Sequence

from tfos.errors import ConfigError
from tfos.host.claims import claims


def parse_nvidia_smi(output: str) -> list[tuple[str, int, int]]:
    """Parse ``nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits``.

    Returns ``[(index, memory_used_mib, utilization_pct)]``; unparsable lines are skipped.
    """
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            gpus.append((parts[0], int(float(parts[1])), int(float(parts[2]))))
        except ValueError:
            continue
    return gpus


def choose_gpus(num_gpus: int, spark_addresses: Sequence[str] | None,
                smi: Sequence[tuple[str, int, int]], claimed: Iterable[str],
                busy_memory_mib: int = 512, host: str = "this host") -> list[str]:
    """Pick GPU ids for one node.

    Spark's resource scheduling wins when it assigned GPUs to the task. Otherwise take the
    ``num_gpus`` least-used GPUs reported by nvidia-smi that no other tfos node on this host
    has claimed and that are not visibly busy. Raises ConfigError when too few are free.
    """
    if spark_addresses:
        return list(spark_addresses)
    if num_gpus <= 0:
        return []
    if not smi:
        raise ConfigError(f"node needs {num_gpus} GPU(s) on host {host}, but nvidia-smi is not there or shows no GPU "
                          "(and Spark assigned the task none); set num_gpus=0, or run on GPU executors with Spark GPU "
                          "scheduling (spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount)")
    claimed = set(claimed)
    free = [g for g in smi if g[0] not in claimed and g[1] < busy_memory_mib]
    free.sort(key=lambda g: (g[1], g[2], int(g[0]) if g[0].isdigit() else 0))
    if len(free) < num_gpus:
        def state(g):
            if g[0] in claimed:
                return f"GPU {g[0]} (claimed by another tfos node)"
            if g[1] >= busy_memory_mib:
                return f"GPU {g[0]} ({g[1]} MiB in use: held by another job)"
            return f"GPU {g[0]} (free)"
        raise ConfigError(f"node needs {num_gpus} GPU(s) on host {host} and {len(free)} of {len(smi)} are free: "
                          f"{', '.join(state(g) for g in smi)}; lower num_gpus, wait for the other job, or let Spark "
                          "schedule GPUs (spark.executor.resource.gpu.amount)")
    return sorted((g[0] for g in free[:num_gpus]), key=lambda s: (len(s), s))


def visible_devices(addresses: Sequence[str], limit: int | None, inherited: str | None) -> list[str]:
    """Pure: the CUDA device ids a node uses from the GPU ``addresses`` Spark gave its task.

    ``limit`` (None: all) keeps the first ``limit`` of them (0 hides every GPU). When the executor
    already narrows its devices (``inherited``: its own ``CUDA_VISIBLE_DEVICES``, e.g. from
    ``spark.executorEnv``), Spark's addresses are indices into that list, and the result names the
    devices it lists. ConfigError for an address that is not an index, or beyond that list.
    """
    chosen = list(addresses) if limit is None or limit < 0 else list(addresses)[:limit]
    if not chosen or inherited is None or not inherited.strip():
        return chosen
    devices = [d.strip() for d in inherited.split(",") if d.strip()]
    out = []
    for a in chosen:
        if not a.isdigit() or int(a) >= len(devices):
            raise ConfigError(f"Spark assigned GPU address {a!r}, but the executor's CUDA_VISIBLE_DEVICES={inherited!r} "
                              f"lists {len(devices)} device(s): Spark's addresses must be 0..{len(devices) - 1} "
                              "(fix the GPU discovery script, or unset CUDA_VISIBLE_DEVICES on the executors)")
        out.append(devices[int(a)])
    return out


def gpu_environment(gpus: Sequence[str]) -> dict[str, str]:
    """Environment pinning the TF process to ``gpus`` (empty list: hide all GPUs)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _smi_gpus() -> list[tuple[str, int, int]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.used,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else []


def pick_gpus(num_gpus: int, spark_gpus: Sequence[str], limit: int | None = None) -> list[str]:
    """Spark-assigned GPUs (the first ``limit``, through this executor's own CUDA_VISIBLE_DEVICES:
    :func:`visible_devices`), else free GPUs from nvidia-smi claimed under the host-wide lock
    (the claims last as long as this process)."""
    if limit == 0:
        return []
    if spark_gpus:
        return visible_devices(spark_gpus, limit, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not num_gpus:
        return []
    me = os.getpid()
    with claims() as reg:
        others = [g for g, pid in reg["gpus"].items() if pid != me]  # a reused Spark worker may pick again
        gpus = choose_gpus(num_gpus, None, _smi_gpus(), others, host=socket.gethostname())
        for g in [g for g, pid in reg["gpus"].items() if pid == me and g not in gpus]:
            del reg["gpus"][g]
        for g in gpus:
            reg["gpus"][g] = me
    return gpus


def release_gpus() -> None:
    """Drop this process's GPU claims (a Spark Python worker that ran a single-node TF task)."""
    me = os.getpid()
    with claims() as reg:
        for g in [g for g, pid in reg["gpus"].items() if pid == me]:
            del reg["gpus"][g]


def gpus_present() -> bool:
    """Whether nvidia-smi reports any GPU on this host."""
    return bool(_smi_gpus())
