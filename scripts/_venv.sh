# Sourced by the scripts: create (once) and activate the project's virtualenv with the extras
# given in $TFOS_EXTRAS, reinstalling only when setup.py changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TFOS_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# $TFOS_PINS: exact versions installed first (torch==2.13.0 is the CPU wheel on this machine's disk;
# the "gloo" extra's torch>=2.3 is then already satisfied and pip fetches no CUDA build).
PINS="${TFOS_PINS:-}"
STAMP="$VENV/.tfos-installed-$(cat "$ROOT/setup.py" | sha1sum | cut -c1-12)-${TFOS_EXTRAS//,/-}-${PINS//[ =]/-}"
if [ ! -f "$STAMP" ]; then
  if [ -n "$PINS" ]; then
    "$VENV/bin/python" -m pip install -q $PINS
  fi
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$TFOS_EXTRAS]"
  touch "$STAMP"
fi
if ! command -v java >/dev/null 2>&1; then
  echo "Java 17+ is needed by Spark: apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
export PATH="$VENV/bin:$PATH"
