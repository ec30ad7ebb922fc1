#!/usr/bin/env bash
# The test suite: unit tests plus integration tests on a real Spark local-cluster[2,1,1024]
# (TF 2.21); then the Spark Connect suite (its own pytest session: a Connect session on an
# embedded local-cluster[2,1,1024] server); then the reduction-server suite (its own pytest
# session: a local-cluster[2,2,1024], 4 slots for 2 workers and 2 reducers); then the multi-host
# suite (its own pytest session: a standalone cluster of three hosts in network namespaces; needs
# root, skipped otherwise); then the Horovod tests in their
# own TF 2.15 environment (scripts/horovod_env.sh); then the Hadoop suite (its own pytest session:
# real HDFS and YARN daemons from Hadoop's Maven Central jars, python -m tfos.testing.hadoop); then,
# as root, the Kubernetes suite (a real Kubernetes started by python -m tfos.testing.kubernetes).
# Extra arguments go to the main pytest run and skip the other parts (e.g. -m "not slow").
set -euo pipefail
TFOS_EXTRAS="tf,spark,connect,test,gloo"
TFOS_PINS="torch==2.13.0"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
# Run one pytest session; pytest's exit code 5 (no test collected) fails on purpose.
run_pytest() {
  local what="$1" start=$SECONDS
  shift
  set +e
  "$@"
  local code=$?
  set -e
  echo "== $what suite: $((SECONDS - start)) s (exit $code)"
  if [ "$code" -eq 5 ]; then
    echo "no $what test ran (pytest collected none): failing on purpose" >&2
    exit 1
  fi
  [ "$code" -eq 0 ] || exit "$code"
}
start=$SECONDS  # tfos's Gloo op for tf.function (C++; kept in the cache by source and version)
python -m tfos.tf.gloo_kernel build
echo "== Gloo op ready: $((SECONDS - start)) s"
start=$SECONDS  # tfos's node tunnel (Rust) and network shim (C), which encrypted clusters run (cached by source)
python -m tfos.tunnel build
echo "== node tunnel ready: $((SECONDS - start)) s"
run_pytest "main" python -m pytest --durations=20 "$@"  # the slowest tests: what to trim to stay under 40 min
if [ "$#" -eq 0 ]; then
  echo "== Spark Connect tests (SparkSession.builder.remote(\"local-cluster[2,1,1024]\"))"
  run_pytest "Spark Connect" python -m pytest --connect
  echo "== reduction-server tests (local-cluster[2,2,1024]: 2 workers and 2 reducers)"
  run_pytest "reduction server" python -m pytest --reduction
  echo "== spark-tensorflow-distributor's own tests on tfos.compat (tests/upstream_std)"
  run_pytest "upstream spark-tensorflow-distributor" python -m pytest --upstream-std --durations=5
fi
if [ "$#" -eq 0 ] && [ "${TFOS_SKIP_MULTIHOST:-0}" != "1" ]; then
  echo "== multi-host tests (Spark standalone, one network namespace per host)"
  run_pytest "multi-host" python -m pytest --multihost --durations=10
fi
if [ "$#" -eq 0 ] && [ "${TFOS_SKIP_HADOOP:-0}" != "1" ]; then
  echo "== Hadoop tests (HDFS + YARN daemons, Hadoop 3.5.0 from Maven Central)"
  start=$SECONDS  # TensorFlow's hdfs:// plugin (cargo; kept in the cache by source and TF version)
  python -m tfos.data.tfhdfs build
  echo "== hdfs:// plugin for TensorFlow ready: $((SECONDS - start)) s"
  run_pytest "Hadoop" python -m pytest --hadoop --durations=10
fi
if [ "$#" -eq 0 ] && [ "${TFOS_SKIP_K8S:-0}" != "1" ] && [ "$(id -u)" = 0 ]; then
  echo "== Kubernetes tests (a real Kubernetes v1.34 built here: spark-submit --master k8s://, pods under restricted)"
  start=$SECONDS  # Debian's containerd/runc/CNI, Go builds of Kubernetes and etcd, the images (all cached)
  python -m tfos.testing.kubernetes build
  echo "== Kubernetes binaries and images ready: $((SECONDS - start)) s"
  run_pytest "Kubernetes" python -m pytest --kubernetes --durations=10
fi
if [ "$#" -eq 0 ] && [ "${TFOS_SKIP_HOROVOD:-0}" != "1" ]; then
  echo "== Horovod tests (TF 2.15 + Horovod 0.28.1 environment)"
  HVD_VENV="$(bash scripts/horovod_env.sh | tail -1)"
  run_pytest "Horovod" "$HVD_VENV/bin/python" -m pytest -m horovod tests/e2e/test_horovod.py
fi
echo "== whole run: $SECONDS s"
