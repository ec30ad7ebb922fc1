"""tfos.ml: the Spark ML TFEstimator / TFModel (Params, persistence, inference helpers, end to end)."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tfos.errors import ConfigError, TFOSError
from tfos.ml import TFEstimator, TFModel, batch_inputs, get_predictor, to_arrow_column


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
def test_importing_tfos_ml_does_not_import_tensorflow():
    code = "import sys, tfos.ml; sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


def test_params_defaults_setters_and_args():
    est = TFEstimator(digits_train_fn, {"learning_rate": 0.01, "batch_size": 999}, inputCols=["features"],
                      exportDir="/tmp/m.keras", epochs=3)
    assert (est.getNumExecutors(), est.getNumPS(), est.getEpochs(), est.getBatchSize()) == (2, 0, 3, 32)
    assert est.getLabelCol() == "label" and est.getMasterNode() == "chief" and est.getOutputCol() == "prediction"
    assert est.setBatchSize(16).setInputMode("tensorflow").getInputMode() == 0
    args = est.train_args()
    assert (args.learning_rate, args.batch_size, args.epochs, args.export_dir) == (0.01, 16, 3, "/tmp/m.keras")
    assert args.input_cols == ["features"] and args.label_col == "label"
    model = TFModel(modelPath="/m", inputCols=["a"])
    assert model.getBatchSize() == 256 and model.getOutputType() == "array<float>"
    assert model.setOutputMode("argmax")._effective_output_type() == "int"


@pytest.mark.parametrize("bad", [dict(numExecutors=0), dict(outputType="string"), dict(outputMode="softmax"),
                                 dict(inputMode="files"), dict(nosuchParam=1), dict(env=["A=1"])])
def test_bad_params_raise_config_error(bad):
    with pytest.raises(ConfigError):
        TFEstimator(digits_train_fn, **bad)


def test_batch_inputs_without_row_loops():
    lists = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], type=pa.list_(pa.float32()))
    batch = pa.RecordBatch.from_arrays([lists, pa.array([1, 2, 3]), pa.array([0.5, 1.5, 2.5])],
                                       names=["v", "i", "f"])
    [x] = batch_inputs(batch, ["v"])
    assert x.shape == (3, 2) and x.dtype == np.float32
    [s] = batch_inputs(batch, ["i", "f"])
    np.testing.assert_array_equal(s, [[1, 0.5], [2, 1.5], [3, 2.5]])
    v, i = batch_inputs(batch, ["v", "i"])
    assert v.shape == (3, 2) and i.shape == (3, 1)


def test_to_arrow_column_types_and_errors():
    preds = np.array([[0.1, 0.9], [0.8, 0.2]], dtype=np.float32)
    col = to_arrow_column(preds, 2, pa.list_(pa.field("element", pa.float32())), "raw")
    assert col.to_pylist() == [pytest.approx([0.1, 0.9]), pytest.approx([0.8, 0.2])]
    assert to_arrow_column(preds, 2, pa.int32(), "argmax").to_pylist() == [1, 0]
    assert to_arrow_column(np.array([[1.5], [2.5]]), 2, pa.float64(), "raw").to_pylist() == [1.5, 2.5]
    assert to_arrow_column(None, 0, pa.float64(), "raw").to_pylist() == []
    with pytest.raises(ConfigError, match="outputType='array<float>'"):
        to_arrow_column(preds, 2, pa.float64(), "raw")
    with pytest.raises(ConfigError, match="outputMode='raw'"):
        to_arrow_column(np.array([[1.0], [2.0]]), 2, pa.int32(), "argmax")
    with pytest.raises(TFOSError, match="batch dimension"):
        to_arrow_column(preds, 3, pa.float64(), "raw")


def test_predictor_loads_keras_file_and_savedmodel_once(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    want = model.predict(x, verbose=0)
    keras_path = str(tmp_path / "m.keras")
    model.save(keras_path)
    model.export(str(tmp_path / "sm"), verbose=False)
    for path in (keras_path, "file://" + str(tmp_path / "sm")):
        p = get_predictor(path)
        assert get_predictor(path) is p  # cached per process
        np.testing.assert_allclose(p.predict([x], ["f"], batch_size=3), want, rtol=1e-5)
    with pytest.raises(ConfigError, match="set signatureName"):
        get_predictor(str(tmp_path / "sm"), "nope")
    with pytest.raises(ConfigError, match="neither a .keras"):
        get_predictor(str(tmp_path))


# ------------------------------------------------------------------------------------------- Spark
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
