"""tfos.ml on the shared local-cluster: TFEstimator.fit runs a tfos training, TFModel.transform
predicts with mapInArrow, Params survive save/load."""

import os

import numpy as np
import pytest

from tfos.errors import ConfigError
from tfos.ml import TFEstimator, TFModel


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


def _digits(spark):
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
@pytest.mark.spark
def test_missing_export_dir_and_input_cols_raise_before_any_cluster(spark):
    df = spark.createDataFrame([([1.0, 2.0], 0)], "features array<float>, label long")
    with pytest.raises(ConfigError, match="exportDir"):
        TFEstimator(digits_train_fn, inputCols=["features"]).fit(df)
    with pytest.raises(ConfigError, match="inputCols"):
        TFEstimator(digits_train_fn, exportDir="/tmp/x.keras").fit(df)
    with pytest.raises(ConfigError, match="absolute path"):
        TFEstimator(digits_train_fn, inputCols=["features"], exportDir="rel/x.keras").fit(df)
    with pytest.raises(ConfigError, match="not in the DataFrame"):
        TFEstimator(digits_train_fn, inputCols=["nope"], exportDir="/tmp/x.keras").fit(df)
    with pytest.raises(ConfigError, match="train_fn"):
        TFEstimator(inputCols=["features"], exportDir="/tmp/x.keras").fit(df)
    with pytest.raises(ConfigError, match="already has a column"):
        TFModel(modelPath="/tmp/x.keras", inputCols=["features"], outputCol="label").transform(df)


@pytest.mark.spark
def test_estimator_and_model_save_load_round_trip(spark, tmp_path):
    est = TFEstimator(digits_train_fn, {"learning_rate": 0.05}, inputCols=["features"], labelCol="y",
                      exportDir="/tmp/m.keras", epochs=4, batchSize=16, env={"A": "1"}, outputMode="argmax")
    est.save(str(tmp_path / "est"))
    loaded = TFEstimator.load(str(tmp_path / "est"))
    assert loaded.uid == est.uid and loaded.train_fn is digits_train_fn and loaded.tf_args == {"learning_rate": 0.05}
    for name in ("inputCols", "labelCol", "exportDir", "epochs", "batchSize", "env", "outputMode", "numExecutors",
                 "inputMode", "masterNode", "backend", "outputType"):
        assert loaded.getOrDefault(name) == est.getOrDefault(name), name
    assert not loaded.isSet(loaded.outputType)

    est.write().option("saveTrainFn", "false").save(str(tmp_path / "est-nofn"))
    assert TFEstimator.load(str(tmp_path / "est-nofn")).train_fn is None

    model = TFModel(modelPath="/tmp/m.keras", inputCols=["a", "b"], outputType="double", batchSize=64)
    model.write().overwrite().save(str(tmp_path / "model"))
    m2 = TFModel.load(str(tmp_path / "model"))
    assert (m2.uid, m2.getModelPath(), m2.getInputCols(), m2.getOutputType(), m2.getBatchSize()) == \
        (model.uid, "/tmp/m.keras", ["a", "b"], "double", 64)
    with pytest.raises(ConfigError, match="not a tfos.ml.TFModel"):
        TFModel.load(str(tmp_path / "est"))

    from pyspark.ml import Pipeline

    Pipeline(stages=[est]).save(str(tmp_path / "pipe"))
    [stage] = Pipeline.load(str(tmp_path / "pipe")).getStages()
    assert isinstance(stage, TFEstimator) and stage.getEpochs() == 4 and stage.train_fn is digits_train_fn


@pytest.mark.spark
@pytest.mark.slow
def test_fit_then_transform_digits(spark, tmp_path):
    train, test = _digits(spark)
    export = str(tmp_path / "digits.keras")
    est = TFEstimator(digits_train_fn, {"learning_rate": 0.01}, inputCols=["features"], labelCol="label",
                      exportDir=export, numExecutors=2, epochs=8, batchSize=32, reservationTimeout=120)
    model = est.fit(train)
    assert isinstance(model, TFModel) and model.getModelPath() == export and os.path.exists(export)

    scored = model.setOutputMode("argmax").transform(test)
    assert scored.schema["prediction"].dataType.simpleString() == "int"
    rows = scored.select("label", "prediction").collect()
    assert len(rows) == test.count()
    acc = float(np.mean([r.label == r.prediction for r in rows]))
    assert acc >= 0.9, acc

    raw = TFModel(modelPath=export, inputCols=["features"], outputCol="logits").transform(test)
    assert raw.columns == ["features", "label", "logits"]
    first = raw.first()
    assert len(first.logits) == 10 and int(np.argmax(first.logits)) in range(10)
