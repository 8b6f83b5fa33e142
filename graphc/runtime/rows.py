"""Which inputs a data-parallel split cuts by rows and which outputs it joins by rows: those
whose first dim is the batch's, the symbolic dim most batch inputs start with (as
``gc.data.DataLoader``, the first axis is the rows). The others go whole to every worker. A
model whose recurrent layers run over that axis (time-major) is refused (``time_major``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import onnx_ir as ir

RECURRENT_OPS = ("RNN", "LSTM", "GRU")


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


def time_major(graph: Any, dim: Optional[str]) -> Optional[str]:
    """Why splitting by the batch dim ``dim`` would cut sequences: a recurrent node of ``graph``
    (an ``onnx_ir`` graph; ONNX RNN, LSTM, GRU of layout 0 read ``[seq, batch, ...]``) runs over
    ``dim``, so each worker would run a piece of every sequence from a zero state; else None."""
    if dim is None:
        return None
    for node in ir.traversal.RecursiveGraphIterator(graph):  # a cond's or scan's body too
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        layout, x = node.attributes.get("layout"), node.inputs[0]
        if x is None or (layout is not None and layout.as_int()) or not x.shape:
            continue
        if getattr(x.shape[0], "value", x.shape[0]) == dim:
            return (f"{node.op_type} node {node.name!r} runs over the inputs' first dim {dim!r} (its input {x.name!r} "
                    f"is [{dim}, batch, ...]: a time-major model), so splitting the batch by rows would cut its "
                    "sequences; capture it batch-first (batch_first=True, inputs [N, L, ...]) or run it in one process")
    return None
