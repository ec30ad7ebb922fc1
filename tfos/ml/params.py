"""Spark ML Params of TFEstimator and TFModel, their type converters and checks.

Runs on the driver only (Spark ML Params live in the driver's pyspark.ml objects).
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasLabelCol, HasOutputCol

from tfos import InputMode
from tfos.errors import ConfigError

#: Spark SQL types a TFModel can write, by normalised name.
OUTPUT_TYPES = ("float", "double", "int", "bigint", "array<float>", "array<double>")
_TYPE_ALIASES = {"integer": "int", "long": "bigint", "float32": "float", "float64": "double",
                 "array<float32>": "array<float>", "array<float64>": "array<double>"}
OUTPUT_MODES = ("raw", "argmax")


# ---------------------------------------------------------------------------------------------- converters
def _to_optional_string(value):
    return None if value is None else TypeConverters.toString(value)


def _to_input_mode(value) -> int:
    if isinstance(value, str):
        try:
            return int(InputMode[value.strip().upper()])
        except KeyError:
            raise ConfigError(f"inputMode must be 'SPARK' or 'TENSORFLOW' (or tfos.InputMode), got {value!r}") from None
    try:
        return int(InputMode(int(value)))
    except (TypeError, ValueError):
        raise ConfigError(f"inputMode must be InputMode.SPARK or InputMode.TENSORFLOW, got {value!r}") from None


def _to_env(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"env must be a dict of environment variables for the TF processes, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _to_output_type(value) -> str:
    name = "".join(TypeConverters.toString(value).split()).lower()
    name = _TYPE_ALIASES.get(name, name)
    if name not in OUTPUT_TYPES:
        raise ConfigError(f"outputType must be one of {', '.join(OUTPUT_TYPES)}, got {value!r}")
    return name


def _to_output_mode(value) -> str:
    name = TypeConverters.toString(value).strip().lower()
    if name not in OUTPUT_MODES:
        raise ConfigError(f"outputMode must be 'raw' (the model's output) or 'argmax' (index of the largest "
                          f"output per row), got {value!r}")
    return name


def _checked(name: str, convert, valid, what: str):
    """Converter: ``convert(value)``, a ConfigError '<name> must be <what>' unless ``valid`` of the result."""
    def check(value):
        v = convert(value)
        if not valid(v):
            raise ConfigError(f"{name} must be {what}, got {value!r}")
        return v
    return check


def _positive_int(name):
    return _checked(name, TypeConverters.toInt, lambda v: v >= 1, "a positive int")


def _positive_seconds(name):
    return _checked(name, TypeConverters.toFloat, lambda v: v > 0, "a positive number of seconds")


# ---------------------------------------------------------------------------------------------- params
class _TFOutputParams(HasInputCols, HasOutputCol):
    """Params shared by TFEstimator and TFModel: what the model reads and what it writes."""

    batchSize: Param = Param(Params._dummy(), "batchSize",
                             "rows per batch: per worker in training (TFEstimator), per model call in inference "
                             "(TFModel)", typeConverter=_positive_int("batchSize"))
    outputType: Param = Param(Params._dummy(), "outputType",
                              "Spark SQL type of the prediction column: " + ", ".join(OUTPUT_TYPES),
                              typeConverter=_to_output_type)
    outputMode: Param = Param(Params._dummy(), "outputMode",
                              "'raw' writes the model output, 'argmax' the index of its largest value per row",
                              typeConverter=_to_output_mode)

    def __init__(self):
        super().__init__()
        self._setDefault(outputCol="prediction", outputType="array<float>", outputMode="raw")

    def setInputCols(self, value):
        """Feature columns, fed in this order (numeric scalars, numeric arrays or ml Vectors)."""
        return self._set(inputCols=value)

    def setOutputCol(self, value):
        """Name of the prediction column added by TFModel.transform (default 'prediction')."""
        return self._set(outputCol=value)

    def setBatchSize(self, value):
        return self._set(batchSize=value)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def setOutputType(self, value):
        """'array<float>' (default), 'array<double>', 'float', 'double', 'int' or 'bigint'."""
        return self._set(outputType=value)

    def getOutputType(self) -> str:
        return self.getOrDefault(self.outputType)

    def setOutputMode(self, value):
        """'raw' (default) or 'argmax' (class index; outputType then defaults to 'int')."""
        return self._set(outputMode=value)

    def getOutputMode(self) -> str:
        return self.getOrDefault(self.outputMode)

    def _effective_output_type(self) -> str:
        """outputType, except that 'argmax' without an explicit outputType writes 'int'."""
        if self.getOutputMode() == "argmax" and not self.isSet(self.outputType):
            return "int"
        return self.getOutputType()


class _TFEstimatorParams(_TFOutputParams, HasLabelCol):
    numExecutors: Param = Param(Params._dummy(), "numExecutors", "TF nodes (Spark task slots) of the cluster",
                                typeConverter=_positive_int("numExecutors"))
    numPS: Param = Param(Params._dummy(), "numPS", "parameter-server nodes among numExecutors",
                         typeConverter=_checked("numPS", TypeConverters.toInt, lambda v: v >= 0, "an int >= 0"))
    epochs: Param = Param(Params._dummy(), "epochs", "times the training data is fed",
                          typeConverter=_positive_int("epochs"))
    inputMode: Param = Param(Params._dummy(), "inputMode",
                             "InputMode.SPARK (fit feeds the DataFrame) or InputMode.TENSORFLOW (train_fn reads "
                             "its own files; the DataFrame is not fed)", typeConverter=_to_input_mode)
    exportDir: Param = Param(Params._dummy(), "exportDir",
                             "where train_fn saves the trained model on the chief (a .keras file or a SavedModel "
                             "directory); absolute path or URI readable by every executor",
                             typeConverter=TypeConverters.toString)
    masterNode: Param = Param(Params._dummy(), "masterNode", "'chief' (default), 'master', or None for workers only",
                              typeConverter=_to_optional_string)
    reservationTimeout: Param = Param(Params._dummy(), "reservationTimeout",
                                      "seconds to wait for the cluster's executors and TF processes",
                                      typeConverter=_positive_seconds("reservationTimeout"))
    feedTimeout: Param = Param(Params._dummy(), "feedTimeout", "seconds a node may stall the feed",
                               typeConverter=_positive_seconds("feedTimeout"))
    backend: Param = Param(Params._dummy(), "backend", "'mwms', 'ps', 'horovod', or None for the default",
                           typeConverter=_to_optional_string)
    env: Param = Param(Params._dummy(), "env", "extra environment variables of the TF processes (dict)",
                       typeConverter=_to_env)

    def __init__(self):
        super().__init__()
        self._setDefault(numExecutors=2, numPS=0, epochs=1, batchSize=32, inputMode=int(InputMode.SPARK),
                         masterNode="chief", reservationTimeout=600.0, feedTimeout=600.0, backend=None, env={})

    def setLabelCol(self, value):
        """Label column fed after the inputCols ('' feeds no label)."""
        return self._set(labelCol=value)

    def setNumExecutors(self, value):
        return self._set(numExecutors=value)

    def getNumExecutors(self) -> int:
        return self.getOrDefault(self.numExecutors)

    def setNumPS(self, value):
        return self._set(numPS=value)

    def getNumPS(self) -> int:
        return self.getOrDefault(self.numPS)

    def setEpochs(self, value):
        return self._set(epochs=value)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def setInputMode(self, value):
        return self._set(inputMode=value)

    def getInputMode(self) -> InputMode:
        return InputMode(self.getOrDefault(self.inputMode))

    def setExportDir(self, value):
        return self._set(exportDir=value)

    def getExportDir(self) -> str:
        return self.getOrDefault(self.exportDir)

    def setMasterNode(self, value):
        return self._set(masterNode=value)

    def getMasterNode(self):
        return self.getOrDefault(self.masterNode)

    def setReservationTimeout(self, value):
        return self._set(reservationTimeout=value)

    def getReservationTimeout(self) -> float:
        return self.getOrDefault(self.reservationTimeout)

    def setFeedTimeout(self, value):
        return self._set(feedTimeout=value)

    def getFeedTimeout(self) -> float:
        return self.getOrDefault(self.feedTimeout)

    def setBackend(self, value):
        return self._set(backend=value)

    def getBackend(self):
        return self.getOrDefault(self.backend)

    def setEnv(self, value):
        return self._set(env=value)

    def getEnv(self) -> dict:
        return dict(self.getOrDefault(self.env) or {})


class _TFModelParams(_TFOutputParams):
    modelPath: Param = Param(Params._dummy(), "modelPath",
                             "the trained model: a .keras/.h5 file or a SavedModel directory",
                             typeConverter=TypeConverters.toString)
    signatureName: Param = Param(Params._dummy(), "signatureName",
                                 "SavedModel signature to call (SavedModel directories only)",
                                 typeConverter=TypeConverters.toString)

    def __init__(self):
        super().__init__()
        self._setDefault(batchSize=256, signatureName="serving_default")

    def setModelPath(self, value):
        return self._set(modelPath=value)

    def getModelPath(self) -> str:
        return self.getOrDefault(self.modelPath)

    def setSignatureName(self, value):
        return self._set(signatureName=value)

    def getSignatureName(self) -> str:
        return self.getOrDefault(self.signatureName)


# ---------------------------------------------------------------------------------------------- checks
def set_params(instance: Params, params: dict) -> None:
    """Set Params by name; ConfigError naming the valid ones for an unknown name."""
    for name, value in params.items():
        if not instance.hasParam(name):
            valid = ", ".join(sorted(p.name for p in instance.params))
            raise ConfigError(f"{type(instance).__name__} has no param {name!r}; valid params: {valid}")
        instance._set(**{name: value})


def require(instance: Params, name: str, hint: str):
    """The value of Param ``name``; ConfigError with ``hint`` if it is unset or empty."""
    param = instance.getParam(name)
    if not instance.isDefined(param) or instance.getOrDefault(param) in (None, "", []):
        raise ConfigError(f"{type(instance).__name__}: param {name!r} is not set; {hint}")
    return instance.getOrDefault(param)


def check_location(path: str, name: str) -> None:
    """ConfigError unless ``path`` is absolute or a URI (every executor resolves it the same way)."""
    parsed = urlparse(path)
    if not parsed.scheme and not os.path.isabs(path):
        raise ConfigError(f"{name} must be an absolute path or a URI (file:///..., hdfs://...) that the chief can "
                          f"write and every executor can read, got the relative path {path!r}")


def input_arrays(df, cols: list) -> list:
    """Per input column, the expression to feed it as an array (ml Vectors: array<float>), or None
    to feed the column as it is; ConfigError for a missing column or an unsupported type."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BooleanType, NumericType, StringType

    exprs = []
    for col in cols:
        if col not in df.columns:
            raise ConfigError(f"input column {col!r} is not in the DataFrame (columns: {', '.join(df.columns)})")
        dt = df.schema[col].dataType
        if isinstance(dt, VectorUDT):
            exprs.append(vector_to_array(F.col(col), "float32"))
        elif (isinstance(dt, ArrayType) and isinstance(dt.elementType, (NumericType, BooleanType))) or \
                isinstance(dt, (NumericType, BooleanType, StringType)):
            exprs.append(None)
        else:
            raise ConfigError(f"column {col!r} has type {dt.simpleString()}: tfos.ml feeds numeric scalars, strings, "
                              "arrays of numbers and ml Vectors; convert it first (e.g. with a SQL expression)")
    return exprs
