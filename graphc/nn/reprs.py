"""How ``repr`` shows a module, as torch prints it: blocks of indented lines and the arguments not at their default."""

from __future__ import annotations

from typing import Any


def repr_block(name: str, lines: list[str]) -> str:
    """``name(...)`` holding ``lines`` one per line, or ``name()`` with none, as torch prints."""
    return f"{name}(\n" + "\n".join(_indented(line) for line in lines) + "\n)" if lines else f"{name}()"


def _indented(text: str) -> str:
    """``text`` two spaces in, each of its lines (blank ones left empty, as torch's ``_addindent``)."""
    first, *rest = text.split("\n")
    return "\n".join(["  " + first] + ["  " + line if line.strip() else "" for line in rest])


def not_default(module: Any, **defaults: Any) -> list[str]:
    """``name=value`` for each attribute of ``module`` unlike its default, in the order given: the
    arguments torch's reprs show only when set."""
    return [f"{name}={getattr(module, name)!r}" for name, default in defaults.items()
            if getattr(module, name) != default]
