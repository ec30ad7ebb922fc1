"""``python -m tfos.testing.kubernetes up|down|build|kubectl|submit``: see :mod:`tfos.testing.kubernetes`.

``submit [--mode client|cluster] APP ARGS...`` runs spark-submit against the cluster (its settings:
:mod:`tfos.testing.kubernetes.spark`), APP a path here (client mode) or ``local:///`` in the image."""

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
    ap.add_argument("action", choices=("up", "down", "build", "kubectl", "submit"))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="kubectl: its arguments; submit: the app and its arguments")
    ap.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help=f"the cluster's state (default {DEFAULT_DIR})")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for each component")
    ns = ap.parse_args(argv)
    if ns.action in ("up", "down", "build") and ns.args:  # options after the action: `up --dir D`
        opts = argparse.ArgumentParser(prog=f"python -m tfos.testing.kubernetes {ns.action}")
        opts.add_argument("--dir", type=Path, default=ns.dir)
        opts.add_argument("--timeout", type=float, default=ns.timeout)
        ns = opts.parse_args(ns.args, namespace=ns)
        ns.args = []
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from tfos.testing.kubernetes import binaries, images
    from tfos.testing.kubernetes.cluster import KubernetesCluster

    try:
        if ns.action == "build":  # the binaries and the images, timed (CI prints it)
            from tfos.testing.kubernetes.cluster import ensure_packages

            start = time.monotonic()
            ensure_packages()
            binaries.build()
            images.pause_image()
            name = images.build_tfos_image(Path(__file__).resolve().parents[3]).name
            sys.stdout.write(f"built Kubernetes {binaries.VERSION} and {name} in {time.monotonic() - start:.0f} s\n")
            return 0
        if ns.action == "up":
            from tfos.testing.kubernetes.cluster import ensure_packages

            ensure_packages()
        cluster = KubernetesCluster(ns.dir, binaries.bin_dir() if ns.action != "up" else binaries.build(),
                                    timeout=ns.timeout)
        if ns.action == "down":
            cluster.destroy()
        elif ns.action == "submit":
            from tfos.testing.kubernetes import spark

            sub = argparse.ArgumentParser(prog="python -m tfos.testing.kubernetes submit")
            sub.add_argument("--mode", choices=("client", "cluster"), default="cluster", help="Spark's deploy mode")
            sub.add_argument("--job-dir", help="a directory of the shared volume made for the job (owned by the "
                             "pods' user), printed first")
            sub.add_argument("args", nargs=argparse.REMAINDER, help="the app and its arguments")
            ns = sub.parse_args(ns.args, namespace=ns)

            if ns.job_dir:
                spark.shared_volume(cluster)
                sys.stdout.write(f"{spark.job_dir(cluster, ns.job_dir)}\n")
                sys.stdout.flush()
            if not ns.args:
                return 0
            done = spark.spark_submit(cluster, ns.mode, ns.args[0], ns.args[1:], timeout=1800)
            sys.stdout.write("".join(line + "\n" for line in done.stdout.splitlines() if " INFO " not in line
                                     and "WARN " not in line)[-20000:])
            return done.returncode
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
