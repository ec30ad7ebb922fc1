"""The package's layering, checked over every module of ``tfos`` (imports at module level and
inside functions alike, read with ``ast``; nothing is imported to check it).

``RULES`` is the one table: a module prefix (the longest match wins) -> the prefixes its modules
may import. Capability first (``cluster``, ``feed``), then the process that runs the code
(``driver``, ``executor``, ``agent``, ``node``); ``BASE`` is the shared layer every process may
import. On top of the table, nothing reachable from a process that is not the driver (the agent,
the TF process, the Spark tasks) may reach a driver module, however indirectly.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tfos")

#: The shared layer: messages, channels and Arrow frames, roles, errors, host-local state, paths,
#: the node tunnel, the one lazy loader.
BASE = ("tfos.errors", "tfos.topology", "tfos.wire", "tfos.host", "tfos.data.paths", "tfos.data.fs",
        "tfos.data.hadoop_conf", "tfos.tunnel", "tfos.lazy")
DATA = BASE + ("tfos.data",)
TF_PROCESS = DATA + ("tfos.cluster.node", "tfos.feed.node")
TF_HELPERS = TF_PROCESS + ("tfos.tf", "tfos.keras_dist", "tfos.distribute", "tfos.callbacks")
DRIVER = DATA + ("tfos.backends", "tfos.cluster", "tfos.feed")  # the driver builds what the tasks run
#: The driver's facade and what is built on it (TFCluster, TFDistributor, Spark ML, the commands).
FACADE = DRIVER + ("tfos.api",)

RULES: dict[str, tuple[str, ...]] = {
    "tfos.errors": (),
    "tfos.lazy": (),
    "tfos.topology": ("tfos.errors",),
    # the wire stays below tfos.host but for its Deadline (which imports nothing of tfos)
    "tfos.wire": ("tfos.errors", "tfos.topology", "tfos.wire", "tfos.host.deadline"),
    "tfos.host": ("tfos.errors", "tfos.host"),
    "tfos.tunnel": ("tfos.errors", "tfos.wire", "tfos.host", "tfos.tunnel"),  # the node tunnel (agent, TF process)
    "tfos.data": DATA,
    "tfos.data.hadoop_conf": (),  # below fs and hdfs, which both read it
    "tfos.backends": BASE + ("tfos.backends", "tfos.tf", "tfos.distribute"),  # node hooks use the TF helpers
    # processes that are not the driver
    "tfos.cluster.agent": BASE + ("tfos.cluster.agent",),
    "tfos.cluster.executor": DATA + ("tfos.cluster.executor",),
    "tfos.feed.executor": DATA + ("tfos.feed.executor",),
    "tfos.feed.node": DATA + ("tfos.feed.node",),
    "tfos.cluster.node": TF_PROCESS + ("tfos.backends",),
    # helpers for main_fun, above the runtime: the public modules at their documented names and their parts
    "tfos.tf": TF_HELPERS,
    "tfos.keras_dist": TF_HELPERS,
    "tfos.distribute": TF_HELPERS,
    "tfos.callbacks": TF_HELPERS,
    # the driver: the cluster below the feed (the feed's jobs and scheduler read the registry), the
    # facade above both
    "tfos.cluster.driver": DATA + ("tfos.backends", "tfos.cluster"),
    "tfos.feed.driver": DRIVER,
    "tfos.api": DRIVER,
    "tfos.distributor": FACADE,
    "tfos.ml": FACADE + ("tfos.ml", "tfos.InputMode", "tfos.TFCluster"),
    "tfos.run": FACADE,
    "tfos.cli": FACADE + ("tfos.run", "tfos.testing"),  # the tfos command (its builds run as children)
    "tfos.testing": DRIVER + ("tfos.testing",),
    # the package root (its public names are re-exported lazily, by name)
    "tfos": ("tfos.errors", "tfos.topology", "tfos.host.versions", "tfos.lazy"),
    # the migration names, each a module of its own (docs/migration.md §5): TensorFlowOnSpark's
    # pipeline and dfutil hold their code; TFNode its functions; TFManager, TFParallel and compat
    # import what they name
    "tfos.pipeline": FACADE + ("tfos.ml",),
    "tfos.dfutil": DATA,
    "tfos.TFNode": TF_PROCESS,
    "tfos.TFManager": ("tfos.feed.node.manager",),
    "tfos.TFParallel": ("tfos.cluster.driver.tfparallel",),
    "tfos.compat": ("tfos.TFNode", "tfos.tf.compat", "tfos.lazy", "tfos.distributor"),
}
#: Modules that run outside the driver: nothing they import, directly or not, may be a driver module.
NOT_DRIVER = ("tfos.cluster.agent", "tfos.cluster.executor", "tfos.cluster.node", "tfos.feed.executor",
              "tfos.feed.node", "tfos.tf", "tfos.keras_dist", "tfos.distribute", "tfos.callbacks", "tfos.TFNode",
              "tfos.ml.predictor")
DRIVER_MODULES = ("tfos.cluster.driver", "tfos.feed.driver", "tfos.api", "tfos.distributor")
#: The packages whose import graph must have no circle (capability first, then the process).
PACKAGES = ("tfos.cluster.driver", "tfos.cluster.executor", "tfos.cluster.agent", "tfos.cluster.node",
            "tfos.feed.driver", "tfos.feed.executor", "tfos.feed.node", "tfos.data", "tfos.wire", "tfos.host",
            "tfos.tunnel", "tfos.backends", "tfos.tf", "tfos.ml", "tfos.api", "tfos.distributor")



def rule_for(module: str) -> tuple[str, tuple[str, ...]]:
    """The longest prefix of ``RULES`` that ``module`` falls under, with its allowed imports."""
    best = max((p for p in RULES if module == p or module.startswith(p + ".")), key=len)
    return best, RULES[best]


def allowed(module: str, imported: str) -> bool:
    _, may = rule_for(module)
    return any(imported == p or imported.startswith(p + ".") for p in may + (module,))


def module_imports(path: str, module: str) -> list[tuple[str, int]]:
    """``(imported tfos module, line)`` for every import in the file, wherever it stands."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for node in _runnable(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "tfos"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "tfos":
                continue
            for a in node.names:  # `from tfos.x import y`: y is a module or a name in tfos.x
                name = f"{base}.{a.name}"  # the root's lazy names count as what they are: tfos.TFCluster
                found.append((name if _is_module(name) or base == "tfos" else base, node.lineno))
    return found


