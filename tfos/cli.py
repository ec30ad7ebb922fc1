"""The ``tfos`` command (driver): one entry point for what tfos's modules run.

::

    tfos run [--master URL] [--num-executors N] train.py [script args]   # python -m tfos.run
    tfos build [all|tunnel|gloo|hdfs]     # compile tfos's parts into this user's cache
    tfos hadoop up|down|fs|yarn ...       # a real HDFS + YARN test cluster (python -m tfos.testing.hadoop)
    tfos doctor [--master URL] [--conf K=V ...]   # what would fail a job here, with the fix

Exit codes: 0 when it worked (doctor: nothing would fail a job), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

logger = logging.getLogger(__name__)

#: ``tfos build`` targets -> the module whose ``build`` command makes them
BUILDS = {"tunnel": "tfos.tunnel", "gloo": "tfos.tf.gloo_kernel", "hdfs": "tfos.data.tfhdfs"}


def build(targets) -> int:
    """Build each target in a child (``python -m <module> build``); 1 if any failed."""
    code = 0
    for name in targets:
        done = subprocess.run([sys.executable, "-m", BUILDS[name], "build"])
        if done.returncode != 0:
            sys.stderr.write(f"tfos build {name}: failed (exit {done.returncode})\n")
            code = 1
    return code


def doctor(argv) -> int:
    p = argparse.ArgumentParser(prog="tfos doctor", description="start a small Spark job and show what would make a "
                                "tfos job fail here, with the fix for each")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else Spark's default)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    p.add_argument("--tasks", type=int, default=None, help="tasks to run (default: one per executor)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds an executor waits for the driver")
    p.add_argument("--job-timeout", type=float, default=300.0,
                   help="seconds the doctor's Spark job may take before it is cancelled (a finding)")
    args = p.parse_args(argv)
    bad = [c for c in args.conf if "=" not in c]
    if bad:
        p.error(f"--conf takes KEY=VALUE, got {bad}")
    from pyspark.sql import SparkSession

    from tfos.cluster.driver import doctor as d

    builder = SparkSession.builder.appName("tfos doctor")
    if args.master:
        builder = builder.master(args.master)
    for c in args.conf:
        key, value = c.split("=", 1)
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # no Java, a bad master: what Spark says is the finding
        findings = [d.Finding("spark", d.FAIL, f"no Spark session: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                              "check Java (JAVA_HOME, java on PATH) and the master URL")]
    else:
        spark.sparkContext.setLogLevel("ERROR")
        try:
            findings = d.run(spark, args.timeout, args.tasks, args.job_timeout)
        finally:
            spark.stop()
    sys.stdout.write(d.table(findings) + "\n")
    failed = [f.check for f in findings if f.status == d.FAIL]
    sys.stdout.write(f"tfos doctor: {len(failed)} problem(s) would fail a job: {', '.join(failed)}\n" if failed else
                     "tfos doctor: nothing found that would fail a job\n")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("run", "build", "hadoop", "doctor")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        sys.stdout.write(__doc__.split("::", 1)[1].rsplit("Exit codes", 1)[0].strip("\n") + "\n")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from tfos.run import main as run_main

        return run_main(rest)
    if command == "hadoop":
        from tfos.testing.hadoop.__main__ import main as hadoop_main

        return hadoop_main(rest)
    if command == "build":
        targets = rest or ["all"]
        unknown = [t for t in targets if t != "all" and t not in BUILDS]
        if unknown:
            sys.stderr.write(f"tfos build: unknown {unknown}; choose from all, {', '.join(BUILDS)}\n")
            return 2
        return build(list(BUILDS) if "all" in targets else targets)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return doctor(rest)


if __name__ == "__main__":
    raise SystemExit(main())
