"""Programs of the reduction-server tests, shared by the process-level tests
(tests/integration/test_reduction_processes.py: workers and reducers as plain processes on loopback),
the local-cluster suite (tests/reduction) and the multi-host suite (tests/multihost)."""

import json
import os
import sys
import time

#: (dtype, elements): sizes not divisible by 2 or 3 reducers, below one element per reducer, and
#: many pieces (tfos.tf.reduction.piece_bytes) and a last one that is not whole.
CASES = [(dtype, n) for dtype in ("float32", "float16", "bfloat16", "float64", "int32", "int64")
         for n in (1, 5, 1001, (4 << 20) // 4 * 2 + 7)]


def known(rank: int, n: int):
    """What rank ``rank`` contributes: small integers, so every dtype holds the exact sum."""
    import numpy as np

    return (np.arange(n) % 61 + 7 * rank).astype("float64")


def check_sums(size: int) -> dict:
    """All-reduce every case of CASES (sum in a tf.function, mean eagerly) through the process's
    group; the largest error against the exact result, per case (0.0 everywhere when right)."""
    import numpy as np
    import tensorflow as tf

    from tfos import keras_dist

    errors = {}
    for dtype, n in CASES:
        mine = tf.constant(known(keras_dist.rank(), n), dtype=dtype)
        exact = sum(known(r, n) for r in range(size))
        got = tf.function(lambda t: keras_dist.allreduce(t, average=False))(mine).numpy().astype("float64")
        errors[f"{dtype}/{n}/sum"] = float(np.max(np.abs(got - exact)))
        mean = keras_dist.allreduce(mine, average=True).numpy().astype("float64")
        want = np.floor(exact / size) if dtype.startswith("int") else exact / size
        errors[f"{dtype}/{n}/mean"] = float(np.max(np.abs(mean - want)))
    return errors


def worker(mode: str, out: str) -> None:
    """A worker outside a tfos cluster (TF_CONFIG and TFOS_REDUCERS set by the test). ``sums``:
    write check_sums and a broadcast; ``loop``: all-reduce 8 MiB in a tf.function until an error,
    then write its type, text and time; ``pauses``: the same with 2 s between all-reduces."""
    from tfos import keras_dist

    rank, size = keras_dist.init_collectives(implementation="reduction_server",
                                             timeout_seconds=float(os.environ.get("RS_TIMEOUT", "20")))
    import tensorflow as tf

    if mode == "sums":
        result = {"errors": check_sums(size)}
        v = tf.Variable(tf.fill([1000], float(rank + 1)))
        keras_dist.broadcast_variables([v], root_rank=1)
        result["broadcast"] = float(v.numpy().sum())
        with open(out, "w") as f:
            json.dump(result, f)
        return
    step = tf.function(lambda: keras_dist.allreduce(tf.ones([2 << 20]), average=False))
    started = False
    try:
        while True:
            step()
            if mode == "pauses":
                time.sleep(2.0)
            if not started:
                started = True
                with open(out + ".started", "w") as f:
                    f.write(repr(time.time()))
    except Exception as e:
        with open(out, "w") as f:
            json.dump({"type": type(e).__name__, "text": str(e), "time": time.time()}, f)
        sys.exit(3)


def reduction_fit(args, ctx):
    """Keras 3 digits fit through the reducers (tfos.keras_dist, implementation='reduction_server',
    ``args['timeout']`` s per collective), backed up each epoch in ctx.checkpoint_dir and resumed
    from it after a restart; rank 0 writes result.json, every rank its weights."""
    import glob

    import numpy as np

    import digits_tf
    from tfos import callbacks, keras_dist

    rank, size = keras_dist.init_collectives(implementation="reduction_server", timeout_seconds=args["timeout"])
    import keras

    x, y = digits_tf.load_csv(sorted(glob.glob(os.path.join(args["data"], "train-*.csv")))[rank::size])
    n = (args["rows_per_rank"] // 32) * 32  # the same steps on every rank
    keras.utils.set_random_seed(rank)  # different initial weights: the broadcast must fix them
    model = digits_tf.build_model()
    model.compile(optimizer=keras_dist.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                             compression=args.get("compression")),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x[:n], y[:n], batch_size=32, epochs=args["epochs"], verbose=0, shuffle=True,
              callbacks=[keras_dist.BackupAndRestore(ctx.checkpoint_dir), keras_dist.BroadcastInitialWeights(0),
                         keras_dist.MetricAverageCallback(), callbacks.progress(ctx, keras_module=keras)])
    xt, yt = digits_tf.load_csv([os.path.join(args["data"], "test.csv")])
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=1) == yt))
    np.savez(os.path.join(args["out"], f"weights-rank{rank}.npz"), *model.get_weights())
    if rank == 0:
        with open(os.path.join(args["out"], "result.json"), "w") as f:
            json.dump({"accuracy": acc, "attempt": ctx.attempt}, f)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
