"""Spark ML pipeline API: ``TFEstimator`` trains on a tfos cluster, ``TFModel`` predicts with ``mapInArrow``.

Modules, by the process that runs them:

* driver: ``params`` (Params and their checks), ``estimator`` (TFEstimator.fit), ``model``
  (TFModel.transform plans the ``mapInArrow`` call), ``persistence`` (save / load);
* executors' Python workers: ``predictor`` (the ``mapInArrow`` function and the model cache).

This package imports its modules when a name is first used, so that importing
``tfos.ml.predictor`` in a worker does not import pyspark.ml or the driver modules. Importing
``tfos.ml`` does not import TensorFlow; the executor functions import it.

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

from tfos import lazy

_EXPORTS = {"TFEstimator": "estimator", "TFModel": "model", "OUTPUT_TYPES": "params", "OUTPUT_MODES": "params",
            "batch_inputs": "predictor", "clear_model_cache": "predictor", "get_predictor": "predictor",
            "to_arrow_column": "predictor"}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy.exports(__name__, globals(), {name: f"tfos.ml.{m}" for name, m in _EXPORTS.items()})
