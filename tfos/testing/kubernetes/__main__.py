"""``python -m tfos.testing.kubernetes up|down|build|kubectl``: see :mod:`tfos.testing.kubernetes`."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tfos.errors import TFOSError

DEFAULT_DIR = "/tmp/tfos-k8s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfos.testing.kubernetes",
                                 description="a real Kubernetes on this machine, for tfos's tests (root)")
    ap.add_argument("action", choices=("up", "down", "build", "kubectl"))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="kubectl: its arguments")
    ap.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help=f"the cluster's state (default {DEFAULT_DIR})")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for each component")
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from tfos.testing.kubernetes import binaries, images
    from tfos.testing.kubernetes.cluster import KubernetesCluster

    try:
        if ns.action == "build":  # the binaries and the images, timed (CI prints it)
            start = time.monotonic()
            binaries.build()
            images.pause_image()
            name, _ = images.build_tfos_image(Path(__file__).resolve().parents[3])
            sys.stdout.write(f"built Kubernetes {binaries.VERSION} and {name} in {time.monotonic() - start:.0f} s\n")
            return 0
        cluster = KubernetesCluster(ns.dir, binaries.bin_dir() if ns.action != "up" else binaries.build(),
                                    timeout=ns.timeout)
        if ns.action == "down":
            cluster.destroy()
        elif ns.action == "kubectl":
            done = cluster.kubectl(*ns.args, check=False, timeout=600)
            sys.stdout.write(done.stdout)
            sys.stderr.write(done.stderr)
            return done.returncode
        else:
            cluster.start()
            sys.stdout.write(f"export KUBECONFIG={cluster.kubeconfig}\n")
    except TFOSError as e:
        logging.getLogger(__name__).error("error: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
