"""onnxruntime rewrites that get some models wrong, and which sessions run without them.

A sweep of small models through onnxruntime 1.31's CPU graph rewrites (each session at level
"all" against one with optimizations off, and numpy) found these; each is turned off only for a
model that holds its pattern (in any graph or local function), every other model keeps it:

- ``DivMulFusion`` rewrites ``Mul(Div(1, x), y)`` as ``Div(y, x)``. For integers that is another
  number (``trunc(1 / 2) * 6`` is 0, ``6 / 2`` is 3), and a 1 of higher rank than ``x`` and ``y``
  no longer broadcasts the output up (``ones(1, 1) / x * y`` of vectors: shape [4], not [1, 4]).
- ``FuseReluClip`` folds a Relu into the Clip that reads it, and fails the session ("Unexpected
  data type for Clip 'min' input") where the Clip's min is a constant neither float nor float16
  (float64, int32): ``F.relu(x).clamp(-1, 1)`` in float64 did not load.
- ``Pad_Fusion`` folds a constant Pad of zeros into the MaxPool that reads it (through a Cast or
  not) as the pool's own pads, which a MaxPool never picks: a window of negative values over
  the padding gave their largest, not the pad's 0.
- ``LayerNormFusionL1`` fuses ``(x - mean) / sqrt(mean((x - mean) ** p) + eps) * g + b`` into a
  LayerNormalization whatever the exponent ``p`` (3 came out as a layer norm).
- ``SimplifiedLayerNormFusion`` fuses a float64 ``x / sqrt(mean(x ** 2) + eps) * g`` into a
  SimplifiedLayerNormalization whose epsilon is its default, 1e-5, not ``eps``.
- ``CommonSubexpressionElimination`` merges unseeded Bernoulli nodes of one input: they drew the
  same sample.
- ``ExpandElimination`` drops an Expand of a Reshape's output to a shape with a 0 as a no-op, so the
  result keeps an entry where it has none (``Reshape(x[1], [1, -1])`` expanded to ``[0, 1]`` gave
  ``[1, 1]``; ``gc.cartesian_prod`` of an empty vector gave a row); turned off where an Expand's
  output may have an empty dim (or a shape that cannot be told).
- ``MatmulTransposeFusion`` folds a Transpose feeding a MatMul's first input into a ``FusedMatMul``
  (``transA=1``), which returns wrong numbers, with no error, when the MatMul's second input is 1-D
  (``A.t() @ v`` for A [3, 4]; a [2, 3, 4] batch with perm [0, 2, 1] too; a 2-D second input, or a
  vector times a transposed matrix, come out right): turned off where the second input's rank is 1
  or cannot be told, in any model holding a Transpose, since onnxruntime first moves a Transpose
  through elementwise ops onto the MatMul (``(t * t) @ v`` for ``t = a.T``, from the grad fuzz). In a float16 model it also crashes the process as the session is built
  (SIGSEGV, no Python error) at level "all": the float16 MatMul has no CPU kernel, so Casts to
  float32 go in around it; FuseFp16InitializerToFp32NodeTransformer (level 4, run only at "all")
  then folds a float16 initializer's Cast, which reruns levels 2 and 3, and there this rewrite
  moves the Cast ahead of a Transpose of perm [1, 0, 2] or [1, 2, 0] feeding the MatMul's first
  input, after which NchwcTransformer segfaults. Seen on ``gc.convert_float(LSTMLanguageModel())``
  (its decoder MatMul reads the LSTM output's [1, 0, 2] Transpose through a Dropout); the smallest
  case is ``Mul(x, c)`` for a float16 initializer ``c`` beside an unrelated
  ``MatMul(Transpose(a, [1, 0, 2]), d)``. Turning off this rewrite, NchwcTransformer or the fp16-initializer fusion each avoids the
  crash; this rewrite costs a float16 model nothing (it never fuses before the Casts, having no
  float16 FusedMatMul kernel), so it is the one turned off, in a model holding a float16 constant
  where a MatMul's first input is a float16 Transpose's output (or of a type that cannot be told),
  through Casts too: ``narrow_casts`` computes the float16 MatMul in float32 between explicit Casts, and
  the crash came back with them.
- ``MatMulScaleFusion`` folds a Mul or Div by a one-element constant on a MatMul's input or output
  into a ``FusedMatMul``'s ``alpha``, a float attribute: a float64 scale float32 cannot hold is
  rounded (float64 attention's ``q * (1 / sqrt(3))``: 5e-9 off torch, 1e-16 without it); turned off
  where such a scale meets a MatMul.

The checks that need shapes share one shape inference, run only when one of them has a node to look at.
"""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from graphc.model.file import constant_tensors, model_graphs
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["fusion_refused"]

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)  # FuseReluClip's types for a Clip's min


