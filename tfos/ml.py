"""Spark ML pipeline API: ``TFEstimator`` trains on a tfos cluster, ``TFModel`` predicts with ``mapInArrow``.

Runs on the driver (Params, fit, save/load) and in the executors' Python workers (inference).
Importing this module does not import TensorFlow; the executor functions import it.

Training (``TFEstimator.fit(df)``)::

    def train_fn(args, ctx):                       # the usual main_fun, once per node
        feed = ctx.get_data_feed(train_mode=True)  # rows: (inputCols..., labelCol), `epochs` times over
        ...                                        # train until the feed ends
        if ctx.is_chief:
            model.save(args.export_dir)            # a .keras file, or model.export(dir) for a SavedModel

    est = TFEstimator(train_fn, {"learning_rate": 0.01}, inputCols=["features"], labelCol="label",
                      exportDir="/shared/models/digits.keras", epochs=8, batchSize=32)
    model = est.fit(train_df)                      # a TFModel with modelPath = exportDir
    scored = model.setOutputMode("argmax").transform(test_df)   # + 'prediction' column

``fit`` runs ``TFCluster.run(sc, train_fn, args, numExecutors, numPS, input_mode=SPARK, ...)``,
``cluster.train(df.select(inputCols + [labelCol]), num_epochs=epochs)`` and ``cluster.shutdown()``.
``args`` is an ``argparse.Namespace`` of ``tf_args`` (a dict or Namespace) overlaid with the
Param values: ``export_dir``, ``batch_size``, ``epochs``, ``input_cols``, ``label_col``,
``num_executors``, ``num_ps``, ``input_mode``.

Inference (``TFModel.transform(df)``) needs no TF cluster: every Python worker loads the model
once (a module-level cache keyed by path) and predicts on the Arrow batches of its partitions.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from urllib.parse import urlparse

from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasLabelCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from tfos.cluster.decisions import InputMode
from tfos.errors import ConfigError, TFOSError

logger = logging.getLogger(__name__)

#: Spark SQL types a TFModel can write, by normalised name.
OUTPUT_TYPES = ("float", "double", "int", "bigint", "array<float>", "array<double>")
_TYPE_ALIASES = {"integer": "int", "long": "bigint", "float32": "float", "float64": "double",
                 "array<float32>": "array<float>", "array<float64>": "array<double>"}
OUTPUT_MODES = ("raw", "argmax")
_TRAIN_FN_DIR = "train_fn"


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


def _normalise_type(value: str) -> str:
    name = "".join(str(value).split()).lower()
    return _TYPE_ALIASES.get(name, name)


def _to_output_type(value) -> str:
    name = _normalise_type(TypeConverters.toString(value))
    if name not in OUTPUT_TYPES:
        raise ConfigError(f"outputType must be one of {', '.join(OUTPUT_TYPES)}, got {value!r}")
    return name


def _to_output_mode(value) -> str:
    name = TypeConverters.toString(value).strip().lower()
    if name not in OUTPUT_MODES:
        raise ConfigError(f"outputMode must be 'raw' (the model's output) or 'argmax' (index of the largest "
                          f"output per row), got {value!r}")
    return name


def _positive_int(name):
    def convert(value):
        v = TypeConverters.toInt(value)
        if v < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
        return v
    return convert


def _non_negative_int(name):
    def convert(value):
        v = TypeConverters.toInt(value)
        if v < 0:
            raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        return v
    return convert


def _positive_float(name):
    def convert(value):
        v = TypeConverters.toFloat(value)
        if not v > 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        return v
    return convert


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
                         typeConverter=_non_negative_int("numPS"))
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
                                      typeConverter=_positive_float("reservationTimeout"))
    feedTimeout: Param = Param(Params._dummy(), "feedTimeout", "seconds a node may stall the feed",
                               typeConverter=_positive_float("feedTimeout"))
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


def _set_params(instance: Params, params: dict) -> None:
    for name, value in params.items():
        if not instance.hasParam(name):
            valid = ", ".join(sorted(p.name for p in instance.params))
            raise ConfigError(f"{type(instance).__name__} has no param {name!r}; valid params: {valid}")
        instance._set(**{name: value})


def _require(instance: Params, name: str, hint: str):
    param = instance.getParam(name)
    if not instance.isDefined(param) or instance.getOrDefault(param) in (None, "", []):
        raise ConfigError(f"{type(instance).__name__}: param {name!r} is not set; {hint}")
    return instance.getOrDefault(param)


def _check_location(path: str, name: str) -> None:
    parsed = urlparse(path)
    if not parsed.scheme and not os.path.isabs(path):
        raise ConfigError(f"{name} must be an absolute path or a URI (file:///..., hdfs://...) that the chief can "
                          f"write and every executor can read, got the relative path {path!r}")


# ---------------------------------------------------------------------------------------------- estimator
class TFEstimator(Estimator, _TFEstimatorParams, MLReadable, MLWritable):
    """Spark ML Estimator that trains ``train_fn`` on a tfos cluster and returns a :class:`TFModel`.

    ``TFEstimator(train_fn, tf_args=None, **params)``. ``train_fn(args, ctx)`` is an ordinary tfos
    ``main_fun``: it runs once per node, reads the feed (``ctx.get_data_feed()``: one tuple of
    columns ``inputCols..., labelCol`` per row, all ``epochs`` repeated in one stream; iterate it to
    exhaustion), and **must save the model on the chief** to ``args.export_dir``, e.g.
    ``if ctx.is_chief: model.save(args.export_dir)`` (a ``.keras`` file) or
    ``model.export(args.export_dir)`` (a SavedModel directory).

    Params: ``inputCols`` and ``exportDir`` (required), ``labelCol`` ('label'), ``numExecutors`` (2),
    ``numPS`` (0), ``epochs`` (1), ``batchSize`` (32, per worker; passed as ``args.batch_size``),
    ``inputMode`` (SPARK), ``masterNode`` ('chief'), ``reservationTimeout`` / ``feedTimeout`` (600 s),
    ``backend`` (None), ``env`` ({}), and for the returned model ``outputCol``, ``outputType``,
    ``outputMode``.

    ``save(path)`` writes the Params (Spark ML metadata) plus ``train_fn`` and ``tf_args``
    serialised with cloudpickle under ``path/train_fn`` (skip with
    ``write().option('saveTrainFn', 'false')``). ``load`` unpickles that file: only load
    estimators you saved yourself. A loaded estimator without a saved ``train_fn`` needs
    ``setTrainFn(fn)`` before ``fit``.
    """

    def __init__(self, train_fn=None, tf_args=None, **params):
        super().__init__()
        self.train_fn = train_fn
        self.tf_args = tf_args
        _set_params(self, params)

    def setParams(self, **params) -> "TFEstimator":
        """Set several Params by name."""
        _set_params(self, params)
        return self

    def setTrainFn(self, train_fn, tf_args=None) -> "TFEstimator":
        """Set the training function (and, if given, its ``tf_args``)."""
        self.train_fn = train_fn
        if tf_args is not None:
            self.tf_args = tf_args
        return self

    # -- fit
    def train_args(self) -> argparse.Namespace:
        """The ``args`` train_fn receives: ``tf_args`` overlaid with the Param values."""
        base = self.tf_args
        if base is None:
            values = {}
        elif isinstance(base, dict):
            values = dict(base)
        elif isinstance(base, argparse.Namespace) or hasattr(base, "__dict__"):
            values = dict(vars(base))
        else:
            raise ConfigError(f"tf_args must be a dict or an argparse.Namespace, got {type(base).__name__}")
        label = self.getLabelCol()
        params = dict(export_dir=self.getOrDefault(self.exportDir) if self.isDefined(self.exportDir) else None,
                      batch_size=self.getBatchSize(), epochs=self.getEpochs(),
                      input_cols=list(self.getOrDefault(self.inputCols)) if self.isDefined(self.inputCols) else None,
                      label_col=label or None, num_executors=self.getNumExecutors(), num_ps=self.getNumPS(),
                      input_mode=self.getInputMode())
        overridden = sorted(k for k in params if k in values and values[k] != params[k])
        if overridden:
            logger.info("TFEstimator: Param values replace tf_args %s", overridden)
        values.update(params)
        return argparse.Namespace(**values)

    def _fit(self, dataset):
        from tfos.cluster.driver import TFCluster

        if not callable(self.train_fn):
            raise ConfigError("TFEstimator has no train_fn: pass it as TFEstimator(train_fn, ...) or call "
                              "setTrainFn(fn) (estimators loaded without a saved train_fn need this)")
        export_dir = _require(self, "exportDir", "set exportDir=<absolute path or URI> where train_fn saves the "
                                                 "model on the chief (e.g. /shared/models/m.keras)")
        _check_location(export_dir, "exportDir")
        input_cols = list(_require(self, "inputCols", "set inputCols=[...] to the feature columns to feed"))
        mode = self.getInputMode()
        if self.getNumPS() >= self.getNumExecutors():
            raise ConfigError(f"numPS ({self.getNumPS()}) must be smaller than numExecutors "
                              f"({self.getNumExecutors()}): the chief and workers need slots too")
        data = None
        if mode == InputMode.SPARK:
            label = self.getLabelCol()
            data = _select_inputs(dataset, input_cols + ([label] if label else []))
        args = self.train_args()
        before = _stat(dataset.sparkSession, export_dir)
        sc = dataset.sparkSession.sparkContext
        logger.info("TFEstimator: training on %d nodes (%d ps), %d epoch(s), export to %s",
                    self.getNumExecutors(), self.getNumPS(), self.getEpochs(), export_dir)
        options = {}
        if self.getBackend():
            options["backend"] = self.getBackend()
        if self.getEnv():
            options["env"] = self.getEnv()
        cluster = TFCluster.run(sc, self.train_fn, args, self.getNumExecutors(), self.getNumPS(),
                                input_mode=mode, master_node=self.getMasterNode(),
                                reservation_timeout=self.getReservationTimeout(), **options)
        with cluster:  # shutdown() on success (raises the nodes' errors), abort on an exception
            if data is not None:
                rows = cluster.train(data, num_epochs=self.getEpochs(), feed_timeout=self.getFeedTimeout())
                logger.info("TFEstimator: fed %d rows", rows)
            else:
                logger.info("TFEstimator: InputMode.TENSORFLOW, the DataFrame is not fed; train_fn reads its data")
        after = _stat(dataset.sparkSession, export_dir)
        if after is not None and not after[0]:
            raise TFOSError(f"train_fn finished but nothing was saved at exportDir {export_dir!r}: save the model on "
                            "the chief, e.g. `if ctx.is_chief: model.save(args.export_dir)` (.keras file) or "
                            "`model.export(args.export_dir)` (SavedModel)")
        if after is not None and before == after:
            logger.warning("TFEstimator: exportDir %s was not modified by train_fn; the model will use the older "
                           "files there", export_dir)
        model = TFModel(modelPath=export_dir, inputCols=input_cols)
        for name in ("outputCol", "outputType", "outputMode"):
            if self.isSet(self.getParam(name)):
                model._set(**{name: self.getOrDefault(name)})
        return model

    # -- persistence
    def write(self) -> MLWriter:
        """Writer of the Params and (unless option saveTrainFn=false) train_fn + tf_args."""
        return _TFEstimatorWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _TFReader(cls)


# ---------------------------------------------------------------------------------------------- model
class TFModel(Model, _TFModelParams, MLReadable, MLWritable):
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

    def __init__(self, **params):
        super().__init__()
        _set_params(self, params)

    def setParams(self, **params) -> "TFModel":
        """Set several Params by name."""
        _set_params(self, params)
        return self

    def _transform(self, dataset):
        from pyspark.sql.types import StructField, StructType

        path = _require(self, "modelPath", "set modelPath to the saved model (.keras file or SavedModel directory)")
        _check_location(path, "modelPath")
        input_cols = list(_require(self, "inputCols", "set inputCols=[...] to the model's feature columns"))
        out_col = self.getOutputCol()
        if out_col in dataset.columns:
            raise ConfigError(f"the DataFrame already has a column {out_col!r}: set outputCol to another name")
        out_type = self._effective_output_type()
        mode = self.getOutputMode()
        if mode == "argmax" and out_type.startswith("array"):
            raise ConfigError(f"outputMode='argmax' writes one class index per row but outputType is {out_type!r}: "
                              "use outputType 'int' or 'bigint' (or outputMode='raw')")
        from pyspark.sql.pandas.types import to_arrow_type

        spark_type = _spark_type(out_type)
        arrow_type = to_arrow_type(spark_type)
        keep = list(dataset.columns)
        df, feed_cols = _with_array_inputs(dataset, input_cols)
        schema = StructType(list(dataset.schema.fields) + [StructField(out_col, spark_type, True)])
        fn = _make_predict(path, self.getSignatureName(), input_cols, feed_cols, keep, out_col, arrow_type, mode,
                           self.getBatchSize())
        return df.mapInArrow(fn, schema)

    def write(self) -> MLWriter:
        """Writer of the Params (the model files stay at modelPath)."""
        return _TFModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _TFReader(cls)


# ---------------------------------------------------------------------------------------------- persistence
class _TFModelWriter(MLWriter):
    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"tfos": {"trainFn": False}})


class _TFEstimatorWriter(_TFModelWriter):
    def saveImpl(self, path: str) -> None:
        save_fn = self.optionMap.get("savetrainfn", "true").lower() not in ("false", "0", "no")
        has_fn = save_fn and self.instance.train_fn is not None
        blob = None
        if has_fn:
            from pyspark import cloudpickle

            try:
                blob = cloudpickle.dumps((self.instance.train_fn, self.instance.tf_args))
            except Exception as e:
                raise ConfigError(f"cannot serialise train_fn/tf_args with cloudpickle ({e}); save without it: "
                                  "estimator.write().option('saveTrainFn', 'false').save(path), then "
                                  "setTrainFn(fn) after loading") from e
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"tfos": {"trainFn": has_fn}})
        if blob is not None:
            self.sparkSession.createDataFrame([(bytearray(blob),)], "value binary").coalesce(1) \
                .write.parquet(os.path.join(path, _TRAIN_FN_DIR))


class _TFReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = self.cls.__module__ + "." + self.cls.__name__
        if metadata["class"] != expected:
            raise ConfigError(f"{path} holds a {metadata['class']}, not a {expected}: load it with that class")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if (metadata.get("tfos") or {}).get("trainFn"):
            from pyspark import cloudpickle

            row = self.sparkSession.read.parquet(os.path.join(path, _TRAIN_FN_DIR)).first()
            instance.train_fn, instance.tf_args = cloudpickle.loads(bytes(row[0]))
        return instance


def _stat(spark, path: str):
    """(exists, modification marker) of a local or HDFS path seen from the driver; None if unknown."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme else path
        if not os.path.exists(local):
            return (False, None)
        marks = [os.stat(local).st_mtime_ns]
        if os.path.isdir(local):
            marks += [os.stat(os.path.join(local, n)).st_mtime_ns for n in sorted(os.listdir(local))]
        return (True, max(marks))
    if parsed.scheme in ("hdfs", "viewfs"):
        try:
            jvm = spark.sparkContext._jvm
            p = jvm.org.apache.hadoop.fs.Path(path)
            fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            if not fs.exists(p):
                return (False, None)
            return (True, fs.getFileStatus(p).getModificationTime())
        except Exception as e:  # no Hadoop client on this driver: skip the check
            logger.debug("cannot check %s: %s", path, e)
    return None


