"""A product onnxruntime's MatmulTransposeFusion gets wrong: a Transpose's output times a vector.

onnxruntime 1.31 folds a Transpose that feeds a MatMul's first input into a ``FusedMatMul``
(``transA=1``); when the MatMul's second input is 1-D, that FusedMatMul returns wrong numbers, with
no error (``A.t() @ v`` for A [3, 4]: four values none of which is A's columns dotted with v; the
same for a [2, 3, 4] batch with perm [0, 2, 1]). A 2-D second input, or a 1-D first input times a
transposed matrix, come out right. So a session whose model holds such a product keeps the
Transpose and the MatMul apart: onnxruntime's fusion is turned off for it, where the second
input's rank is 1 or cannot be told; every other model keeps the fusion.
"""

from __future__ import annotations

import onnx

from graphc.model.file import model_graphs, tensor_types

__all__ = ["fusion_refused"]


def fusion_refused(model: onnx.ModelProto) -> tuple[str, ...]:
    """``("MatmulTransposeFusion",)`` when a MatMul of ``model`` (in any graph or local function) takes a
    Transpose's output first and may take a vector second; else ``()``."""
    graphs = model_graphs(model)
    transposed = {node.output[0] for g in graphs for node in g.node
                  if node.op_type == "Transpose" and node.domain in ("", "ai.onnx")}
    seconds = [node.input[1] for g in graphs for node in g.node
               if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and node.input[0] in transposed]
    if not seconds:
        return ()
    types = tensor_types(model, subgraphs=True) or {}
    known = {t.name: list(t.dims) for g in graphs for t in g.initializer}
    for name in seconds:
        dims = known[name] if name in known else types.get(name, (None, None))[1]
        if dims is None or len(dims) == 1:
            return ("MatmulTransposeFusion",)
    return ()
