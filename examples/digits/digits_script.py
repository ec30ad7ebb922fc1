"""A plain TensorFlow multi-worker script: it knows nothing of Spark or tfos.

It reads TF_CONFIG (as on any multi-worker setup), trains digits with MultiWorkerMirroredStrategy
and a custom loop, each worker on its own half of the training rows, and the chief prints the test
accuracy (and writes it to --output). tfos runs it unchanged on Spark executors:

    python -m tfos.run --master 'local-cluster[2,1,1024]' --num-executors 2 \\
        examples/digits/digits_script.py --epochs 15 --output /tmp/digits-script.json
"""

import argparse
import json
import os

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--output", default="", help="the chief writes {'accuracy': ...} here")
    p.add_argument("--fail", type=int, default=0, help="exit with this code after printing (for tests)")
    args = p.parse_args()
    if args.fail:
        print("failing on purpose as asked", flush=True)
        raise SystemExit(args.fail)

    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    tf_config = json.loads(os.environ["TF_CONFIG"])
    task, cluster = tf_config["task"], tf_config["cluster"]
    workers = cluster.get("chief", []) + cluster.get("worker", [])
    rank = task["index"] + (len(cluster.get("chief", [])) if task["type"] == "worker" else 0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    n_test = len(y) // 4
    (x_test, y_test), (x_train, y_train) = (x[:n_test], y[:n_test]), (x[n_test:], y[n_test:])
    per_worker = len(y_train) // len(workers)
    mine = slice(rank * per_worker, (rank + 1) * per_worker)  # equal shares: the ring never waits on a missing batch

    global_batch = args.batch_size * len(workers)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(args.learning_rate)

    def dataset_fn(_ctx):
        ds = tf.data.Dataset.from_tensor_slices((x_train[mine], y_train[mine]))
        return ds.shuffle(per_worker, seed=rank).batch(args.batch_size, drop_remainder=True)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(yb, model(xb, training=True), from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(xb, yb):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(xb, yb)), axis=None)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    steps = 0
    for epoch in range(args.epochs):
        for xb, yb in dist:
            loss = train_step(xb, yb)
            steps += 1
        print(f"worker {rank}: epoch {epoch + 1} loss {float(loss):.4f}", flush=True)
    accuracy = float(np.mean(np.argmax(model(x_test, training=False).numpy(), axis=1) == y_test))
    if rank == 0:
        print(f"test accuracy {accuracy:.4f} after {steps} steps", flush=True)
        if args.output:
            with open(args.output, "w") as f:
                json.dump({"accuracy": accuracy, "steps": steps}, f)


if __name__ == "__main__":
    main()
