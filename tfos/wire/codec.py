"""The codec of the message registry (:mod:`tfos.wire.messages`): registered frozen dataclasses
to and from one JSON frame each, decoded with a check of every field against its annotation
(ints, floats, strings, bools, tuples, dicts with string keys, optional values, nested registered
types), so a malformed message is a :class:`~tfos.errors.ProtocolError`, never a half-built
object. Nothing is ever unpickled."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from tfos.errors import ProtocolError

PROTOCOL_VERSION = 5
_MAX_INT = 2 ** 63

_REGISTRY: dict[str, type] = {}
_REGISTERED: set[type] = set()  # _REGISTRY's classes, for a constant-time membership test
_FIELDS: dict[type, tuple] = {}  # class -> ((name, type, required), ...): what decoding checks, once per class
_NAMES: dict[type, tuple] = {}  # class -> its field names, for encoding
_SHAPES: dict = {}  # annotation -> (typing.get_origin, typing.get_args)


def message(cls):
    """Class decorator: a frozen dataclass in the registry (it can travel as a JSON frame)."""
    cls = dataclass(frozen=True)(cls)
    _REGISTRY[cls.__name__] = cls
    _REGISTERED.add(cls)
    return cls


# --------------------------------------------------------------------------- codec

def _to_wire(value):
    names = _NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: _to_wire(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_wire(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


class Encoded:
    """A message encoded once and sent many times as it is (the cluster spec, to every node):
    :func:`encode` returns its bytes without encoding it again."""

    __slots__ = ("payload",)

    def __init__(self, msg):
        self.payload = encode(msg)


def encode(msg) -> bytes:
    if type(msg) is Encoded:
        return msg.payload
    if _REGISTRY.get(type(msg).__name__) is not type(msg):
        raise ProtocolError(f"{type(msg).__name__} is not a tfos message")
    body = _to_wire(msg)
    body["type"] = type(msg).__name__
    body["v"] = PROTOCOL_VERSION
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode(data: bytes):
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"frame is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(body, dict):
        raise ProtocolError("frame is not a JSON object")
    if body.pop("v", None) != PROTOCOL_VERSION:
        raise ProtocolError(f"message version mismatch (this side speaks v{PROTOCOL_VERSION}); "
                            "install the same tfos version on the driver and the executors")
    name = body.pop("type", None)
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError("unknown message type")
    return _build(cls, body, cls.__name__)


def _fields(cls) -> tuple:
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = _FIELDS[cls] = tuple(
            (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls))
    return fields


def _build(cls, body, where: str):
    if not isinstance(body, dict):
        raise ProtocolError(f"{where}: expected an object")
    kwargs = {}
    for name, tp, required in _fields(cls):
        if name in body:
            kwargs[name] = _check(tp, body[name], f"{where}.{name}")
        elif required:
            raise ProtocolError(f"{where}: missing field {name!r}")
    return cls(**kwargs)


def _check(tp, value, where: str):
    """``value`` (decoded JSON) as type ``tp``, or ProtocolError."""
    if tp is Any:
        return value
    shape = _SHAPES.get(tp)
    if shape is None:
        shape = _SHAPES[tp] = (typing.get_origin(tp), typing.get_args(tp))
    origin, args = shape
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, where)
    if tp in _REGISTERED:
        return _build(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a str enum travels as its value
        try:
            return tp(value)
        except ValueError:
            raise ProtocolError(f"{where}: not a {tp.__name__}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if -_MAX_INT <= value < _MAX_INT:
                return value
            raise ProtocolError(f"{where}: integer out of range")
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is tuple or tp is tuple:
        if isinstance(value, list):
            if not args:
                return tuple(value)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
            if len(args) == len(value):
                return tuple(_check(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    elif origin is list or tp is list:
        if isinstance(value, list):
            return [_check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    elif origin is dict or tp is dict:
        if isinstance(value, dict):
            if not args:
                return value
            return {k: _check(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    else:
        raise ProtocolError(f"{where}: unsupported field type {tp!r}")
    raise ProtocolError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__}")
