"""``python -m tfos.testing.hadoop up|down|fetch|yarn|fs``: see :mod:`tfos.testing.hadoop`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tfos.testing.hadoop import HadoopCluster, HadoopClusterError, fetch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfos.testing.hadoop", description="a real Hadoop test cluster (HDFS + YARN)")
    ap.add_argument("action", choices=("up", "down", "fetch", "yarn", "fs"))
    ap.add_argument("args", nargs="*", help="yarn: a YARN client command with its arguments, e.g. "
                    "logs -applicationId ID, application -kill ID, application -list; fs: FsShell's "
                    "arguments, e.g. -ls -R /tmp (what 'hdfs dfs' takes)")
    ap.add_argument("--dir", type=Path, help="cluster directory (up, down)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness")
    ap.add_argument("--kerberos", action="store_true", help="up: a MiniKdc first, and HDFS that asks for Kerberos "
                    "(prints the KRB5_* settings of its test user)")
    ap.add_argument("--no-yarn", action="store_true", help="up: HDFS alone, no ResourceManager or NodeManagers")
    ns, extra = ap.parse_known_args(argv)  # yarn's own options (-list, -kill) are not ours
    if extra and ns.action not in ("yarn", "fs"):
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    ns.args += extra
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if ns.action != "fetch" and ns.dir is None:
        ap.error("--dir is required")
    try:
        if ns.action == "fetch":
            _say(str(fetch()))
        elif ns.action == "yarn":  # YARN's own clients, the 'yarn' command of a Hadoop install
            from tfos.testing.hadoop.yarn import CLIS, cli_args

            if not ns.args or ns.args[0] not in CLIS:
                ap.error(f"yarn needs one of {sorted(CLIS)} and its arguments")
            return _client(ns.dir, cli_args(ns.args))
        elif ns.action == "fs":  # 'hdfs dfs ...' through the cluster's conf
            from tfos.testing.hadoop.artifacts import FS_SHELL

            return _client(ns.dir, [FS_SHELL, *ns.args])
        elif ns.action == "down":  # needs only the pids file
            HadoopCluster(ns.dir).stop()
        else:
            cluster = HadoopCluster(ns.dir, timeout=ns.timeout, kerberos=ns.kerberos, yarn=not ns.no_yarn).start()
            _say(f"fs.defaultFS={cluster.default_fs} webhdfs=http://{cluster.webhdfs_address}" +
                 (f" rm={cluster.rm_address} rm_web=http://{cluster.rm_webapp_address}" if cluster.yarn else ""))
            if cluster.kerberos:
                from tfos.testing.hadoop import kerberos

                for key, value in kerberos.client_env(cluster.kdc_dir).items():
                    _say(f"export {key}={value}")
            _say(f"export HADOOP_CONF_DIR={cluster.conf_dir}")
    except HadoopClusterError as e:
        logging.getLogger(__name__).error("error: %s", e)
        return 1
    return 0


def _say(line: str) -> None:
    """The command's result on stdout (a shell evaluates the export line); progress goes to logging."""
    sys.stdout.write(line + "\n")


def _client(cluster_dir, argv) -> int:
    """Run a Hadoop client main class against the cluster in ``cluster_dir``; its output passes through."""
    out = HadoopCluster.attach(cluster_dir).hadoop_cli(argv, check=False, timeout=300)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
