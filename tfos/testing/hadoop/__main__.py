"""``python -m tfos.testing.hadoop up|down|fetch``: see :mod:`tfos.testing.hadoop`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tfos.testing.hadoop import HadoopCluster, HadoopClusterError, fetch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfos.testing.hadoop", description="a real Hadoop test cluster (HDFS + YARN)")
    ap.add_argument("action", choices=("up", "down", "fetch"))
    ap.add_argument("--dir", type=Path, help="cluster directory (up, down)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness")
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if ns.action != "fetch" and ns.dir is None:
        ap.error("--dir is required")
    try:
        if ns.action == "fetch":
            print(fetch())
        elif ns.action == "down":  # needs only the pids file
            HadoopCluster(ns.dir).stop()
        else:
            cluster = HadoopCluster(ns.dir, timeout=ns.timeout).start()
            print(f"fs.defaultFS={cluster.default_fs} webhdfs=http://{cluster.webhdfs_address} "
                  f"rm={cluster.rm_address} rm_web=http://{cluster.rm_webapp_address}")
            print(f"export HADOOP_CONF_DIR={cluster.conf_dir}")
    except HadoopClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
