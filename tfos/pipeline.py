"""TensorFlowOnSpark's ``pipeline`` module (Spark ML ``TFEstimator`` / ``TFModel``), on tfos.

The parameter names, defaults, setters/getters and behaviour of ``tensorflowonspark.pipeline``
for programs that migrate by renaming the package (``from tfos.pipeline import TFEstimator``).
New programs can use :mod:`tfos.ml`, whose Params follow Spark ML's camelCase conventions.

* ``TFEstimator(train_fn, tf_args).setInputMapping({col: tensor}).setClusterSize(n)...fit(df)``
  runs ``TFCluster.run(sc, train_fn, args, cluster_size, num_ps, tensorboard, InputMode.SPARK)``,
  feeds ``df.select(sorted(input_mapping))`` for ``epochs`` epochs (as a DataFrame: Arrow
  batches, no per-row pickling) and shuts the cluster down; ``train_fn`` gets ``tf_args`` merged
  with the Params (``args.input_mapping``, ``args.batch_size``, ``args.export_dir``, ...), or the
  ``argv`` list when ``tf_args`` was one. It returns a ``TFModel`` with the same args and Params.
* ``TFModel(tf_args).setInputMapping({col: tensor}).setOutputMapping({tensor: col})
  .setExportDir(dir).transform(df)`` loads the SavedModel once per Python worker (tfos.ml's
  model cache) and returns a DataFrame of the output columns only, one row per input row. The
  output column types follow the signature: float -> double, int -> bigint, bool -> boolean,
  string -> binary, one array level per dimension after the batch dimension.
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging

from pyspark.ml.param.shared import Param, Params, TypeConverters
from pyspark.ml.pipeline import Estimator, Model

from tfos.errors import ConfigError
from tfos.topology import InputMode

logger = logging.getLogger(__name__)

__all__ = ["TFEstimator", "TFModel", "TFParams", "TFTypeConverters", "Namespace", "yield_batch",
           "single_node_env"]


class TFTypeConverters:
    """A Param type converter for dicts (Spark core has none)."""

    @staticmethod
    def toDict(value):  # noqa: N802 (TensorFlowOnSpark's name)
        if isinstance(value, dict):
            return value
        raise TypeError(f"Could not convert {value!r} to dict")


def _param(name: str, doc: str, converter):
    return Param(Params._dummy(), name, doc, typeConverter=converter)


def _has(cls_name: str, name: str, doc: str, converter, accessor: str):
    """A mix-in class with one Param and its setX/getX accessors (TensorFlowOnSpark's Has* classes)."""
    param = _param(name, doc, converter)

    def setter(self, value):
        return self._set(**{name: value})

    def getter(self):
        return self.getOrDefault(getattr(self, name))

    return type(cls_name, (Params,), {name: param, f"set{accessor}": setter, f"get{accessor}": getter})


HasBatchSize = _has("HasBatchSize", "batch_size", "Number of records per batch", TypeConverters.toInt, "BatchSize")
HasClusterSize = _has("HasClusterSize", "cluster_size", "Number of nodes in the cluster", TypeConverters.toInt,
                      "ClusterSize")
HasEpochs = _has("HasEpochs", "epochs", "Number of epochs to train", TypeConverters.toInt, "Epochs")
HasGraceSecs = _has("HasGraceSecs", "grace_secs", "Seconds ps/evaluator nodes get to exit after training",
                    TypeConverters.toInt, "GraceSecs")
HasInputMapping = _has("HasInputMapping", "input_mapping", "Mapping of input DataFrame column to input tensor",
                       TFTypeConverters.toDict, "InputMapping")
HasMasterNode = _has("HasMasterNode", "master_node", "Job name of master/chief worker node",
                     TypeConverters.toString, "MasterNode")
HasModelDir = _has("HasModelDir", "model_dir", "Path to save/load model checkpoints", TypeConverters.toString,
                   "ModelDir")
HasOutputMapping = _has("HasOutputMapping", "output_mapping", "Mapping of output tensor to output DataFrame column",
                        TFTypeConverters.toDict, "OutputMapping")
HasProtocol = _has("HasProtocol", "protocol", "Network protocol for TensorFlow (grpc)", TypeConverters.toString,
                   "Protocol")
HasReaders = _has("HasReaders", "readers", "Number of reader/enqueue threads", TypeConverters.toInt, "Readers")
HasSteps = _has("HasSteps", "steps", "Maximum number of steps to train", TypeConverters.toInt, "Steps")
HasTensorboard = _has("HasTensorboard", "tensorboard", "Launch tensorboard process", TypeConverters.toBoolean,
                      "Tensorboard")
HasTFRecordDir = _has("HasTFRecordDir", "tfrecord_dir", "Path to export a DataFrame as TFRecords",
                      TypeConverters.toString, "TFRecordDir")
HasExportDir = _has("HasExportDir", "export_dir", "Directory to export saved_model", TypeConverters.toString,
                    "ExportDir")
HasSignatureDefKey = _has("HasSignatureDefKey", "signature_def_key", "Identifier for a saved_model signature",
                          TypeConverters.toString, "SignatureDefKey")
HasTagSet = _has("HasTagSet", "tag_set", "Comma-delimited list of tags identifying a saved_model metagraph",
                 TypeConverters.toString, "TagSet")


class HasNumPS(Params):
    num_ps = _param("num_ps", "Number of PS nodes in cluster", TypeConverters.toInt)
    driver_ps_nodes = _param("driver_ps_nodes", "Run PS nodes on driver locally", TypeConverters.toBoolean)

    def setNumPS(self, value):  # noqa: N802
        return self._set(num_ps=value)

    def getNumPS(self):  # noqa: N802
        return self.getOrDefault(self.num_ps)

    def setDriverPSNodes(self, value):  # noqa: N802
        return self._set(driver_ps_nodes=value)

    def getDriverPSNodes(self):  # noqa: N802
        return self.getOrDefault(self.driver_ps_nodes)


class HasInputMode(Params):
    input_mode = _param("input_mode", "Input data feeding mode (0=TENSORFLOW, 1=SPARK)", TypeConverters.toInt)

    def setInputMode(self, value):  # noqa: N802
        if value == InputMode.TENSORFLOW:
            raise ConfigError("TFEstimator feeds the DataFrame: InputMode.TENSORFLOW is not supported here "
                              "(as in TensorFlowOnSpark); read files in train_fn with tfos.data instead")
        return self._set(input_mode=int(value))

    def getInputMode(self):  # noqa: N802
        return self.getOrDefault(self.input_mode)


class Namespace:
    """A dict, argparse.Namespace or argv list as an object with attributes (argv: ``.argv``)."""

    argv = None

    def __init__(self, d):
        if isinstance(d, list):
            self.argv = d
        elif isinstance(d, dict):
            self.__dict__.update(d)
        elif isinstance(d, (argparse.Namespace, Namespace)):
            self.__dict__.update(vars(d))
        else:
            raise ConfigError(f"Unsupported Namespace args: {d!r} (give a dict, argparse.Namespace or argv list)")

    def __iter__(self):
        yield from (self.argv if self.argv else list(self.__dict__))

    def __contains__(self, key):
        return key in self.argv if self.argv else key in self.__dict__

    def __repr__(self):
        if self.argv:
            return repr(self.argv)
        return f"Namespace({', '.join(f'{k}={self.__dict__[k]!r}' for k in sorted(self.__dict__))})"

    def __eq__(self, other):
        if self.argv:
            return self.argv == other
        return isinstance(other, (Namespace, argparse.Namespace)) and self.__dict__ == vars(other)

    __hash__ = None


class TFParams(Params):
    """Keeps the namespace-style ``args`` and merges the Spark ML Params into a copy of them."""

    args = None

    def merge_args_params(self):
        local_args = copy.copy(self.args)
        args_dict = vars(local_args)
        for p in self.params:
            args_dict[p.name] = self.getOrDefault(p.name)
        return local_args


class TFEstimator(Estimator, TFParams, HasInputMapping, HasClusterSize, HasNumPS, HasInputMode, HasMasterNode,
                  HasProtocol, HasGraceSecs, HasTensorboard, HasModelDir, HasExportDir, HasTFRecordDir,
                  HasBatchSize, HasEpochs, HasReaders, HasSteps):
    """Spark ML Estimator that trains ``train_fn`` on a tfos cluster (see the module docstring).

    ``export_fn`` (TF 1.x only in TensorFlowOnSpark) is refused: export from ``train_fn``, e.g.
    with :func:`tfos.compat.export_saved_model`.
    """

    train_fn = None
    export_fn = None

    def __init__(self, train_fn, tf_args, export_fn=None):
        super().__init__()
        if export_fn is not None:
            raise ConfigError("export_fn is a TF 1.x feature (TensorFlowOnSpark refused it on TF 2 too): export the "
                              "model from train_fn with tfos.compat.export_saved_model(model, args.export_dir, "
                              "ctx.job_name == 'chief')")
        self.train_fn = train_fn
        self.args = Namespace(tf_args)
        self._setDefault(input_mapping={}, cluster_size=1, num_ps=0, driver_ps_nodes=False,
                         input_mode=int(InputMode.SPARK), master_node="chief", protocol="grpc", tensorboard=False,
                         model_dir=None, export_dir=None, tfrecord_dir=None, batch_size=100, epochs=1, readers=1,
                         steps=1000, grace_secs=30)

    def _fit(self, dataset):
        from tfos.api import TFCluster

        local_args = self.merge_args_params()
        logger.info("TFEstimator args + params: %s", local_args)
        input_cols = sorted(self.getInputMapping())
        if not input_cols:
            raise ConfigError("TFEstimator needs setInputMapping({column: tensor_name}) to know which columns to feed")
        tf_args = self.args.argv if self.args.argv else local_args
        cluster = TFCluster.run(dataset.sparkSession, self.train_fn, tf_args, local_args.cluster_size,
                                local_args.num_ps, local_args.tensorboard, InputMode.SPARK,
                                master_node=local_args.master_node, driver_ps_nodes=local_args.driver_ps_nodes)
        try:
            cluster.train(dataset.select(input_cols), local_args.epochs)
        except BaseException:
            try:  # the training error is the one to raise; shutdown's would only repeat or hide it
                cluster.shutdown(grace_secs=self.getGraceSecs())
            except Exception as e:
                logger.info("shutdown after the failed training: %s", e)
            raise
        cluster.shutdown(grace_secs=self.getGraceSecs())
        return self._copyValues(TFModel(self.args))


class TFModel(Model, TFParams, HasInputMapping, HasOutputMapping, HasBatchSize, HasModelDir, HasExportDir,
              HasSignatureDefKey, HasTagSet):
    """Spark ML Model that predicts with the SavedModel at ``export_dir`` (see the module docstring)."""

    def __init__(self, tf_args):
        super().__init__()
        self.args = Namespace(tf_args)
        self._setDefault(input_mapping={}, output_mapping={}, batch_size=100, model_dir=None, export_dir=None,
                         signature_def_key=None, tag_set=None)

    def _transform(self, dataset):
        from tfos.ml.params import check_location

        args = self.merge_args_params()
        if not args.export_dir:
            raise ConfigError("TFModel needs setExportDir(...) (a SavedModel directory; TF 1.x checkpoints in "
                              "model_dir are not supported)")
        check_location(args.export_dir, "export_dir")
        if not isinstance(args.batch_size, int) or args.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int (setBatchSize), got {args.batch_size!r}")
        inputs = sorted(args.input_mapping.items())        # (column, tensor), by column
        outputs = sorted(args.output_mapping.items())      # (tensor, column), by tensor
        if not inputs or not outputs:
            raise ConfigError("TFModel needs setInputMapping({column: tensor}) and setOutputMapping({tensor: column})")
        signature = args.signature_def_key or "serving_default"
        tags = args.tag_set.split(",") if args.tag_set else None
        spark = dataset.sparkSession
        described = spark.sparkContext.parallelize([0], 1).map(
            functools.partial(_describe_outputs, args.export_dir, signature, tags)).collect()[0]
        schema = _output_schema(described, outputs)
        from pyspark.sql.pandas.types import to_arrow_schema

        from tfos.ml.predictor import predict_mapped

        fn = functools.partial(predict_mapped, path=args.export_dir, signature=signature, tags=tags,
                               inputs=inputs, outputs=outputs, batch_size=args.batch_size,
                               arrow_schema=to_arrow_schema(schema))
        return dataset.select([c for c, _ in inputs]).mapInArrow(fn, schema)


def _describe_outputs(path, signature, tags, _):
    """Spark task: ``{tensor: (dtype name, rank)}`` of the signature's outputs."""
    from tfos.ml.predictor import signature_outputs

    return signature_outputs(path, signature, tags)


def _output_schema(described: dict, outputs):
    from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DoubleType, LongType, StructField,
                                   StructType)

    fields = []
    for tensor, col in outputs:
        if tensor not in described:
            raise ConfigError(f"output_mapping names tensor {tensor!r}, but the signature's outputs are "
                              f"{sorted(described)}")
        dtype, rank = described[tensor]
        base = (BooleanType() if dtype == "bool" else BinaryType() if dtype == "string"
                else LongType() if "int" in dtype else DoubleType())
        for _ in range(max(rank - 1, 0)):
            base = ArrayType(base, True)
        fields.append(StructField(col, base, True))
    return StructType(fields)


