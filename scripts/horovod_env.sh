#!/usr/bin/env bash
# Builds (once per machine) the second environment for Horovod: Horovod 0.28.1 (its last release)
# compiles only against TF <= 2.15, so it gets tensorflow-cpu 2.15.1 + numpy 1.26 + Gloo, no MPI.
# The environment lives in this user's cache, keyed by the versions below (this script's install
# lines), so fresh clones reuse it and only a change of versions rebuilds it; the first build
# compiles Horovod (~7 min on 2 cores). tfos is installed editable from the clone that uses it.
# Prints the environment's path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TFOS_EXTRAS="hvd"  # only names the cache entry
PINS_HVD=("tensorflow-cpu==2.15.1" "numpy<2" "pyspark>=3.5" "pyarrow>=14,<20" "pandas>=2.2,<3" psutil scikit-learn
          pytest pytest-timeout tqdm "protobuf>=4.23" "google-crc32c>=1.5")
HOROVOD="horovod==0.28.1"
source "$(dirname "$0")/_cache.sh"
KEY="$( { "$PY" --version; echo "${PINS_HVD[*]}|$HOROVOD"; } | sha1sum | cut -c1-12)"
VENV="${TFOS_HVD_VENV:-$(tfos_cache_dir)/venv-hvd-$KEY}"
if [ ! -f "$VENV/.tfos-complete" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools cmake
  # pyarrow >= 20 needs NumPy 2, which TF 2.15 cannot use: keep both on the NumPy 1 line.
  "$VENV/bin/python" -m pip install -q "${PINS_HVD[@]}"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 "$VENV/bin/python" -m pip install -q --no-build-isolation "$HOROVOD"
  "$VENV/bin/python" -c "import horovod.tensorflow as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else 'ok')" >&2
  touch "$VENV/.tfos-complete"
fi
if [ "$(cat "$VENV/.tfos-root" 2>/dev/null)" != "$ROOT" ]; then  # point tfos at this clone
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT" >&2
  echo "$ROOT" > "$VENV/.tfos-root"
fi
if [ -z "${TFOS_HVD_VENV:-}" ] && [ "$(readlink "$ROOT/.venv-hvd" 2>/dev/null)" != "$VENV" ]; then
  rm -rf "$ROOT/.venv-hvd"
  ln -s "$VENV" "$ROOT/.venv-hvd"
fi
echo "$VENV"
