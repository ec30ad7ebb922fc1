#!/usr/bin/env bash
# The main job: digits trained on 2 TF worker processes in 2 Spark executors (embedded
# local-cluster[2,1,1024]), MultiWorkerMirroredStrategy, InputMode.TENSORFLOW with per-rank
# file shards. Prints the test accuracy. Extra arguments go to examples/digits/digits_tf.py.
set -euo pipefail
TFOS_EXTRAS="tf,spark,examples"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
python -m tfos.tunnel build >/dev/null  # the node tunnel and shim of encrypted clusters (the default; cached)
exec python examples/digits/digits_tf.py "$@"
