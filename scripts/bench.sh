#!/usr/bin/env bash
# Benchmarks: bash scripts/bench.sh feed [args]  (see bench/*.py). Installs what they need.
set -euo pipefail
TFOS_EXTRAS="tf,spark,test,gloo"
TFOS_PINS="torch==2.13.0"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
name="${1:?usage: scripts/bench.sh feed|feed_consumer|allreduce|restart [args]}"; shift
if [ "$name" = "feed" ] && ! python -c "import tensorflowonspark" 2>/dev/null; then
  python -m pip install -q --no-deps "tensorflowonspark==2.2.5"
fi
exec python "bench/$name.py" "$@"
