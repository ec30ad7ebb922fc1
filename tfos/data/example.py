"""The ``tf.train.Example`` codec, on the ``protobuf`` library and without TensorFlow.

Runs in the Spark tasks of :func:`~tfos.data.save_as_tfrecords` (encoding) and
:func:`~tfos.data.load_tfrecords` (decoding), and wherever user code calls
:func:`encode_example` / :func:`decode_example`. TensorFlow is never imported.

TensorFlow's generated ``example_pb2`` is not available without TensorFlow (tensorboard does not
ship it either), so the message classes are built here from a descriptor with TF's package name
and field numbers (example.proto, feature.proto)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

The descriptor lives in a private ``DescriptorPool``, so it never clashes with TensorFlow's own
``tensorflow.Example`` in the default pool; the bytes are the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from tfos.errors import ConfigError, FeedError

KINDS = ("bytes", "float", "int64")
_KIND_FIELD = {"bytes": "bytes_list", "float": "float_list", "int64": "int64_list"}


def _example_class():
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="tfos/data/example.proto", package="tensorflow",
                                               syntax="proto3")

    def message(name, fields, into=proto.message_type):
        m = into.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".tensorflow." + type_name
            if ftype in (F.TYPE_FLOAT, F.TYPE_INT64) and label == F.LABEL_REPEATED:
                f.options.packed = True
        return m

    for name, ftype in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64)):
        message(name, [("value", 1, ftype, F.LABEL_REPEATED, None)])
    feature = message("Feature", [(field, number, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, field.title().replace("_", ""))
                                  for number, field in enumerate(("bytes_list", "float_list", "int64_list"), 1)])
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", [("feature", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Features.FeatureEntry")])
    entry = message("FeatureEntry", [("key", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, None),
                                     ("value", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, "Feature")],
                    into=features.nested_type)
    entry.options.map_entry = True
    message("Example", [("features", 1, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, "Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _example_class()


def _as_values(value) -> list | np.ndarray:
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return [value]
    if isinstance(value, np.ndarray):
        return value.reshape(-1)
    if hasattr(value, "toArray"):  # pyspark.ml / mllib vectors
        return np.asarray(value.toArray()).reshape(-1)
    if isinstance(value, (bool, int, float, np.generic)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ConfigError(f"cannot store a {type(value).__name__} in a tf.train.Example feature") from None


def _infer_kind(name: str, values) -> str:
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.dtype.kind in "biu":
            return "int64"
        if values.dtype.kind == "f":
            return "float"
        if values.dtype.kind in "SU":
            return "bytes"
    if len(values) == 0:
        raise ConfigError(f"feature {name!r} is empty, so its type cannot be inferred; pass "
                          f"kinds={{{name!r}: 'int64' | 'float' | 'bytes'}}")
    kinds = set()
    for v in values:
        if isinstance(v, (bool, int, np.integer, np.bool_)):
            kinds.add("int64")
        elif isinstance(v, (float, np.floating)):
            kinds.add("float")
        elif isinstance(v, (str, bytes, bytearray, memoryview, np.str_, np.bytes_)):
            kinds.add("bytes")
        else:
            raise ConfigError(f"feature {name!r} holds a {type(v).__name__}; features hold ints, floats, "
                              "str or bytes (or lists/arrays of one of them)")
    if kinds == {"int64", "float"}:
        return "float"
    if len(kinds) > 1:
        raise ConfigError(f"feature {name!r} mixes {sorted(kinds)}; a feature holds values of one kind")
    return kinds.pop()


def _float_values(name: str, values) -> list:
    try:
        return np.asarray(values, dtype=np.float32).reshape(-1).tolist()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"feature {name!r}: values are not floats ({e})") from None


def _int64_values(name: str, values) -> list:
    out = []
    for v in (values.tolist() if isinstance(values, np.ndarray) else values):
        if isinstance(v, float):
            if not v.is_integer():
                raise ConfigError(f"feature {name!r} is int64 but holds {v!r}; store it as 'float'")
        elif v is None:
            raise ConfigError(f"feature {name!r} holds a None inside a list; drop or fill nulls first")
        try:
            v = int(v)  # also bools and numpy integers
        except (TypeError, ValueError):
            raise ConfigError(f"feature {name!r} is int64 but holds {v!r}") from None
        if not -(1 << 63) <= v < (1 << 63):
            raise ConfigError(f"feature {name!r}: {v} does not fit in int64")
        out.append(v)
    return out


def _bytes_values(name: str, values) -> list:
    out = []
    for v in (values.tolist() if isinstance(values, np.ndarray) else values):
        if isinstance(v, str):
            v = v.encode("utf-8")
        elif isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        elif not isinstance(v, bytes):
            raise ConfigError(f"feature {name!r} is bytes but holds {v!r}")
        out.append(v)
    return out


_CONVERT = {"bytes": _bytes_values, "float": _float_values, "int64": _int64_values}


def _serialize_example(items) -> bytes:
    """``items``: iterable of ``(name, kind, values)``; a repeated name keeps its last values."""
    example = Example()
    example.features.SetInParent()
    feature_map = example.features.feature
    for name, kind, values in items:
        convert = _CONVERT.get(kind)
        if convert is None:
            raise ConfigError(f"feature {name!r}: unknown kind {kind!r}; use one of {KINDS}")
        feature = feature_map[name]
        feature.Clear()
        value_list = getattr(feature, _KIND_FIELD[kind])
        value_list.SetInParent()  # an empty list still says its kind
        value_list.value.extend(convert(name, values))
    return example.SerializeToString(deterministic=True)


def encode_example(features: Mapping, kinds: Mapping | None = None) -> bytes:
    """Serialize ``{name: value}`` as a ``tf.train.Example`` (bytes), without TensorFlow.

    Values are ints/bools (int64_list), floats (float_list, stored as float32), str/bytes
    (bytes_list; str is UTF-8 encoded), or lists, numpy arrays (flattened) and Spark ML vectors
    of one of these. ``None`` leaves the feature out. ``kinds`` maps names to ``'int64'``,
    ``'float'`` or ``'bytes'`` to force a kind (needed for empty lists). The result parses with
    ``tf.train.Example.FromString`` and ``tf.io.parse_single_example``.
    """
    kinds = kinds or {}
    items = []
    for name, value in features.items():
        if value is None:
            continue
        values = _as_values(value)
        kind = kinds.get(name) or _infer_kind(name, values)
        items.append((str(name), kind, values))
    return _serialize_example(items)


def decode_example(data) -> dict:
    """Parse a serialized ``tf.train.Example`` into ``{name: list of values}`` (sorted by name),
    without TensorFlow.

    int64 features give Python ints, float features Python floats (float32 precision), bytes
    features ``bytes`` (decode str yourself). Raises :class:`~tfos.errors.FeedError` for bytes that
    are not a tf.train.Example (check the files really hold tf.train.Example records).
    """
    try:
        example = Example.FromString(data)
    except DecodeError as e:
        raise FeedError(f"malformed tf.train.Example ({e}); check that the records really are "
                        "serialized tf.train.Example messages") from None
    features = example.features.feature
    out = {}
    for name in sorted(features):
        kind = features[name].WhichOneof("kind")
        out[name] = list(getattr(features[name], kind).value) if kind else []
    return out
