"""Architecture rules, read statically off the source: passes never import a backend, nothing
imports a private (``_``-prefixed) module or name of onnxscript or onnx-ir, and a module over
500 lines says at its top why. (Import cycles: tests/test_import_graph.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graphc", "passes", "backends")  # graphc, graphc.passes, graphc.backends
LIBRARIES = ("onnxscript", "onnx_ir")
MAX_LINES = 500


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every import in ``path`` (function-level ones too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_passes_import_no_backend():
    offending = [f"{_where(path, line)} imports {module}" for path in _modules("passes")
                 for line, module, names in _imports(path)
                 if module.split(".")[:2] == ["graphc", "backends"] or module.split(".")[0] == "backends"
                 or (module == "graphc" and "backends" in names)]
    assert not offending, "passes/ must not import a backend (inject through graphc.passes.evaluate):\n" + \
        "\n".join(offending)


def _private_parts(module: str, names: list[str]) -> list[str]:
    parts = [p for p in module.split(".")[1:] if p.startswith("_")]
    return parts + [n for n in names if n.startswith("_")]


def test_no_private_library_imports():
    offending = []
    for path in _modules(*PACKAGES):
        for line, module, names in _imports(path):
            if module.split(".")[0] in LIBRARIES and _private_parts(module, names):
                offending.append(f"{_where(path, line)}: {module} {names or ''} "
                                 f"(private: {', '.join(_private_parts(module, names))})")
    assert not offending, "use the libraries' public APIs:\n" + "\n".join(offending)


def test_private_import_check_catches_one():
    """The scan above flags the forms a private import takes."""
    assert _private_parts("onnxscript.rewriter._basics", []) == ["_basics"]
    assert _private_parts("onnxscript.rewriter", ["_basics", "RewriteRule"]) == ["_basics"]
    assert _private_parts("onnx_ir.passes.common", ["NameFixPass"]) == []


def _header_comment(path: Path) -> str:
    """The ``#`` comment lines a module opens with."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("path", [p for p in _modules(*PACKAGES, "models")
                                  if len(p.read_text().splitlines()) > MAX_LINES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_long_module_says_why(path):
    comment = _header_comment(path)
    assert f"{MAX_LINES} lines" in comment, (
        f"{path.relative_to(ROOT)} has {len(path.read_text().splitlines())} lines: split it, or open it with a "
        f"'# Over {MAX_LINES} lines: <why>' comment")
