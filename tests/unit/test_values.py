"""A return value across a tfos channel without pickle (tfos.wire.values): what travels comes back
equal and typed; what cannot travel is refused on the node with the fix; malformed trees are
ProtocolError (the driver stores nothing)."""

import json
import math

import numpy as np
import pytest

from tfos.errors import ConfigError, ProtocolError
from tfos.wire import values


def roundtrip(v):
    return values.decode(json.loads(json.dumps(values.encode(v))))


@pytest.mark.parametrize("v", [None, True, False, 0, -7, 2 ** 63 - 1, 2 ** 70, -2 ** 80, 1.5, -0.0, "", "é∑",
                               b"", b"\x00\xff" * 9, [1, [2, (3, "x")]], (), {"a": 1, 2: [3.5], 1.5: None, True: b"k"},
                               1 + 2j, {"loss": [0.5, 0.25], "acc": 0.97, "steps": 168}])
def test_plain_values_come_back_equal_with_their_types(v):
    out = roundtrip(v)
    assert out == v and type(out) is type(v)
    if isinstance(v, dict):
        assert [type(k) for k in out] == [type(k) for k in v]


def test_special_floats():
    out = roundtrip([math.nan, math.inf, -math.inf])
    assert math.isnan(out[0]) and out[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize("a", [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([True, False]),
                               np.zeros((0, 5), np.int64), np.array(["ab", "c"]), np.array(3.5, np.float64),
                               np.arange(6, dtype=">i4").reshape(2, 3)[:, ::2], np.array([1 + 1j], np.complex64)])
def test_numpy_arrays_keep_dtype_shape_and_bytes(a):
    out = roundtrip(a)
    assert out.dtype == a.dtype and out.shape == a.shape and np.array_equal(out, a) and out.flags.writeable


def test_numpy_scalars_become_python_numbers():
    assert roundtrip([np.float32(0.5), np.int64(3), np.bool_(True)]) == [0.5, 3, True]
    out = roundtrip(np.longdouble(1.5))  # no Python equivalent: a 0-d array of its own dtype
    assert out.dtype == np.longdouble and out == 1.5


@pytest.mark.parametrize("v,fix", [(object(), "numbers, strings"), (np.array([object()]), "no object arrays"),
                                   ({(1, 2): 3}, "keys must be"), ({"m": type("Model", (), {"get_weights": 1})()},
                                                                   "get_weights"),
                                   (type("Tensor", (), {"numpy": 1})(), ".numpy()")])
def test_what_cannot_travel_is_refused_with_the_fix(v, fix):
    with pytest.raises(ConfigError, match=fix.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        values.encode(v)


def test_too_large_and_too_deep_are_refused():
    with pytest.raises(ConfigError, match="return its path"):
        values.encode(np.zeros(values.MAX_ENCODED // 2, np.uint8) .tobytes() * 2)
    with pytest.raises(ConfigError, match="return its path"):  # JSON's size, not the items': 8 bytes each counted
        values.encode([0.123456789012345] * 700_000)
    with pytest.raises(ConfigError, match="return its path"):  # escaped non-ASCII text
        values.encode("\u00e9" * 2_000_000)
    with pytest.raises(ConfigError, match="return its path"):
        values.encode(np.zeros((4096, 4096), np.float32))
    deep = []
    for _ in range(values.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested"):
        values.encode(deep)


@pytest.mark.parametrize("tree", [None, [], ["x", 1], ["i", "1"], ["i", True], ["b", 1], ["s", 3], ["y", "!!"],
                                  ["f", "1e3"], ["I", "12a"], ["l", "ab"], ["d", [[["l", []], ["n", None]]]],
                                  ["d", [["s", "k"]]], ["a", ["<f4", [2], "AAAA"]], ["a", ["|O", [1], "AAAAAAAAAAA="]],
                                  ["a", ["<f4", [-1], ""]], ["a", ["zz", [1], ""]], ["c", ["a", 1]],
                                  ["I", "\u00b2"], ["I", "--5"], ["a", ["<U0", [1], ""]], ["a", ["<f4", [1] * 40, "AAAAAA=="]]])
def test_malformed_trees_are_protocol_errors(tree):
    with pytest.raises(ProtocolError):
        values.decode(tree)
