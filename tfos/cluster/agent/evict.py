"""``python -m tfos.cluster.agent.evict``: an executor's eviction notice to its node agents, for a
Kubernetes pod's ``preStop`` hook (runs in the executor's container).

When a pod is deleted, evicted or its node drained, the kubelet runs the hook first and sends
SIGTERM to the container's first process (the executor JVM) only after it; when the JVM exits the
container ends with everything in it. So the hook does what a host's shutdown does to an agent:
SIGTERM to every node agent of this user in the container (each sends the driver an eviction
notice; every rank saves at one step, docs/elastic.md), then waits until they have exited, at most
``--wait`` seconds (keep it below the pod's terminationGracePeriodSeconds). Exit 0 in every case:
a hook's failure only delays the pod's end.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

logger = logging.getLogger(__name__)

#: the node agent's module (``python -m tfos.cluster.agent``): this package (not derived from
#: ``__name__``, which is "__main__" when the hook runs this module)
AGENT_MODULE = "tfos.cluster.agent"


def agent_pids(proc: str = "/proc", uid: int | None = None) -> list[int]:
    """This user's node agents (``python -m tfos.cluster.agent``) visible in ``proc``."""
    uid = os.getuid() if uid is None else uid
    out = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            if os.stat(os.path.join(proc, name)).st_uid != uid:
                continue
            with open(os.path.join(proc, name, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if AGENT_MODULE.encode() in argv and b"-m" in argv:
            out.append(int(name))
    return out


def evict(wait: float) -> int:
    """SIGTERM the agents, wait for them (at most ``wait`` s); the number still alive."""
    pids = agent_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    start = time.monotonic()
    alive = list(pids)
    while alive and time.monotonic() - start < wait:
        time.sleep(0.5)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}")]
    logger.warning("tfos preStop: %d node agent(s) told of the eviction; %d still running after %.0fs",
                   len(pids), len(alive), time.monotonic() - start)
    return len(alive)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfos.cluster.agent.evict", description=__doc__.split("\n\n")[0])
    ap.add_argument("--wait", type=float, default=80.0, help="seconds to wait for the agents to finish (default 80)")
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    evict(ns.wait)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
