"""tfos.ml on the shared local-cluster: TFEstimator.fit runs a tfos training, TFModel.transform
predicts with mapInArrow, Params survive save/load."""

import os

import numpy as np
import pytest

from tfos.errors import ConfigError
from tfos.ml import TFEstimator, TFModel
from tfos_ml_digits import digits_data as _digits, digits_train_fn


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
                      exportDir=export, numExecutors=2, epochs=2, batchSize=32, reservationTimeout=120)
    model = est.fit(train)
    assert isinstance(model, TFModel) and model.getModelPath() == export and os.path.exists(export)

    scored = model.setOutputMode("argmax").transform(test)
    assert scored.schema["prediction"].dataType.simpleString() == "int"
    rows = scored.select("label", "prediction").collect()
    assert len(rows) == test.count()
    acc = float(np.mean([r.label == r.prediction for r in rows]))
    assert acc > 0.5, acc  # it learns (2 epochs); the examples train to accuracy

    raw = TFModel(modelPath=export, inputCols=["features"], outputCol="logits").transform(test)
    assert raw.columns == ["features", "label", "logits"]
    first = raw.first()
    assert len(first.logits) == 10 and int(np.argmax(first.logits)) in range(10)
