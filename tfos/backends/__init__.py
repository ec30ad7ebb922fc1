"""Training backends (plug-ins): ``mwms`` (ring all-reduce, the default), ``ps`` (parameter
servers), ``horovod`` (Horovod over Gloo), each with a driver half and a TF-process half (see
:mod:`tfos.backends.base`). ``backend=`` accepts a name, an import path
``"package.module:Class"``, a Backend subclass or an instance."""

from __future__ import annotations

import importlib

from tfos.backends.base import Backend, NodeHooks, rdma_devices, rdma_environment
from tfos import lazy
from tfos.errors import ConfigError

#: Built-in backends by name, as import paths (loaded on use: Horovod imports nothing until chosen).
BACKENDS = {"mwms": "tfos.backends.mwms:MWMSBackend", "ps": "tfos.backends.ps:PSBackend",
            "horovod": "tfos.backends.horovod:HorovodBackend"}


def load_backend_class(path: str) -> type:
    """The Backend class named by ``"package.module:Class"``."""
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"cannot load backend {path!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"{path!r} is not a tfos.backends.Backend subclass")
    return cls


#: Hook names of the single-class Backend of tfos <= 0.1 -> where that hook lives now.
_RENAMED = {"driver_setup": "Backend.setup", "driver_teardown": "Backend.teardown",
            "options": "Backend.node_options", "node_env": "NodeHooks.env", "run_node": "NodeHooks.run",
            "strategy": "NodeHooks.strategy"}


def _check_hooks(cls: type) -> None:
    """A Backend subclass still defining an old hook name would silently lose it: say where it goes."""
    old = [name for name in _RENAMED if any(name in vars(k) for k in cls.__mro__ if k is not Backend)]
    if old:
        raise ConfigError(f"{cls.__name__} defines {', '.join(old)}: backends now have a driver half (Backend) and a "
                          "node half (NodeHooks, named by Backend.node_class); move them to "
                          + ", ".join(_RENAMED[n] for n in old))


def make_backend(spec=None, transport: str = "grpc", **options) -> Backend:
    """A Backend from a name ('mwms' | 'ps' | 'horovod'), an import path, a class, an instance,
    or None ('mwms').

    The default runs main_fun on every node (as TensorFlowOnSpark did, ps nodes included);
    'ps' must be asked for explicitly, since it runs the servers itself and main_fun on the chief only.
    """
    if isinstance(spec, Backend):
        _check_hooks(type(spec))
        return spec
    if isinstance(spec, type) and issubclass(spec, Backend):
        cls = spec
    else:
        name = spec or "mwms"
        if not isinstance(name, str) or (name not in BACKENDS and ":" not in name):
            raise ConfigError(f"backend must be one of {sorted(BACKENDS)}, an import path 'module:Class', a "
                              f"Backend subclass or instance; got {spec!r}")
        cls = load_backend_class(BACKENDS.get(name, name))
    _check_hooks(cls)
    try:
        return cls(transport=transport, **options)
    except TypeError as e:
        raise ConfigError(f"bad option for backend {getattr(cls, 'name', cls.__name__)!r}: {e}") from None


__getattr__, __dir__ = lazy.exports(__name__, globals(), {
    "MWMSBackend": "tfos.backends.mwms", "PSBackend": "tfos.backends.ps", "HorovodBackend": "tfos.backends.horovod"})


__all__ = ["Backend", "NodeHooks", "BACKENDS", "make_backend", "load_backend_class", "rdma_devices",
           "rdma_environment", "MWMSBackend", "PSBackend", "HorovodBackend"]
