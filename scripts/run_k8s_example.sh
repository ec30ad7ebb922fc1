#!/usr/bin/env bash
# tfos on Kubernetes (root: the test cluster's kubelet and containerd need it): start a real
# Kubernetes on this machine (python -m tfos.testing.kubernetes up: Kubernetes and etcd built with
# Go, containerd and runc from Debian, the image built here; minutes the first time, cached after),
# submit examples/digits/digits_tf.py with spark-submit --master k8s:// in cluster mode (driver and
# executors are pods under PodSecurity "restricted"; checkpoints and the export go to a shared
# volume), show the pods and their logs, and stop the cluster. docs/kubernetes.md explains each part.
set -euo pipefail
TFOS_EXTRAS="tf,spark,examples"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
k8s() { python -m tfos.testing.kubernetes "$@"; }
k8s up
trap 'k8s down' EXIT
OUT="$(k8s submit --job-dir digits)"
APP=local:///opt/tfos/examples/digits/digits_tf.py  # the repository's examples, inside the image
k8s submit --mode cluster "$APP" --epochs 5 --data-dir "$OUT/data" --output-dir "$OUT/out" \
  --checkpoint-dir "$OUT/checkpoints" --export-dir "$OUT/export" >/dev/null
echo "== the pods (driver and executors; Spark removes finished executor pods)"
k8s kubectl -- -n tfos get pods -o wide
DRIVER="$(k8s kubectl -- -n tfos get pods -l spark-role=driver -o name | tail -1)"
echo "== kubectl logs $DRIVER: the driver pod, with each node's output"
k8s kubectl -- -n tfos logs "$DRIVER" | grep -E "^\[(chief|worker):|^digits:|tfos" | grep -v " INFO " | tail -25
echo "== on the shared volume ($OUT)"
ls "$OUT/out" "$OUT/checkpoints" "$OUT/export"
python -c "import json, sys; r = json.load(open(sys.argv[1])); print(f\"test accuracy {r['accuracy']:.4f}\")" "$OUT/out/result.json"
