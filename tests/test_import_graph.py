"""The import graph of graphc's own modules, read statically from the source (nothing imported).

Checked: no cycle among module-level imports of ``graphc``, ``graphc.passes``,
``graphc.backends`` and ``graphc.models`` (imports under ``if TYPE_CHECKING:`` do not count);
the DSL layers (``graphc/dsl/__init__.py``) import only downward, counting imports inside
functions too; ``graphc.passes`` never imports ``graphc.backends`` at module level; no DSL module
imports another graphc module's private name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> package name (the package-dir mapping in pyproject.toml)
PACKAGES = {"graphc": "graphc", "passes": "graphc.passes", "backends": "graphc.backends", "models": "graphc.models"}

# The DSL's layers, lowest first: a module may import modules of its own layer or of lower ones.
# A new module of graphc/dsl/ is a function module unless named here; every graphc.nn module is nn.
LOWEST = [("builder", {"graphc.dsl.builder", "graphc.dsl.eager", "graphc.dsl.seeding", "graphc.dsl.sources"}),
          ("tensor", {"graphc.dsl.tensor"})]
TOP = ("capture", {"graphc.dsl.capture"})


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()
_NAMED = set().union(*(members for _, members in [*LOWEST, TOP]))
LAYERS = [*LOWEST,
          ("functions", {m for m in MODULES if m.startswith("graphc.dsl.") and m not in _NAMED}),
          ("nn", {m for m in MODULES if m == "graphc.nn" or m.startswith("graphc.nn.")}),
          TOP]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: list[ast.stmt], module_level: bool):
    """Import statements in ``body``: module-level ones only (inside ``if``/``try`` too, never
    under ``if TYPE_CHECKING``), or every one, inside functions and classes included."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            continue
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not module_level:
                yield from _statements(node.body, module_level)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []) or []:
                    yield from _statements([child] if isinstance(child, ast.stmt) else child.body, module_level)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, module_level: bool) -> list[tuple[str, list[str]]]:
    """(graphc module imported, names taken from it) for each import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    out = []
    for node in _statements(tree.body, module_level):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names if alias.name in MODULES]
            continue
        target = _resolve(module, node)
        for alias in node.names:
            if f"{target}.{alias.name}" in MODULES:  # `from graphc.dsl import ops`
                out.append((f"{target}.{alias.name}", []))
            elif target in MODULES:
                out.append((target, [alias.name]))
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return found


def _module_level_edges() -> dict[str, set[str]]:
    return {m: {target for target, _ in _imports(m, module_level=True) if target != m} for m in MODULES}


def test_the_scan_sees_the_package():
    edges = _module_level_edges()
    assert {"graphc", "graphc.dsl.builder", "graphc.passes.emit", "graphc.backends.numpy"} <= set(MODULES)
    assert "graphc.dsl.tensor" in edges["graphc.dsl.ops"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(_module_level_edges())
    assert cycles == [], "module-level import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _layer_of(module: str) -> int | None:
    return next((i for i, (_, members) in enumerate(LAYERS) if module in members), None)


@pytest.mark.parametrize("layer", range(len(LAYERS)), ids=[name for name, _ in LAYERS])
def test_dsl_layers_import_only_downward(layer: int):
    name, members = LAYERS[layer]
    upward = []
    for module in sorted(members & set(MODULES)):
        for target, _ in _imports(module, module_level=False):
            target_layer = _layer_of(target)
            if target_layer is not None and target_layer > layer:
                upward.append(f"{module} imports {target} ({LAYERS[target_layer][0]})")
            if target == "graphc":  # the public front sits above every layer
                upward.append(f"{module} imports graphc (the public front)")
    assert upward == [], f"the {name} layer imports upward: {upward}"


def test_the_layers_hold_the_dsl():
    functions, nn = LAYERS[2][1], LAYERS[3][1]
    assert {"graphc.dsl.ops", "graphc.dsl.control", "graphc.dsl.methods"} <= functions
    assert {"graphc.nn.module", "graphc.nn.containers", "graphc.nn.layers"} <= nn


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(module: str) -> list[str]:
    """Private names ``module`` takes from another graphc module: imported by name, or read off an
    imported module (``ops._same_dtype``)."""
    tree = ast.parse(MODULES[module].read_text())
    found = [f"{name} from {target}" for target, names in _imports(module, module_level=False)
             for name in names if _private(name) and target != module]
    aliases = {}
    for node in _statements(tree.body, module_level=False):
        for alias in node.names:
            target = alias.name if isinstance(node, ast.Import) else f"{_resolve(module, node)}.{alias.name}"
            if target in MODULES and target != module:
                aliases[alias.asname or alias.name] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and _private(node.attr):
            found.append(f"{node.attr} of {aliases[node.value.id]} (line {node.lineno})")
    return found


def test_dsl_modules_take_no_private_names_from_other_modules():
    dsl = sorted(m for m in MODULES if m.startswith(("graphc.dsl", "graphc.nn")))
    assert {m: _private_uses(m) for m in dsl if _private_uses(m)} == {}


def test_passes_never_import_backends_at_module_level():
    edges = _module_level_edges()
    wrong = [f"{m} -> {t}" for m in edges if m.startswith("graphc.passes") for t in edges[m]
             if t.startswith("graphc.backends")]
    assert wrong == []
