"""TFEstimator: the Spark ML Estimator whose ``fit`` trains ``train_fn`` on a tfos cluster.

Runs on the driver: it checks the Params, runs ``TFCluster.run`` / ``train`` / ``shutdown`` and
returns a :class:`~tfos.ml.TFModel` of the model that ``train_fn`` saved.
"""

from __future__ import annotations

import argparse
import logging
import os
from urllib.parse import urlparse

from pyspark.ml import Estimator

from tfos import InputMode
from tfos.errors import ConfigError, TFOSError
from tfos.ml.model import TFModel
from tfos.ml.params import _TFEstimatorParams, check_location, input_arrays, require, set_params
from tfos.ml.persistence import TFReadWrite, hadoop_filesystem

logger = logging.getLogger(__name__)


class TFEstimator(Estimator, _TFEstimatorParams, TFReadWrite):
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

    # Saved metadata names the class by module (Pipeline.load imports it from there): keep the
    # public name "tfos.ml.TFEstimator" so saves stay loadable whatever module defines the class.
    __module__ = "tfos.ml"

    def __init__(self, train_fn=None, tf_args=None, **params):
        super().__init__()
        self.train_fn = train_fn
        self.tf_args = tf_args
        set_params(self, params)

    def setParams(self, **params) -> "TFEstimator":
        """Set several Params by name."""
        set_params(self, params)
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
        elif hasattr(base, "__dict__"):  # argparse.Namespace and the like
            values = dict(vars(base))
        else:
            raise ConfigError(f"tf_args must be a dict or an argparse.Namespace, got {type(base).__name__}")
        params = dict(export_dir=self.getOrDefault(self.exportDir) if self.isDefined(self.exportDir) else None,
                      batch_size=self.getBatchSize(), epochs=self.getEpochs(),
                      input_cols=list(self.getOrDefault(self.inputCols)) if self.isDefined(self.inputCols) else None,
                      label_col=self.getLabelCol() or None, num_executors=self.getNumExecutors(),
                      num_ps=self.getNumPS(), input_mode=self.getInputMode())
        overridden = sorted(k for k in params if k in values and values[k] != params[k])
        if overridden:
            logger.info("TFEstimator: Param values replace tf_args %s", overridden)
        values.update(params)
        return argparse.Namespace(**values)

    def _fit(self, dataset):
        from tfos import TFCluster

        if not callable(self.train_fn):
            raise ConfigError("TFEstimator has no train_fn: pass it as TFEstimator(train_fn, ...) or call "
                              "setTrainFn(fn) (estimators loaded without a saved train_fn need this)")
        export_dir = require(self, "exportDir", "set exportDir=<absolute path or URI> where train_fn saves the "
                                                "model on the chief (e.g. /shared/models/m.keras)")
        check_location(export_dir, "exportDir")
        input_cols = list(require(self, "inputCols", "set inputCols=[...] to the feature columns to feed"))
        mode = self.getInputMode()
        if self.getNumPS() >= self.getNumExecutors():
            raise ConfigError(f"numPS ({self.getNumPS()}) must be smaller than numExecutors "
                              f"({self.getNumExecutors()}): the chief and workers need slots too")
        data = None
        if mode == InputMode.SPARK:
            data = _select_inputs(dataset, input_cols + ([self.getLabelCol()] if self.getLabelCol() else []))
        args = self.train_args()
        before = _stat(dataset.sparkSession, export_dir)
        logger.info("TFEstimator: training on %d nodes (%d ps), %d epoch(s), export to %s",
                    self.getNumExecutors(), self.getNumPS(), self.getEpochs(), export_dir)
        options = {}
        if self.getBackend():
            options["backend"] = self.getBackend()
        if self.getEnv():
            options["env"] = self.getEnv()
        cluster = TFCluster.run(dataset.sparkSession, self.train_fn, args, self.getNumExecutors(),
                                self.getNumPS(), input_mode=mode, master_node=self.getMasterNode(),
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


def _select_inputs(df, cols: list):
    """df.select(cols), ml Vectors converted to array<float> (fed as fixed-length vectors)."""
    from pyspark.sql import functions as F

    return df.select(*[F.col(c) if expr is None else expr.alias(c) for c, expr in zip(cols, input_arrays(df, cols))])


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
            found = hadoop_filesystem(spark, path)
            if found is None:
                return None
            _hadoop, fs, p = found
            if not fs.exists(p):
                return (False, None)
            return (True, fs.getFileStatus(p).getModificationTime())
        except Exception as e:  # no Hadoop client on this driver: skip the check
            logger.debug("cannot check %s: %s", path, e)
    return None