def fusion_refused(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> tuple[str, ...]:
    """The names of the rewrites above that ``model`` holds a pattern of, in that order. ``types_of``: how it
    gets ``tensor_types`` (``SharedTypes`` along a session's rewrites)."""
    graphs = model_graphs(model)
    nodes = [node for g in graphs for node in g.node if node.domain in ("", "ai.onnx")]
    consts = _constants(graphs)
    producers = {out: node for node in nodes for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    types = functools.cache(lambda: types_of(model, subgraphs=True) or {})
    checks = {
        "DivMulFusion": lambda: any(_inexact_reciprocal(node, consts, readers) for node in nodes),
        "FuseReluClip": lambda: any(_clip_after_relu_refused(node, consts, producers) for node in nodes),
        "Pad_Fusion": lambda: any(_zero_pad_before_max_pool(node, consts, readers) for node in nodes),
        "LayerNormFusionL1": lambda: any(_central_power(node, consts, producers, readers) for node in nodes),
        "SimplifiedLayerNormFusion": lambda: _double_mean_power(nodes, readers, types),
        "CommonSubexpressionElimination": lambda: _repeated_unseeded_bernoulli(nodes),
        "ExpandElimination": lambda: _expand_to_empty(nodes, types),
        "MatmulTransposeFusion": lambda: _transposed_product_refused(graphs, nodes, producers, types),
        "MatMulScaleFusion": lambda: any(_inexact_product_scale(node, consts, producers, readers) for node in nodes),
    }
    return tuple(name for name, holds in checks.items() if holds())


def _constants(graphs: list[onnx.GraphProto]) -> dict[str, np.ndarray]:
    """Value name -> array, for the one-element ``constant_tensors`` (every pattern's constant is one
    value; a weight is not read)."""
    return {name: numpy_helper.to_array(t) for name, t in constant_tensors(graphs).items()
            if math.prod(t.dims) == 1 and not t.external_data}


def _ops(node: onnx.NodeProto | None, *op_types: str) -> bool:
    return node is not None and node.op_type in op_types


def _inexact_reciprocal(node: onnx.NodeProto, consts, readers) -> bool:
    """A Div of a constant 1 that is an integer or has a rank, whose output a Mul reads."""
    one = consts.get(node.input[0]) if _ops(node, "Div") else None
    return (one is not None and one.reshape(-1)[0] == 1 and (one.ndim > 0 or not np.issubdtype(one.dtype, np.floating))
            and any(_ops(n, "Mul") for n in readers.get(node.output[0], [])))


def _inexact_product_scale(node: onnx.NodeProto, consts, producers, readers) -> bool:
    """A Mul (either input) or Div (the divisor) by a one-element float64 constant that float32 cannot
    hold, of a MatMul's output or read by a MatMul."""
    if not _ops(node, "Mul", "Div") or len(node.input) != 2:
        return False
    at = [i for i in ((0, 1) if node.op_type == "Mul" else (1,)) if node.input[i] in consts]
    if not at:
        return False
    scale = consts[node.input[at[0]]]
    if scale.dtype != np.float64 or np.float64(np.float32(scale.reshape(-1)[0])) == scale.reshape(-1)[0]:
        return False
    return _ops(producers.get(node.input[1 - at[0]]), "MatMul") or \
        any(_ops(n, "MatMul") for n in readers.get(node.output[0], []))


def _clip_after_relu_refused(node: onnx.NodeProto, consts, producers) -> bool:
    """A Clip of a Relu's output whose min is a constant of a type FuseReluClip fails on."""
    if not (_ops(node, "Clip") and len(node.input) > 1 and node.input[1] in consts):
        return False
    return _ops(producers.get(node.input[0]), "Relu") and \
        onnx.helper.np_dtype_to_tensor_dtype(consts[node.input[1]].dtype) not in _FLOATS


def _zero_pad_before_max_pool(node: onnx.NodeProto, consts, readers) -> bool:
    """A constant-mode Pad of zeros (a constant value or none) read by a MaxPool, or by a Cast a
    MaxPool reads."""
    if not _ops(node, "Pad"):
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("mode", b"constant") != b"constant":
        return False
    value = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.float32(attrs.get("value", 0))
    if value is None or np.any(value != 0):  # a fed value is not folded
        return False
    after = readers.get(node.output[0], [])
    after = after + [r for n in after if _ops(n, "Cast") for r in readers.get(n.output[0], [])]
    return any(_ops(n, "MaxPool") for n in after)


def _central_power(node: onnx.NodeProto, consts, producers, readers) -> bool:
    """A Pow of a Sub's output by an exponent not known to be 2, whose output a ReduceMean reads
    (a layer norm's variance, but for the exponent)."""
    if not (_ops(node, "Pow") and _ops(producers.get(node.input[0]), "Sub")):
        return False
    exponent = consts.get(node.input[1])
    if exponent is not None and exponent.reshape(-1)[0] == 2:
        return False
    return any(_ops(n, "ReduceMean") for n in readers.get(node.output[0], []))


def _double_mean_power(nodes, readers, types) -> bool:
    """A Pow whose output a ReduceMean reads and whose base is float64 or of a type not known."""
    powers = [n for n in nodes
              if _ops(n, "Pow") and any(_ops(r, "ReduceMean") for r in readers.get(n.output[0], []))]
    return any(types().get(n.input[0], (TensorProto.DOUBLE,))[0] == TensorProto.DOUBLE for n in powers)


def _repeated_unseeded_bernoulli(nodes) -> bool:
    """Two Bernoulli nodes without a seed that read the same probabilities."""
    unseeded = Counter(n.input[0] for n in nodes
                       if _ops(n, "Bernoulli") and not any(a.name == "seed" for a in n.attribute))
    return any(count > 1 for count in unseeded.values())


def _expand_to_empty(nodes, types) -> bool:
    """An Expand whose output may have a dim of 0 (or a shape shape inference cannot tell)."""
    return any((types().get(n.output[0]) or (None, None))[1] is None or 0 in types()[n.output[0]][1]
               for n in nodes if n.op_type == "Expand")


def _transposed_product_refused(graphs, nodes, producers, types) -> bool:
    """In a model holding a Transpose, a MatMul whose second input may be 1-D (onnxruntime's
    TransposeOptimizer moves a Transpose through elementwise ops onto a MatMul's first input before
    this rewrite runs: ``(y * y) @ v`` for ``y = Transpose(a)`` came out wrong); or, in a model holding
    a float16 constant, a MatMul whose first input is a Transpose's output (past Identity/Dropout)
    that may be float16."""
    if not any(_ops(n, "Transpose") for n in nodes):
        return False
    known = {t.name: list(t.dims) for g in graphs for t in g.initializer}
    products = [n for n in nodes if _ops(n, "MatMul")]
    if any((dims := known.get(n.input[1]) or types().get(n.input[1], (None, None))[1]) is None or len(dims) == 1
           for n in products):
        return True
    if not any(t.data_type == TensorProto.FLOAT16 for t in constant_tensors(graphs).values()):
        return False
    return any(_ops(t := _through_removed(n.input[0], producers), "Transpose")
               and types().get(t.output[0], (TensorProto.FLOAT16,))[0] == TensorProto.FLOAT16 for n in products)


def _through_removed(name: str, producers) -> onnx.NodeProto | None:
    """The node making ``name``, past the Identity and Dropout nodes onnxruntime removes first (an
    inference Dropout sits between the LSTM LM's Transpose and its decoder MatMul) and the Casts
    the rewrite moves (``backends.narrow_casts`` computes a float16 MatMul in float32 between
    Casts: the float16 Transpose then feeds it through one)."""
    node = producers.get(name)
    while _ops(node, "Identity", "Dropout", "Cast"):
        node = producers.get(node.input[0])
    return node