# ---------------------------------------------------------------------------------------------- driver helpers
def _spark_type(name: str):
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, IntegerType, LongType

    scalar = {"float": FloatType, "double": DoubleType, "int": IntegerType, "bigint": LongType}
    if name.startswith("array<"):
        return ArrayType(scalar[name[6:-1]](), True)
    return scalar[name]()


def _check_input_type(df, col: str):
    """Return 'vector', 'array' or 'scalar' for a supported input column, else raise ConfigError."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, BooleanType, NumericType, StringType

    if col not in df.columns:
        raise ConfigError(f"input column {col!r} is not in the DataFrame (columns: {', '.join(df.columns)})")
    dt = df.schema[col].dataType
    if isinstance(dt, VectorUDT):
        return "vector"
    if isinstance(dt, ArrayType) and isinstance(dt.elementType, (NumericType, BooleanType)):
        return "array"
    if isinstance(dt, (NumericType, BooleanType, StringType)):
        return "scalar"
    raise ConfigError(f"column {col!r} has type {dt.simpleString()}: tfos.ml feeds numeric scalars, strings, "
                      "arrays of numbers and ml Vectors; convert it first (e.g. with a SQL expression)")


def _select_inputs(df, cols: list):
    """df.select(cols), ml Vectors converted to array<float> (fed as fixed-length vectors)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    exprs = []
    for c in cols:
        kind = _check_input_type(df, c)
        exprs.append(vector_to_array(F.col(c), "float32").alias(c) if kind == "vector" else F.col(c))
    return df.select(*exprs)


