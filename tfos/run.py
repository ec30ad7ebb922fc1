"""``python -m tfos.run``: run an unchanged TF script on a Spark cluster (driver).

::

    python -m tfos.run --master 'local-cluster[2,1,1024]' --num-executors 2 train.py --epochs 3
    spark-submit --master yarn --num-executors 4 "$(python -m tfos.run --path)" --num-executors 4 train.py

Everything after the script's path is the script's own argv. Exit code: 0 when every
chief/worker copy of the script exited with 0; 1 with the nodes' errors (exit codes and last
lines) on stderr otherwise; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys

logger = logging.getLogger(__name__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tfos.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", action="store_true", help="print this file's path (for spark-submit) and exit")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else Spark's default)")
    p.add_argument("--num-executors", type=int, default=1, help="TF nodes, one per executor")
    p.add_argument("--num-ps", type=int, default=0, help="parameter server nodes among them")
    p.add_argument("--master-node", default="none",
                   help="'none' (workers only, what TF's multi-worker tutorials expect; the default) or 'chief'")
    p.add_argument("--num-gpus", type=int, default=0, help="GPUs per node when Spark assigns none")
    p.add_argument("--reservation-timeout", type=float, default=600)
    p.add_argument("--timeout", type=float, default=259200, help="seconds the script may run")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment of the scripts")
    p.add_argument("--node-output", default="chief", choices=("chief", "all", "none"),
                   help="whose printed lines show here as they come (default: rank 0's)")
    p.add_argument("script", nargs="?", help="the TF script (read on this machine)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = p.parse_args(argv)
    if not args.path and not args.script:
        p.error("the script to run is required")
    bad = [e for e in args.env if "=" not in e]
    if bad:
        p.error(f"--env takes NAME=VALUE, got {bad}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.path:
        sys.stdout.write(__file__ + "\n")
        return 0
    from pyspark.sql import SparkSession

    from tfos.api import TFCluster
    from tfos.errors import TFOSError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    builder = SparkSession.builder.appName(f"tfos run {args.script}")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        TFCluster.run_script(spark.sparkContext, args.script, args.script_args, args.num_executors, args.num_ps,
                             master_node=None if args.master_node == "none" else args.master_node,
                             num_gpus=args.num_gpus, reservation_timeout=args.reservation_timeout,
                             timeout=args.timeout, env=dict(e.split("=", 1) for e in args.env),
                             node_output=args.node_output)
    except TFOSError as e:
        sys.stderr.write(f"tfos run: {type(e).__name__}: {e}\n")
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
