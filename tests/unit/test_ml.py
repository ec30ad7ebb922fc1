"""tfos.ml: the Spark ML TFEstimator / TFModel (Params, persistence, inference helpers, end to end)."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tfos.errors import ConfigError, TFOSError
from tfos.ml import OUTPUT_MODES, OUTPUT_TYPES, TFEstimator, TFModel, batch_inputs, get_predictor, to_arrow_column
from tfos.ml.predictor import predict_batches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _imported_after(statement: str) -> set:
    """The modules a fresh interpreter has imported after running ``statement``."""
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_tfos_ml_does_not_import_tensorflow():
    mods = _imported_after("import tfos.ml")
    assert "tfos.ml" in mods and "tensorflow" not in mods


def test_executor_module_imports_no_driver_code():
    """The mapInArrow function's module is what Python workers import: no pyspark.ml, no driver modules."""
    mods = _imported_after("import tfos.ml.predictor")
    assert "tfos.ml.predictor" in mods
    assert not {m for m in mods if m == "pyspark.ml" or m.startswith("pyspark.ml.")}
    assert not mods & {"tfos.ml.estimator", "tfos.ml.model", "tfos.ml.params", "tfos.ml.persistence", "tensorflow"}


def test_public_names_and_saved_class_names():
    assert OUTPUT_MODES == ("raw", "argmax") and "array<float>" in OUTPUT_TYPES
    # save() records the class as module.name and Pipeline.load imports it from there: keep tfos.ml
    assert (TFEstimator.__module__, TFModel.__module__) == ("tfos.ml", "tfos.ml")
    import tfos.ml
    assert set(tfos.ml.__all__) <= set(dir(tfos.ml))
    with pytest.raises(AttributeError):
        tfos.ml.no_such_name


def _train_fn(args, ctx):
    pass


def test_params_defaults_setters_and_args():
    est = TFEstimator(_train_fn, {"learning_rate": 0.01, "batch_size": 999}, inputCols=["features"],
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
        TFEstimator(_train_fn, **bad)


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


def test_predict_batches_is_the_map_in_arrow_body(tmp_path):
    """What TFModel.transform hands to mapInArrow, run on Arrow batches without Spark."""
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    path = str(tmp_path / "m.keras")
    model.save(path)
    a, b = np.arange(5, dtype=np.float32), np.arange(5, 10, dtype=np.float32)
    want = model.predict(np.stack([a, b], axis=1), verbose=0)
    batches = [pa.RecordBatch.from_arrays([pa.array(a[:3]), pa.array(b[:3]), pa.array(["x", "y", "z"])],
                                          names=["a", "b", "id"]),
               pa.RecordBatch.from_arrays([pa.array(a[3:]), pa.array(b[3:]), pa.array(["u", "v"])],
                                          names=["a", "b", "id"])]
    out = list(predict_batches(iter(batches), path=path, signature="serving_default", input_names=["a", "b"],
                               feed_cols=["a", "b"], keep_cols=["id"], out_col="cls", arrow_type=pa.int32(),
                               mode="argmax", batch_size=2))
    table = pa.Table.from_batches(out)
    assert table.schema.names == ["id", "cls"] and table.schema.field("cls").type == pa.int32()
    assert table.column("id").to_pylist() == ["x", "y", "z", "u", "v"]
    assert table.column("cls").to_pylist() == np.argmax(want, axis=1).tolist()


# ------------------------------------------------------------------------------------------- Spark
