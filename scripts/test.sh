#!/usr/bin/env bash
# The test suite: unit tests plus integration tests on a real Spark local-cluster.
# Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
TFOS_EXTRAS="tf,spark,test"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
set +e
python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$code"
