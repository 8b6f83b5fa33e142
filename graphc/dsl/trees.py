"""Trees of tuples, lists and dicts whose leaves are Tensors (or anything else), as ``gc.vmap``,
``gc.func`` and ``gc.while_loop`` take and return them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def leaves(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) for each leaf of ``tree``, in order; a path reads ``path[0]['key']``."""
    if isinstance(tree, (tuple, list)):
        return [p for i, t in enumerate(tree) for p in leaves(t, f"{path}[{i}]")]
    if isinstance(tree, dict):
        return [p for k, t in tree.items() for p in leaves(t, f"{path}[{k!r}]")]
    return [(path, tree)]


def rebuild(tree: Any, items: Iterator[Any]) -> Any:
    """``tree`` with its leaves replaced, in order, by the items of the iterator ``items``."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(rebuild(t, items) for t in tree)
    if isinstance(tree, dict):
        return {k: rebuild(t, items) for k, t in tree.items()}
    return next(items)


__all__ = ["leaves", "rebuild"]
