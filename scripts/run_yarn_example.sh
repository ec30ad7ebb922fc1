#!/usr/bin/env bash
# The Hadoop walk-through: start the real Hadoop test cluster (HDFS + YARN daemons from Hadoop's
# Maven Central jars; Maven fetches them the first time), submit examples/digits/digits_tf.py to
# YARN in client mode (TFRecords, checkpoints, TensorBoard logs and the export on HDFS), show each
# node's TF log from `yarn logs` and the files on HDFS, and stop the cluster. The cluster lives in
# $1 (default /tmp/tfos-hadoop). docs/hadoop.md explains each setting.
set -euo pipefail
TFOS_EXTRAS="tf,spark,examples,hdfs"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
# the node tunnel and shim of encrypted clusters (the default; cached): YARN's containers find them by TFOS_TUNNEL_DIR
TUNNEL_DIR="$(dirname "$(python -m tfos.tunnel build | head -1)")"
DIR="${1:-/tmp/tfos-hadoop}"
hadoop() { python -m tfos.testing.hadoop "$@"; }
hadoop up --dir "$DIR"
trap 'hadoop down --dir "$DIR"' EXIT
export HADOOP_CONF_DIR="$DIR/conf"
SP="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
PY4J="$(ls "$SP"/python/lib/py4j-*-src.zip | tail -1)"
# the containers reach tfos's control service at this machine's own (non-loopback) address
HOST_IP="$(python -c 'from tfos.testing.hadoop.yarn import host_address; print(host_address())')"
export PYSPARK_PYTHON="$(command -v python)" SPARK_LOCAL_IP=127.0.0.1 TFOS_SERVER_HOST="$HOST_IP"
export PYSPARK_ARCHIVES_PATH="local:$SP/python/lib/pyspark.zip,local:$PY4J"
spark-submit --master yarn --deploy-mode client --num-executors 2 --executor-memory 768m \
  --conf spark.executor.memoryOverhead=1536m --conf spark.executor.cores=1 \
  --conf "spark.yarn.jars=local:$SP/jars/*" --conf spark.driver.host=127.0.0.1 \
  --conf spark.yarn.am.memory=512m --conf spark.ui.enabled=false --conf "spark.executorEnv.TFOS_TUNNEL_DIR=$TUNNEL_DIR" \
  examples/digits/digits_tf.py --epochs 3 --data-dir hdfs:///tmp/digits \
  --output-dir hdfs:///tmp/digits-out --export-dir hdfs:///tmp/digits-out/export \
  2> "$DIR/spark-submit.log" | grep -v " INFO " || { tail -50 "$DIR/spark-submit.log"; exit 1; }
APP="$(grep -o 'application_[0-9]*_[0-9]*' "$DIR/spark-submit.log" | head -1)"
sleep 5  # the NodeManagers aggregate the containers' logs once the application ended
echo "== yarn logs -applicationId $APP: the TF processes' logs (tfos-node-<i>.log)"
hadoop yarn --dir "$DIR" logs -applicationId "$APP" | grep -E "^LogType:tfos-node|^rank [0-9]|^chief:"
echo "== on HDFS"
hadoop fs --dir "$DIR" -ls -R /tmp/digits-out