def _runnable(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for type checkers only,
    never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", None)) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _is_module(name: str) -> bool:
    rel = os.path.join(os.path.dirname(ROOT), *name.split("."))
    return os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py"))


def all_modules(root: str = ROOT) -> dict[str, str]:
    """Every module of the package under ``root``: dotted name -> file."""
    mods = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                mods[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def violations(root: str = ROOT) -> list[str]:
    """Every import that breaks the table, and every driver module reachable from a non-driver one."""
    mods = all_modules(root)
    graph = {m: module_imports(p, m) for m, p in mods.items()}
    bad = [f"{m}:{line} imports {imp} (allowed: {', '.join(rule_for(m)[1]) or 'nothing of tfos'})"
           for m, imps in sorted(graph.items()) for imp, line in imps if not allowed(m, imp)]
    for start in sorted(m for m in mods if m.startswith(NOT_DRIVER)):
        seen, todo, parent = {start}, [start], {}
        while todo:
            m = todo.pop()
            for imp, _ in graph.get(m, ()):
                target = imp if imp in graph else imp.rpartition(".")[0]
                if target in graph and target not in seen:
                    seen.add(target)
                    parent[target] = m
                    todo.append(target)
        for hit in sorted(m for m in seen if m.startswith(DRIVER_MODULES)):
            chain, m = [hit], hit
            while m in parent:
                m = parent[m]
                chain.append(m)
            bad.append(f"{start} reaches the driver: {' -> '.join(reversed(chain))}")
    return bad


def copy_with_import(tmp_path, module_file: str, line: str) -> str:
    """A copy of the package in which ``module_file`` also makes the import ``line`` (in a function)."""
    import shutil

    copy = tmp_path / "tfos"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module_file
    target.write_text(target.read_text() + f"\n\ndef _oops():\n    {line}\n")
    return str(copy)


def test_every_module_has_a_rule():
    assert all(rule_for(m) for m in all_modules())


def test_the_import_rules_hold():
    assert violations() == []


@pytest.mark.parametrize("module,imported,ok", [
    ("tfos.cluster.node.context", "tfos.feed.node.datafeed", True),
    ("tfos.cluster.node.context", "tfos.cluster.driver.registry", False),  # a TF process importing the driver
    ("tfos.cluster.agent.node_agent", "tfos.cluster.node.runtime", False),  # the agent never loads the TF runtime
    ("tfos.feed.node.datafeed", "tfos.keras_dist", False),  # the runtime below the main_fun helpers
    ("tfos.tf.compat", "tfos.feed.node.datafeed", True),
    ("tfos.dfutil", "tfos.cluster.driver.spark", False),  # data is shared: no upward import
    ("tfos.wire.messages", "tfos.data.uneven", False),
    ("tfos.cluster.driver.service", "tfos.feed.driver.scheduler", False),  # the cluster below the feed
    ("tfos.data.readers", "tfos.feed.node.datafeed", False),  # data below the feed
    ("tfos.feed.driver.jobs", "tfos.feed.executor.producer", True),  # the driver ships the feeding task
    ("tfos.pipeline", "tfos.api", True),
])
def test_rule_table(module, imported, ok):
    assert allowed(module, imported) is ok


def test_a_forbidden_import_is_caught(tmp_path):
    """A copy of the package with one import a TF process must not make: the check names it, and
    the driver it reaches."""
    copy = copy_with_import(tmp_path, "cluster/node/reporting.py", "from tfos.cluster.driver import registry")
    found = violations(copy)
    assert any("tfos.cluster.node.reporting" in v and "tfos.cluster.driver.registry" in v for v in found), found
    assert any(v.startswith("tfos.cluster.node.runtime reaches the driver") for v in found), found


def package_of(module: str) -> str | None:
    return max((p for p in PACKAGES if module == p or module.startswith(p + ".")), key=len, default=None)


def package_cycles(root: str = ROOT) -> list[list[str]]:
    """Every circle in the graph of PACKAGES (an edge: a module of one imports a module of another)."""
    mods = all_modules(root)
    edges: dict[str, set] = {p: set() for p in PACKAGES}
    for m, path in mods.items():
        src = package_of(m)
        for imp, _ in module_imports(path, m):
            dst = package_of(imp)
            if src and dst and src != dst:
                edges[src].add(dst)
    cycles, state = [], {}

    def visit(p, stack):
        state[p] = "open"
        for q in sorted(edges[p]):
            if state.get(q) == "open":
                cycles.append(stack[stack.index(q):] + [q])
            elif q not in state:
                visit(q, stack + [q])
        state[p] = "done"

    for p in PACKAGES:
        if p not in state:
            visit(p, [p])
    return cycles


def test_the_packages_import_each_other_without_a_circle():
    assert package_cycles() == []


def test_a_circle_is_caught(tmp_path):
    copy = copy_with_import(tmp_path, "cluster/driver/service.py", "from tfos.feed.driver import scheduler")
    assert ["tfos.cluster.driver", "tfos.feed.driver", "tfos.cluster.driver"] in package_cycles(copy)


def module_cycles(root: str = ROOT) -> list[list[str]]:
    """Every circle among the modules themselves (inside a package as across them): the strongly
    connected components of more than one module, each sorted (Tarjan's algorithm, iterative)."""
    mods = all_modules(root)
    graph = {m: sorted({t for imp, _ in module_imports(p, m)
                        for t in (imp if imp in mods else imp.rpartition(".")[0],) if t in mods and t != m})
             for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_module_imports_itself_through_others():
    assert module_cycles() == []


def test_a_circle_inside_a_package_is_caught(tmp_path):
    copy = copy_with_import(tmp_path, "tf/gloo.py", "from tfos.tf import workers")  # workers imports gloo
    assert any({"tfos.tf.gloo", "tfos.tf.workers"} <= set(c) for c in module_cycles(copy))
