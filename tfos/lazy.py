"""The one lazy loader of tfos's public names (every process).

A package lists its public names and where each lives; ``__getattr__`` imports that module when a
name is first used and keeps the value, so importing the package stays light (no driver modules,
pyspark, TensorFlow or Keras until a name that needs them is touched)::

    __getattr__, __dir__ = lazy.exports(__name__, globals(), {"TFCluster": "tfos.api"})

A name maps to a module path (the attribute of the same name is taken from it), to
``"module:attribute"``, or to the submodule of that name itself (``"tfos.TFNode"`` for ``TFNode``).
"""

from __future__ import annotations

import importlib


def exports(package: str, namespace: dict, table: dict[str, str]):
    """``(__getattr__, __dir__)`` for the module ``package`` whose globals are ``namespace``."""

    def __getattr__(name):  # noqa: N807 (the module protocol's name)
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        if not attribute and module == f"{package}.{name}":  # the submodule itself
            value = importlib.import_module(module)
        else:
            value = getattr(importlib.import_module(module), attribute or name)
        namespace[name] = value
        return value

    def __dir__():  # noqa: N807
        return sorted(set(namespace) | set(table))

    __getattr__.table = dict(table)  # what is loaded lazily (tests: every such name is in __all__)
    return __getattr__, __dir__
