#!/usr/bin/env bash
# Builds (once) the second environment for Horovod: Horovod 0.28.1 (its last release) compiles
# only against TF <= 2.15, so it gets tensorflow-cpu 2.15.1 + numpy 1.26 + Gloo, no MPI.
# The first build compiles Horovod (~7 min on 2 cores); pip caches the wheel afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TFOS_HVD_VENV:-$ROOT/.venv-hvd}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.tfos-hvd-$(sha1sum "$ROOT/setup.py" "$0" | sha1sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools cmake
  # pyarrow >= 20 needs NumPy 2, which TF 2.15 cannot use: keep both on the NumPy 1 line.
  "$VENV/bin/python" -m pip install -q "tensorflow-cpu==2.15.1" "numpy<2" "pyspark>=3.5" "pyarrow>=14,<20" \
      "pandas>=2.2,<3" psutil scikit-learn pytest pytest-timeout tqdm "protobuf>=4.23" "google-crc32c>=1.5"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 "$VENV/bin/python" -m pip install -q --no-build-isolation "horovod==0.28.1"
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
  "$VENV/bin/python" -c "import horovod.tensorflow as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else 'ok')"
  touch "$STAMP"
fi
echo "$VENV"
