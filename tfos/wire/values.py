"""A function's return value as a typed tree that can cross a tfos channel without pickle.

``TFDistributor.run(fn)`` returns rank 0's ``fn(...)`` on the driver, as TorchDistributor does;
TorchDistributor pickles it, tfos does not unpickle anything that came over a network. What
crosses is a tree of tagged JSON values: ``None``, bools, ints, floats (NaN and infinities too),
strings, bytes, lists, tuples, dicts (string, int, float or bool keys), numpy arrays of plain
dtypes (numbers, bools, fixed-width strings) and numpy scalars. Anything else (a Keras model, a
tf.Tensor) is refused on the node with the advice to save it and return its path, or to return
``.numpy()`` / ``get_weights()``.

Each node of the tree is a two-item list ``[tag, payload]``; :func:`decode` checks every tag,
type and size and raises :class:`~tfos.errors.ProtocolError` for anything else.
"""

from __future__ import annotations

import base64
import json
import math
import re

from tfos.errors import ConfigError, ProtocolError

#: Bound on an encoded value (a control frame carries at most 16 MiB of JSON).
MAX_ENCODED = 8 * 1024 * 1024
MAX_DEPTH = 64
_KEY_TYPES = (str, int, float, bool)
_DTYPE_KINDS = "biufcSU"  # bool, ints, uints, floats, complex, bytes, unicode: no objects, no records


def encode(value, what: str = "the return value"):
    """``value`` as a tree of tagged JSON values; ConfigError naming the first part that cannot
    travel (and what to return instead)."""
    size = [0]
    tree = _enc(value, what, 0, size)  # size: a running estimate that stops large arrays before base64
    encoded = len(json.dumps(tree, separators=(",", ":"))) if size[0] <= MAX_ENCODED else size[0]
    if encoded > MAX_ENCODED:
        raise ConfigError(f"{what} is {encoded / 2**20:.1f} MiB encoded, more than the {MAX_ENCODED >> 20} MiB "
                          "the driver accepts: save it to storage the driver reads and return its path")
    return tree


def _refuse(value, where: str):
    hint = ("save the model (model.save(path) / tf.saved_model.save) and return the path, or return "
            "model.get_weights()" if hasattr(value, "get_weights") or hasattr(value, "save") else
            "return .numpy() of a tensor" if hasattr(value, "numpy") else
            "return numbers, strings, bytes, numpy arrays, or lists/tuples/dicts of them")
    raise ConfigError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which tfos does not "
                      f"send to the driver (no pickle crosses its channels): {hint}")


