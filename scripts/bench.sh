#!/usr/bin/env bash
# Benchmarks: bash scripts/bench.sh feed [args]  (see bench/*.py). Installs what they need.
set -euo pipefail
TFOS_EXTRAS="tf,spark,test,gloo"
TFOS_PINS="torch==2.13.0"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
name="${1:?usage: scripts/bench.sh feed|feed_consumer|allreduce|startup|restart|hdfs_io|security|scale|reduction_server [args]}"; shift
if [ "$name" = "feed" ] || [ "$name" = "startup" ]; then  # the reference: TensorFlowOnSpark 2.2.5
  if ! python -c "import tensorflowonspark" 2>/dev/null; then
    python -m pip install -q --no-deps "tensorflowonspark==2.2.5"
  fi
  if ! python -c "import pkg_resources" 2>/dev/null; then  # it imports pkg_resources, gone in setuptools 81
    python -m pip install -q "setuptools<81"
  fi
fi
python -m tfos.tunnel build >/dev/null  # clusters are encrypted by default: the node tunnel and shim (cached)
if [ "$name" = "allreduce" ] || [ "$name" = "reduction_server" ] || [ "$name" = "security" ]; then  # tfos's Gloo op for tf.function (C++; kept in the cache by source and version)
  python -m tfos.tf.gloo_kernel build >/dev/null
fi
exec python "bench/$name.py" "$@"