def yield_batch(iterable, batch_size: int, num_tensors: int = 1):
    """Group rows into ``num_tensors`` lists of up to ``batch_size`` values each."""
    tensors = [[] for _ in range(num_tensors)]
    for item in iterable:
        if item is None:
            break
        for i in range(num_tensors):
            tensors[i].append(str(item[i]) if isinstance(item[i], bytearray) else item[i])
        if len(tensors[0]) >= batch_size:
            yield tensors
            tensors = [[] for _ in range(num_tensors)]
    if tensors[0]:
        yield tensors


def single_node_env(args) -> None:
    """Prepare this process for single-node TensorFlow, as TensorFlowOnSpark did: ``sys.argv``
    from an argv list, and GPUs (``args.num_gpus`` of them, else one if the host has any; claimed
    for this process, so calling it again per partition picks the same ones)."""
    import os
    import sys

    from tfos.host.gpus import gpu_environment, gpus_present, pick_gpus
    from tfos.cluster.executor.instance import requested_gpus

    argv = args if isinstance(args, list) else getattr(args, "argv", None)
    if argv:
        sys.argv = list(argv)
    num_gpus = requested_gpus({} if isinstance(args, list) else args, gpus_present())
    os.environ.update(gpu_environment(pick_gpus(num_gpus, ())))
