"""TFModel inference: the ``mapInArrow`` function and the per-process model cache.

Runs in the executors' Python workers (``predict_batches`` is the function TFModel.transform hands
to ``mapInArrow``). Imports neither pyspark.ml nor the driver modules of tfos.ml; TensorFlow, numpy
and pyarrow are imported when first used.
"""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import urlparse

from tfos.errors import ConfigError, TFOSError

logger = logging.getLogger(__name__)

_PREDICTORS: dict = {}
_PREDICTORS_LOCK = threading.Lock()


def predict_batches(batches, *, path, signature, input_names, feed_cols, keep_cols, out_col, arrow_type, mode,
                    batch_size):
    """Yield each Arrow batch's ``keep_cols`` plus ``out_col``: the predictions of the model at ``path``
    on its ``feed_cols`` (the model's inputs ``input_names``), ``batch_size`` rows per model call."""
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
    """A file:// URI as the local path TensorFlow reads; other paths and URIs as they are."""
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
        return _Predictor(_load_keras(local))
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
    return _Predictor(loaded)


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

    def __init__(self, model, signature_fn=None, keep=None):
        import tensorflow as tf

        self._keep = keep  # the loaded SavedModel owns the signature's variables
        self.signature_fn = signature_fn
        if model is not None:
            self.fn = tf.function(lambda x: model(x, training=False), reduce_retracing=True)

    def _call(self, xs: list, names: list):
        """One model call; ``names`` (one per array of ``xs``) match SavedModel signature inputs by name."""
        import tensorflow as tf

        if self.signature_fn is not None:
            specs = self.signature_fn.structured_input_signature[1]
            keys = list(specs)
            if len(keys) != len(xs):
                raise ConfigError(f"the SavedModel signature takes {len(keys)} inputs {keys}, but inputCols give "
                                  f"{len(xs)}; scalar input columns are stacked into one input")
            order = [names.index(k) for k in keys] if set(keys) == set(names) else range(len(keys))
            out = self.signature_fn(**{k: tf.cast(xs[i], specs[k].dtype) for k, i in zip(keys, order)})
        else:
            tensors = [tf.convert_to_tensor(x) for x in xs]
            out = self.fn(tensors[0] if len(tensors) == 1 else tensors)
        if isinstance(out, (dict, list, tuple)):
            if len(out) != 1:
                named = f" {sorted(out)}" if isinstance(out, dict) else ""
                raise ConfigError(f"the model returns {len(out)} outputs{named}; TFModel writes one column: export a "
                                  "model with a single output")
            out = next(iter(out.values())) if isinstance(out, dict) else out[0]
        return out.numpy() if hasattr(out, "numpy") else out

    def predict(self, xs: list, names: list, batch_size: int):
        """Predictions for the rows of ``xs`` (from batch_inputs), ``batch_size`` rows per model call.
        ``names`` are the input column names (several scalar columns stacked into one array: 'input')."""
        import numpy as np

        n = len(xs[0])
        names = names if len(xs) == len(names) else ["input"]
        parts = [np.asarray(self._call([x[i:i + batch_size] for x in xs], names)) for i in range(0, n, batch_size)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def batch_inputs(batch, feed_cols: list) -> list:
    """Arrow columns -> the model's numpy inputs: arrays (n, d); all-scalar columns stacked to (n, k)."""
    import numpy as np

    from tfos.wire.arrow import column_to_numpy

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
        large = pa.types.is_large_list(arrow_type)
        width = flat.shape[1]
        values = pa.array(flat.reshape(-1).astype(arrow_type.value_type.to_pandas_dtype()))
        offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int64 if large else np.int32))
        cls = pa.LargeListArray if large else pa.ListArray
        return cls.from_arrays(offsets, values).cast(arrow_type)
    if flat.shape[1] != 1:
        raise ConfigError(f"the model returns {flat.shape[1]} values per row but outputType is a scalar: use "
                          "outputType='array<float>', or outputMode='argmax' for class indices")
    return pa.array(flat.reshape(n).astype(arrow_type.to_pandas_dtype()))


# --------------------------------------------------------------------------- tfos.pipeline.TFModel

def get_signature(path: str, signature: str, tags=None):
    """The signature function of the SavedModel at ``path`` (loaded with ``tags``), once per process."""
    key = ("signature", path, signature, tuple(tags) if tags else None)
    with _PREDICTORS_LOCK:
        if key not in _PREDICTORS:
            import tensorflow as tf

            local = _local(path)
            if not tf.io.gfile.exists(os.path.join(local, "saved_model.pb")):
                raise ConfigError(f"export_dir {path!r} is not a SavedModel directory (no saved_model.pb) readable "
                                  "by this executor")
            logger.info("loading SavedModel %s (tags %s)", path, tags)
            loaded = tf.saved_model.load(local, tags=list(tags) if tags else None)
            if signature not in loaded.signatures:
                raise ConfigError(f"SavedModel {path!r} has no signature {signature!r} (it has "
                                  f"{sorted(loaded.signatures)}): set signature_def_key")
            _PREDICTORS[key] = (loaded, loaded.signatures[signature])
        return _PREDICTORS[key][1]


def signature_outputs(path: str, signature: str, tags=None) -> dict:
    """``{output name: (dtype name, rank)}`` of a SavedModel signature."""
    fn = get_signature(path, signature, tags)
    return {k: (spec.dtype.name, spec.shape.rank if spec.shape.rank is not None else 1)
            for k, spec in fn.structured_outputs.items()}


def predict_mapped(batches, *, path, signature, tags, inputs, outputs, batch_size, arrow_schema):
    """mapInArrow function of ``tfos.pipeline.TFModel``: the input columns (``inputs``: [(column,
    tensor)]) fed to the signature's tensors, ``batch_size`` rows per call; yields batches of the
    output columns (``outputs``: [(tensor, column)]) only, one row per input row."""
    import numpy as np
    import pyarrow as pa
    import tensorflow as tf

    from tfos.wire.arrow import column_to_numpy

    fn = get_signature(path, signature, tags)
    specs = fn.structured_input_signature[1]
    missing = [t for _, t in inputs if t not in specs]
    if missing:
        raise ConfigError(f"input_mapping names tensors {missing} that signature {signature!r} does not take "
                          f"(it takes {sorted(specs)})")
    for batch in batches:
        for start in range(0, batch.num_rows, batch_size):
            part = batch.slice(start, batch_size)
            n = part.num_rows
            feed = {}
            for col, tensor in inputs:
                j = part.schema.get_field_index(col)
                x = tf.constant(column_to_numpy(part.column(j), part.schema.field(j)), dtype=specs[tensor].dtype)
                want = specs[tensor].shape
                if want.rank is not None and (x.shape.rank != want.rank or not want.is_compatible_with(x.shape)):
                    x = tf.reshape(x, [n] + [d if d is not None else -1 for d in want.as_list()[1:]])
                feed[tensor] = x
            preds = fn(**feed)
            cols = []
            for (tensor, _), field in zip(outputs, arrow_schema):
                value = np.asarray(preds[tensor])
                if value.shape[:1] != (n,):
                    raise TFOSError(f"output {tensor!r} has {value.shape[:1]} rows for {n} input rows: the model "
                                    "must keep the batch dimension first")
                cols.append(pa.array(value.tolist(), type=field.type))
            yield pa.RecordBatch.from_arrays(cols, schema=arrow_schema)
