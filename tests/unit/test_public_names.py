"""The public names of tfos's packages: every name a package loads lazily (tfos.lazy) is in its
``__all__`` and resolves, and the root's ``if TYPE_CHECKING:`` block imports exactly its lazy names
(so type checkers and IDEs resolve ``tfos.TFCluster`` without running the imports)."""

import ast
import importlib
import os

import pytest

import tfos

PACKAGES = ("tfos", "tfos.keras_dist", "tfos.data", "tfos.ml", "tfos.backends", "tfos.compat")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_lazy_name_is_public_and_resolves(name):
    module = importlib.import_module(name)
    lazy = module.__getattr__.table
    assert set(lazy) <= set(module.__all__), sorted(set(lazy) - set(module.__all__))
    assert len(module.__all__) == len(set(module.__all__))
    for public in module.__all__:
        assert getattr(module, public) is not None, public
    assert set(module.__all__) <= set(dir(module))


def test_the_roots_type_checking_block_names_its_lazy_table():
    with open(os.path.join(os.path.dirname(tfos.__file__), "__init__.py")) as f:
        tree = ast.parse(f.read())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    names = {a.asname or a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert names == set(tfos.__getattr__.table)
    # each comes from where the lazy table loads it
    for n in block.body:
        for a in n.names:
            where = tfos.__getattr__.table[a.name]
            assert where == (f"tfos.{a.name}" if n.module == "tfos" else n.module), (a.name, where, n.module)