def _with_array_inputs(df, cols: list):
    """Add array<float> copies of ml Vector input columns; return (df, column names to feed)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    feed = []
    for j, c in enumerate(cols):
        if _check_input_type(df, c) == "vector":
            tmp = f"__tfos_input_{j}"
            df = df.withColumn(tmp, vector_to_array(F.col(c), "float32"))
            feed.append(tmp)
        else:
            feed.append(c)
    return df, feed


# ---------------------------------------------------------------------------------------------- executor side
_PREDICTORS: dict = {}
_PREDICTORS_LOCK = threading.Lock()


def _make_predict(path, signature, input_names, feed_cols, keep_cols, out_col, arrow_type, mode, batch_size):
    """The mapInArrow function of TFModel.transform (runs in executor Python workers)."""

    def predict(batches):
        import pyarrow as pa

        predictor = get_predictor(path, signature)
        schema = None
        for batch in batches:
            xs = batch_inputs(batch, feed_cols)
            preds = predictor.predict(xs, input_names, batch_size) if batch.num_rows else None
            col = to_arrow_column(preds, batch.num_rows, arrow_type, mode)
            if schema is None:
                fields = [batch.schema.field(c) for c in keep_cols]
                schema = pa.schema(fields + [pa.field(out_col, arrow_type, True)])
            yield pa.RecordBatch.from_arrays([batch.column(c) for c in keep_cols] + [col], schema=schema)

    return predict


def get_predictor(path: str, signature: str = "serving_default"):
    """The model at ``path``, loaded once per process (thread-safe cache keyed by path and signature)."""
    key = (path, signature)
    with _PREDICTORS_LOCK:
        if key not in _PREDICTORS:
            _PREDICTORS[key] = _load_predictor(path, signature)
        return _PREDICTORS[key]


def clear_model_cache() -> None:
    """Forget the models loaded in this process (e.g. after overwriting a model file)."""
    with _PREDICTORS_LOCK:
        _PREDICTORS.clear()


def _local(path: str) -> str:
    parsed = urlparse(path)
    return parsed.path if parsed.scheme == "file" else path


def _load_predictor(path: str, signature: str):
    import tensorflow as tf

    local = _local(path)
    if local.lower().endswith((".keras", ".h5", ".hdf5")):
        if not tf.io.gfile.exists(local):
            raise ConfigError(f"modelPath {path!r} does not exist on this executor: save the model where every "
                              "executor can read it (shared filesystem or HDFS)")
        logger.info("loading Keras model %s", path)
        return _Predictor(_load_keras(local), None)
    if not tf.io.gfile.exists(os.path.join(local, "saved_model.pb")):
        raise ConfigError(f"modelPath {path!r} is neither a .keras/.h5 file nor a SavedModel directory "
                          "(no saved_model.pb) readable by this executor")
    logger.info("loading SavedModel %s", path)
    loaded = tf.saved_model.load(local)
    signatures = dict(loaded.signatures)
    if signature in signatures:
        return _Predictor(None, signatures[signature], keep=loaded)
    if signatures or not callable(loaded):
        raise ConfigError(f"SavedModel {path!r} has no signature {signature!r} (it has {sorted(signatures)}): "
                          "set signatureName")
    return _Predictor(loaded, None)


def _load_keras(path: str):
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes")
    loaders = []
    try:
        import keras

        loaders.append(("keras", lambda: keras.saving.load_model(path, compile=False)))
    except ImportError:
        pass
    try:
        import tf_keras

        entry = ("tf_keras", lambda: tf_keras.models.load_model(path, compile=False))
        loaders.insert(0 if legacy else len(loaders), entry)
    except ImportError:
        pass
    errors = []
    for name, load in loaders:
        try:
            return load()
        except Exception as e:  # try the other Keras
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise TFOSError(f"cannot load the Keras model {path!r}: " + "; ".join(errors or ["no Keras installed"]))


class _Predictor:
    """Calls a Keras model / callable SavedModel (through one tf.function) or a SavedModel signature."""

    def __init__(self, model, signature_fn, keep=None):
        import tensorflow as tf

        self._keep = keep  # the loaded SavedModel owns the signature's variables
        self.signature_fn = signature_fn
        self.model = model
        if model is not None:
            self.fn = tf.function(lambda x: model(x, training=False), reduce_retracing=True)

    def _call(self, xs: list, names: list):
        import tensorflow as tf

        if self.signature_fn is not None:
            specs = self.signature_fn.structured_input_signature[1]
            keys = list(specs)
            if len(keys) != len(xs):
                raise ConfigError(f"the SavedModel signature takes {len(keys)} inputs {keys}, but inputCols give "
                                  f"{len(xs)}; scalar input columns are stacked into one input")
            by_name = set(keys) == set(names) and len(names) == len(xs)
            order = [names.index(k) for k in keys] if by_name else range(len(keys))
            kwargs = {k: tf.cast(xs[i], specs[k].dtype) for k, i in zip(keys, order)}
            out = self.signature_fn(**kwargs)
        else:
            tensors = [tf.convert_to_tensor(x) for x in xs]
            out = self.fn(tensors[0] if len(tensors) == 1 else tensors)
        if isinstance(out, dict):
            if len(out) != 1:
                raise ConfigError(f"the model returns {len(out)} outputs {sorted(out)}; TFModel writes one column: "
                                  "export a model with a single output")
            out = next(iter(out.values()))
        elif isinstance(out, (list, tuple)):
            if len(out) != 1:
                raise ConfigError(f"the model returns {len(out)} outputs; TFModel writes one column: export a "
                                  "model with a single output")
            out = out[0]
        return out.numpy() if hasattr(out, "numpy") else out

    def predict(self, xs: list, names: list, batch_size: int):
        import numpy as np

        n = len(xs[0])
        stacked_names = names if len(xs) == len(names) else ["input"]
        parts = [np.asarray(self._call([x[i:i + batch_size] for x in xs], stacked_names))
                 for i in range(0, n, batch_size)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def batch_inputs(batch, feed_cols: list) -> list:
    """Arrow columns -> the model's numpy inputs: arrays (n, d); all-scalar columns stacked to (n, k)."""
    import numpy as np

    from tfos.feed.arrow_rows import column_to_numpy

    cols = []
    for name in feed_cols:
        j = batch.schema.get_field_index(name)
        cols.append(column_to_numpy(batch.column(j), batch.schema.field(j)))
    if all(c.ndim == 1 for c in cols):
        return [np.stack(cols, axis=1) if len(cols) > 1 else cols[0].reshape(-1, 1)]
    return [c.reshape(-1, 1) if c.ndim == 1 else c for c in cols]


