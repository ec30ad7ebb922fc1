"""TFModel: the Spark ML Model whose ``transform`` predicts with a saved TF model via ``mapInArrow``.

Runs on the driver: it checks the Params and plans the ``mapInArrow`` call. The function it hands
to ``mapInArrow`` is ``tfos.ml.predictor.predict_batches``, which runs in the executors' Python
workers.
"""

from __future__ import annotations

import functools

from pyspark.ml import Model

from tfos.errors import ConfigError
from tfos.ml.params import _TFModelParams, check_location, input_arrays, require, set_params
from tfos.ml.persistence import TFReadWrite
from tfos.ml.predictor import predict_batches


class TFModel(Model, _TFModelParams, TFReadWrite):
    """Spark ML Model: ``transform(df)`` adds ``outputCol`` with the predictions of a saved TF model.

    ``TFModel(modelPath=..., inputCols=[...], outputCol='prediction', batchSize=256,
    outputType='array<float>', outputMode='raw', signatureName='serving_default')``.

    ``modelPath`` is a ``.keras`` / ``.h5`` file (loaded with ``keras.saving.load_model``, or
    ``tf_keras`` when ``TF_USE_LEGACY_KERAS=1`` or Keras 3 cannot read it) or a SavedModel
    directory (``tf.saved_model.load``, called through ``signatureName``). Each executor Python
    worker loads it once and keeps it for later tasks.

    Inputs, per Arrow batch and without per-row Python work: an array (or ml Vector) column
    becomes an ``(n, d)`` array; if every input column is a scalar they are stacked into one
    ``(n, k)`` array. One resulting array is passed as the model's input, several as a list
    (multi-input models; SavedModel signatures match them by name, else by position).

    Output: ``outputMode='raw'`` writes the model's output as ``outputType``: an array type
    holds the flattened output of each row, a scalar type needs one value per row.
    ``outputMode='argmax'`` writes the index of the largest output (outputType 'int' unless set).

    ``save(path)`` / ``TFModel.load(path)`` keep the Params; the model files stay at ``modelPath``.
    """

    # Saved metadata names the class by module (Pipeline.load imports it from there): keep the
    # public name "tfos.ml.TFModel" so saves stay loadable whatever module defines the class.
    __module__ = "tfos.ml"

    def __init__(self, **params):
        super().__init__()
        set_params(self, params)

    def setParams(self, **params) -> "TFModel":
        """Set several Params by name."""
        set_params(self, params)
        return self

    def _transform(self, dataset):
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructField, StructType

        path = require(self, "modelPath", "set modelPath to the saved model (.keras file or SavedModel directory)")
        check_location(path, "modelPath")
        input_cols = list(require(self, "inputCols", "set inputCols=[...] to the model's feature columns"))
        out_col = self.getOutputCol()
        if out_col in dataset.columns:
            raise ConfigError(f"the DataFrame already has a column {out_col!r}: set outputCol to another name")
        out_type = self._effective_output_type()
        mode = self.getOutputMode()
        if mode == "argmax" and out_type.startswith("array"):
            raise ConfigError(f"outputMode='argmax' writes one class index per row but outputType is {out_type!r}: "
                              "use outputType 'int' or 'bigint' (or outputMode='raw')")
        spark_type = _spark_type(out_type)
        keep = list(dataset.columns)
        df, feed_cols = dataset, []
        for j, (col, expr) in enumerate(zip(input_cols, input_arrays(dataset, input_cols))):
            if expr is None:
                feed_cols.append(col)
            else:  # an ml Vector: feed an array<float> copy, keep the Vector column as it is
                feed_cols.append(f"__tfos_input_{j}")
                df = df.withColumn(feed_cols[-1], expr)
        schema = StructType(list(dataset.schema.fields) + [StructField(out_col, spark_type, True)])
        fn = functools.partial(predict_batches, path=path, signature=self.getSignatureName(),
                               input_names=input_cols, feed_cols=feed_cols, keep_cols=keep, out_col=out_col,
                               arrow_type=to_arrow_type(spark_type), mode=mode, batch_size=self.getBatchSize())
        return df.mapInArrow(fn, schema)


def _spark_type(name: str):
    """The Spark SQL type of an OUTPUT_TYPES name."""
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, IntegerType, LongType

    scalar = {"float": FloatType, "double": DoubleType, "int": IntegerType, "bigint": LongType}
    if name.startswith("array<"):
        return ArrayType(scalar[name[6:-1]](), True)
    return scalar[name]()
