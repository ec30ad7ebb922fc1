# Sourced by the scripts: create (once per machine) and activate the project's virtualenv with the
# extras given in $TFOS_EXTRAS. The environment lives in this user's cache, keyed by the Python
# version, the extras and $TFOS_PINS, so a fresh clone on the same machine reuses it; a change of
# pyproject.toml installs what is missing into it; .venv in the clone links to it. tfos itself is
# installed editable from the clone that uses the environment (re-pointed when another clone
# takes it). $TFOS_VENV names an environment of your own instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
PINS="${TFOS_PINS:-}"
source "$(dirname "${BASH_SOURCE[0]}")/_cache.sh"
if [ -n "${TFOS_VENV:-}" ]; then
  VENV="$TFOS_VENV"
else
  KEY="$( { "$PY" --version; echo "$TFOS_EXTRAS|$PINS"; } | sha1sum | cut -c1-12)"
  VENV="$(tfos_cache_dir)/venv-${TFOS_EXTRAS//,/-}-$KEY"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# pyproject.toml decides what is installed: a change installs what is missing into the same environment
STAMP="$VENV/.tfos-installed-$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha1sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  # $TFOS_PINS: exact versions installed first (e.g. torch==2.13.0), so the extras' ranges are met by them
  if [ -n "$PINS" ]; then
    "$VENV/bin/python" -m pip install -q $PINS
  fi
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$TFOS_EXTRAS]"
  echo "$ROOT" > "$VENV/.tfos-root"
  rm -f "$VENV"/.tfos-installed-*
  touch "$STAMP"
fi
if [ "$(cat "$VENV/.tfos-root" 2>/dev/null)" != "$ROOT" ]; then  # another clone installed it: point tfos here
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
  echo "$ROOT" > "$VENV/.tfos-root"
fi
if [ -z "${TFOS_VENV:-}" ] && [ "$(readlink "$ROOT/.venv" 2>/dev/null)" != "$VENV" ]; then
  rm -rf "$ROOT/.venv"
  ln -s "$VENV" "$ROOT/.venv"
fi
if ! command -v java >/dev/null 2>&1; then
  echo "Java 17+ is needed by Spark: apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
export PATH="$VENV/bin:$PATH"