def to_arrow_column(preds, n: int, arrow_type, mode: str):
    """Predictions for ``n`` rows -> one Arrow column of ``arrow_type`` (list types: one list per row)."""
    import numpy as np
    import pyarrow as pa

    if n == 0:
        return pa.array([], type=arrow_type)
    preds = np.asarray(preds)
    if preds.ndim == 0 or preds.shape[0] != n:
        raise TFOSError(f"the model returned {preds.shape[0] if preds.ndim else 'a scalar'} predictions for {n} "
                        "rows: it must keep the batch dimension first")
    flat = preds.reshape(n, -1)
    if mode == "argmax":
        if flat.shape[1] < 2:
            raise ConfigError("outputMode='argmax' needs several outputs per row (class scores), the model returns "
                              "one: use outputMode='raw'")
        flat = np.argmax(flat, axis=1).reshape(n, 1)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        width = flat.shape[1]
        values = pa.array(flat.reshape(-1).astype(arrow_type.value_type.to_pandas_dtype()))
        offsets = pa.array(np.arange(0, (n + 1) * width, width,
                                     dtype=np.int64 if pa.types.is_large_list(arrow_type) else np.int32))
        cls = pa.LargeListArray if pa.types.is_large_list(arrow_type) else pa.ListArray
        return cls.from_arrays(offsets, values).cast(arrow_type)
    if flat.shape[1] != 1:
        raise ConfigError(f"the model returns {flat.shape[1]} values per row but outputType is a scalar: use "
                          "outputType='array<float>', or outputMode='argmax' for class indices")
    return pa.array(flat.reshape(n).astype(arrow_type.to_pandas_dtype()))
