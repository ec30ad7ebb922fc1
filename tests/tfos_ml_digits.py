"""The digits train_fn and DataFrames of the tfos.ml tests; shared by the classic suite
(tests/integration/test_ml_spark.py) and the Spark Connect suite (tests/connect)."""

import numpy as np


def digits_train_fn(args, ctx):
    """MWMS custom loop over the fed (features, label) rows; the chief saves a .keras file."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch_size * ctx.num_workers
    feed = ctx.get_data_feed(train_mode=True)
    spec = (tf.TensorSpec((None, 64), tf.float32), tf.TensorSpec((None,), tf.int64))
    dist_ds = strategy.distribute_datasets_from_function(lambda _: feed.dataset(args.batch_size, spec))
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        optimizer = keras.optimizers.Adam(args.learning_rate)

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    for batch in dist_ds:  # to exhaustion: every epoch is in the one feed
        train_step(batch)
    if ctx.is_chief:
        model.save(args.export_dir)


def digits_data(spark):
    """(train, test) digits DataFrames: features array<float>, label long."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    n_test = len(y) // 4
    schema = "features array<float>, label long"
    train = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(x[n_test:], y[n_test:])], schema)
    test = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(x[:n_test], y[:n_test])], schema)
    return train.repartition(4), test.repartition(2)


# ------------------------------------------------------------------------------------------- no Spark