def _enc(v, where: str, depth: int, size: list):
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    size[0] += 8
    if v is None:
        return ["n", None]
    if isinstance(v, bool):
        return ["b", v]
    if isinstance(v, int):
        if not -2 ** 63 <= v < 2 ** 63:
            return ["I", str(v)]  # beyond the codec's ints: as decimal text
        return ["i", v]
    if isinstance(v, float):
        return ["f", v if math.isfinite(v) else repr(v)]
    if isinstance(v, complex):
        return ["c", [_enc(v.real, where, depth, size)[1], _enc(v.imag, where, depth, size)[1]]]
    if isinstance(v, str):
        size[0] += len(v)
        return ["s", v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        data = bytes(v)
        size[0] += len(data) * 4 // 3
        if size[0] > MAX_ENCODED:
            return ["y", ""]  # too large: encode() refuses it without encoding it
        return ["y", base64.b64encode(data).decode("ascii")]
    if isinstance(v, (list, tuple)):
        items = [_enc(x, f"{where}[{i}]", depth + 1, size) for i, x in enumerate(v)]
        return ["l" if isinstance(v, list) else "t", items]
    if isinstance(v, dict):
        pairs = []
        for k, x in v.items():
            if not isinstance(k, _KEY_TYPES):
                raise ConfigError(f"{where} has a key of type {type(k).__name__}: keys must be strings, numbers or bools")
            pairs.append([_enc(k, f"{where} key", depth + 1, size), _enc(x, f"{where}[{k!r}]", depth + 1, size)])
        return ["d", pairs]
    np = _numpy(v)
    if np is not None:
        if isinstance(v, np.generic):
            item = v.item()
            if isinstance(item, np.generic):  # no Python equivalent (longdouble): as a 0-d array
                return _enc(np.asarray(v), where, depth, size)
            return _enc(item, where, depth, size)
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in _DTYPE_KINDS:
                raise ConfigError(f"{where} is a numpy array of dtype {v.dtype}: only plain numbers, bools and "
                                  "fixed-width strings travel (no object arrays)")
            size[0] += v.nbytes * 4 // 3
            if size[0] > MAX_ENCODED:
                return ["a", ["|u1", [0], ""]]  # too large: encode() refuses it without encoding it
            data = np.ascontiguousarray(v).tobytes()
            return ["a", [v.dtype.str, list(v.shape), base64.b64encode(data).decode("ascii")]]
    _refuse(v, where)


def _numpy(v):
    if type(v).__module__.split(".")[0] != "numpy":
        return None
    import numpy

    return numpy


def decode(tree, depth: int = 0):
    """The value :func:`encode` made ``tree`` from; ProtocolError for anything else."""
    if depth > MAX_DEPTH + 2:
        raise ProtocolError("value: nested too deep")
    if not (isinstance(tree, list) and len(tree) == 2 and isinstance(tree[0], str)):
        raise ProtocolError("value: expected a [tag, payload] pair")
    tag, p = tree
    if tag == "n" and p is None:
        return None
    if tag == "b" and isinstance(p, bool):
        return p
    if tag == "i" and isinstance(p, int) and not isinstance(p, bool):
        return p
    if tag == "I" and isinstance(p, str) and len(p) < 4300 and re.fullmatch(r"-?[0-9]+", p):
        return int(p)
    if tag == "f":
        if isinstance(p, (int, float)) and not isinstance(p, bool):
            return float(p)
        if p in ("nan", "inf", "-inf"):
            return float(p)
    if tag == "s" and isinstance(p, str):
        return p
    if tag == "y" and isinstance(p, str):
        return _b64(p)
    if tag == "c" and isinstance(p, list) and len(p) == 2:
        return complex(decode(["f", p[0]], depth + 1), decode(["f", p[1]], depth + 1))
    if tag in ("l", "t") and isinstance(p, list):
        items = [decode(x, depth + 1) for x in p]
        return items if tag == "l" else tuple(items)
    if tag == "d" and isinstance(p, list):
        out = {}
        for pair in p:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ProtocolError("value: a dict item is not a [key, value] pair")
            k = decode(pair[0], depth + 1)
            if not isinstance(k, _KEY_TYPES):
                raise ProtocolError("value: a dict key is not a string, number or bool")
            out[k] = decode(pair[1], depth + 1)
        return out
    if tag == "a" and isinstance(p, list) and len(p) == 3:
        return _array(*p)
    raise ProtocolError(f"value: malformed {tag[:8]!r} item")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ProtocolError("value: bad base64") from None


def _array(dtype, shape, data):
    import numpy as np

    if not (isinstance(dtype, str) and len(dtype) < 16 and isinstance(shape, list) and len(shape) <= 32
            and isinstance(data, str)
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2 ** 40 for d in shape)):
        raise ProtocolError("value: malformed array")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ProtocolError("value: unknown array dtype") from None
    if dt.kind not in _DTYPE_KINDS or dt.itemsize == 0:
        raise ProtocolError("value: array dtype not allowed")
    raw = _b64(data)
    if len(raw) != math.prod(shape) * dt.itemsize:
        raise ProtocolError("value: array data does not match its shape")
    try:
        return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    except ValueError:
        raise ProtocolError("value: array data does not match its shape") from None
