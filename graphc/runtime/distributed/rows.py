"""Which inputs a data-parallel split cuts by rows and which outputs it joins by rows: those
whose first dim is the batch's, the symbolic dim most batch inputs start with (as
``gc.data.DataLoader``, the first axis is the rows). The others go whole to every worker."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional


def batch_dim(specs: Iterable[Any]) -> Optional[str]:
    """The symbolic dim most of ``specs`` (``TensorSpec`` or manifest entries) start with, the
    first one's on a tie; None when none starts with a symbolic dim."""
    firsts = [s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], str)]
    return max(firsts, key=firsts.count) if firsts else None


def by_rows(spec: Any, dim: Optional[str], computed: bool = False) -> bool:
    """Whether ``spec``'s first dim is the batch's ``dim``; with ``computed`` also one unknown
    or made up by shape inference (``unk__1``: a label shaped as a computed output, say)."""
    shape = spec.shape
    if dim is None or shape is not None and (not shape or isinstance(shape[0], int)):
        return False
    first = shape[0] if shape else None
    return first == dim or computed and (first is None or first.startswith("unk__"))
