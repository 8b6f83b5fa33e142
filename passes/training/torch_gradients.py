"""Torch's gradients that an imported model's ONNX ops do not hold, written into the graph (``mark``):
torch's ``detach`` and an embedding's ``scale_grad_by_freq``, which a dynamo export records
(``imports.mark_detached``, ``scale_grad_by_freq``; TorchScript records neither, and its training-mode
export refuses ``scale_grad_by_freq``), and fake quantization's straight-through gradient through an
imported QuantizeLinear + DequantizeLinear pair (``straight_through``), which has none in ONNX."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.emit import Emitter
from graphc.passes.training import imports
from graphc.passes.values import FAKE_QUANTIZE_KEY, STOP_GRADIENT_KEY, onnx_opset, replace_value

# aten.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) with scale_grad_by_freq True
_BY_FREQ = re.compile(r"target=torch\.ops\.aten\.embedding\.default\]\(args = \(%\w+, %\w+, -?\d+, True")


def mark(model: ir.Model) -> None:
    """Both rewrites of the module docstring, in place."""
    imports.mark_detached(model)
    scale_grad_by_freq(model)
    straight_through(model)


def scale_grad_by_freq(model: ir.Model) -> list[str]:
    """Each Gather a dynamo export recorded as ``aten.embedding`` with ``scale_grad_by_freq=True``
    followed, as ``gc.nn.Embedding(scale_grad_by_freq=True)`` captures it, by ``rows`` in value and
    ``rows / count`` in gradient (``count``: how often each position's index occurs in the batch,
    a ScatterElements(add) histogram over the table's rows), so each row's gradient is divided by
    its count as torch's; in place, returns the tables' names."""
    graph = model.graph
    lookups = [n for n in graph if n.op_type == "Gather" and _BY_FREQ.search(n.metadata_props.get(imports.FX_NODE, ""))]
    emit = Emitter(graph, onnx_opset(model, 0), "grad_by_freq")
    for node in lookups:
        table, indices, rows = node.inputs[0], node.inputs[1], node.outputs[0]
        size = table.shape[0] if table.shape is not None else None
        if not isinstance(size, int):
            raise PassError(f"Gather {node.name!r} (an embedding with scale_grad_by_freq): its table "
                            f"{table.name!r} has no static number of rows (shape {table.shape})")
        uses = list(rows.uses())
        flat = emit.op("Reshape", emit.op("Cast", indices, to=ir.DataType.INT64), emit.ints([-1]))
        counts = emit.scatter_elements(emit.const(np.zeros(size, np.int64)), flat,
                                       emit.op("Expand", emit.ints([1]), emit.op("Shape", flat)), axis=0)
        count = emit.unsqueeze(emit.op("Cast", emit.op("Gather", counts, indices, axis=0), to=rows.dtype), [-1])
        replace_value(rows, emit.op("Add", _held(emit, rows), emit.op("Div", emit.op("Sub", rows, _held(
            emit, rows)), count)), uses, "looked_up")
    if lookups:
        graph.sort()
    return [node.inputs[0].name for node in lookups]


# the integer range QuantizeLinear saturates to, by its zero point's type
_RANGES = {ir.DataType.INT8: (-128, 127), ir.DataType.UINT8: (0, 255), ir.DataType.INT16: (-32768, 32767),
           ir.DataType.UINT16: (0, 65535)}


def straight_through(model: ir.Model) -> list[str]:
    """Each imported per-tensor ``DequantizeLinear(QuantizeLinear(x, scale, zero_point))`` (a
    torch.onnx export of ``torch.fake_quantize_per_tensor_affine``, a QAT model's quantize/dequantize
    pairs) followed by torch's straight-through gradient: the pair's value, and ``dy`` back to ``x``
    where ``round(x * (1 / scale)) + zero_point`` lies in the zero point type's range, else 0
    (``gc.fake_quantize_per_tensor_affine``'s rule); in place, returns the pairs' outputs. Before, no
    gradient went through the pair: every param before it got zero. ``gc.capture``'s own pairs
    (``FAKE_QUANTIZE_KEY``) already have it; a pair that no float initializer reaches needs none and is
    left as it is; a per-channel pair raises."""
    graph = model.graph
    pairs = [(n.inputs[0].producer(), n) for n in graph if n.op_type == "DequantizeLinear" and n.inputs[0] is not None
             and n.inputs[0].producer() is not None and n.inputs[0].producer().op_type == "QuantizeLinear"
             and FAKE_QUANTIZE_KEY not in n.inputs[0].producer().metadata_props]
    emit = Emitter(graph, onnx_opset(model, 0), "straight_through")
    pairs = [(q, dq) for q, dq in pairs if _reads_weights(q.inputs[0])]
    for quantize, dequantize in pairs:
        x, scale, zero = (list(quantize.inputs) + [None])[:3]
        value = dequantize.outputs[0]
        shape = _typed(scale)[0]
        if shape is None or not all(isinstance(d, int) for d in shape) or int(np.prod(shape)) != 1:
            raise PassError(f"QuantizeLinear {quantize.name!r}: training through a quantize/dequantize pair needs one "
                            f"scale for the whole tensor (per tensor), got scale {scale.name!r} of shape {shape}")
        kind = _typed(zero)[1] if zero is not None else ir.DataType.UINT8
        low, high = _RANGES.get(kind, (None, None))
        if low is None:
            raise PassError(f"QuantizeLinear {quantize.name!r}: training through it needs an int8/uint8/int16/uint16 "
                            f"zero point, got {kind}")
        uses = list(value.uses())
        wide = emit.op("Cast", x, to=ir.DataType.FLOAT)
        zp = emit.op("Cast", zero, to=ir.DataType.FLOAT) if zero is not None else emit.const(np.float32(0))
        r = emit.op("Add", emit.op("Round", emit.op("Mul", wide, emit.op("Reciprocal", emit.op(
            "Cast", scale, to=ir.DataType.FLOAT)))), emit.op("Reshape", zp, emit.ints([])))
        inside = emit.op("And", emit.op("GreaterOrEqual", r, emit.const(np.float32(low))),
                         emit.op("LessOrEqual", r, emit.const(np.float32(high))))
        passed = emit.op("Where", inside, emit.op("Sub", x, _held(emit, x)), emit.op("CastLike", emit.const(
            np.float32(0)), x))
        replace_value(value, emit.op("Add", _held(emit, value), passed), uses, "dequantized")
    if pairs:
        graph.sort()
    return [dequantize.outputs[0].name for _, dequantize in pairs]


def _reads_weights(value: ir.Value) -> bool:
    """Whether a float initializer (a param to train) reaches ``value``."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v is None or v in seen:
            continue
        seen.add(v)
        if v.is_initializer() and imports.is_float(v):
            return True
        if v.producer() is not None:
            todo.extend(v.producer().inputs)
    return False


def _typed(value: ir.Value) -> tuple[list | None, ir.DataType | None]:
    """``value``'s (shape, dtype) as recorded, or as the constant it is or casts holds them (shapes and
    types are inferred later)."""
    if value.shape is not None and value.dtype is not None:
        return list(value.shape), value.dtype
    producer = value.producer()
    if producer is not None and producer.op_type in ("Cast", "Identity"):
        shape, dtype = _typed(producer.inputs[0])
        return shape, ir.DataType(producer.attributes.get_int("to", 0)) if producer.op_type == "Cast" else dtype
    tensor = ir.convenience.get_const_tensor(value)
    return (None, None) if tensor is None else (list(tensor.shape), tensor.dtype)


def _held(emit: Emitter, value: ir.Value) -> ir.Value:
    """``value`` through an Identity that stops the gradient (``gc.detach``)."""
    held = emit.op("Identity", value)
    held.producer().metadata_props[STOP_GRADIENT_KEY] = "true"
    return held
