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
    """Each imported ``DequantizeLinear(QuantizeLinear(x, scale, zero_point))`` (a torch.onnx export
    of ``torch.fake_quantize_per_tensor_affine`` or ``_per_channel_affine``, a QAT model's
    quantize/dequantize pairs, a ``Clip`` between them for torch's (0, 127) range) followed by torch's
    straight-through gradient: the pair's value, and ``dy`` back to ``x`` where ``round(x * (1 / scale))
    + zero_point`` lies in the range (the zero point type's, narrowed by the Clip), else 0
    (``gc.fake_quantize_per_*_affine``'s rule); per channel (1-D ``scale`` and ``zero_point``) each
    along the pair's ``axis``. ``scale`` and ``zero_point`` get none, as torch's: a QAT export's scale
    buffers (float initializers TorchScript names as parameters) are not trained. In place, returns
    the pairs' outputs. Before, no gradient went through the pair: every param before it got zero (a
    scale initializer reaching it: no gradient rule for DequantizeLinear). ``gc.capture``'s own pairs (``FAKE_QUANTIZE_KEY``) already have it; a
    pair that no float initializer reaches needs none and is left as it is."""
    graph = model.graph
    pairs = [pair for n in graph if (pair := _pair(n)) is not None
             and any(_reads_weights(v) for v in pair[0].inputs[:3])]
    emit = Emitter(graph, onnx_opset(model, 0), "straight_through")
    for quantize, clip, dequantize in pairs:
        value = dequantize.outputs[0]
        uses, held = list(value.uses()), _held(emit, value)
        if _reads_weights(quantize.inputs[0]):
            held = emit.op("Add", held, _passed(emit, quantize, clip, dequantize))
        replace_value(value, held, uses, "dequantized")
    if pairs:
        graph.sort()
    return [dequantize.outputs[0].name for _, _, dequantize in pairs]


def _passed(emit: Emitter, quantize: ir.Node, clip: ir.Node | None, dequantize: ir.Node) -> ir.Value:
    """``x - x``, +0 in value and ``dy`` in gradient, where the pair's rounded ``x`` lies in range, else 0;
    ``scale`` and ``zero_point`` read held (torch sends them no gradient)."""
    x, scale, zero = (list(quantize.inputs) + [None])[:3]
    low, high = _quantized_range(quantize, zero, clip)
    along = _channels(emit, quantize, dequantize, x, scale)
    wide = emit.op("Cast", x, to=ir.DataType.FLOAT)
    zp = along(emit.op("Cast", _held(emit, zero), to=ir.DataType.FLOAT)) if zero is not None \
        else emit.const(np.float32(0))
    r = emit.op("Add", emit.op("Round", emit.op("Mul", wide, emit.op("Reciprocal", along(emit.op(
        "Cast", _held(emit, scale), to=ir.DataType.FLOAT))))), zp)
    inside = emit.op("And", emit.op("GreaterOrEqual", r, emit.const(np.float32(low))),
                     emit.op("LessOrEqual", r, emit.const(np.float32(high))))
    return emit.op("Where", inside, emit.op("Sub", x, _held(emit, x)), emit.op("CastLike", emit.const(
        np.float32(0)), x))


def _pair(node: ir.Node) -> tuple[ir.Node, ir.Node | None, ir.Node] | None:
    """``(QuantizeLinear, Clip or None, node)`` where ``node`` is a DequantizeLinear reading an
    imported QuantizeLinear, directly or through a Clip; else None."""
    if node.op_type != "DequantizeLinear" or node.inputs[0] is None:
        return None
    clip = node.inputs[0].producer()
    quantize = clip.inputs[0].producer() if clip is not None and clip.op_type == "Clip" else clip
    if quantize is None or quantize.op_type != "QuantizeLinear" or FAKE_QUANTIZE_KEY in quantize.metadata_props:
        return None
    return quantize, (clip if clip is not quantize else None), node


def _quantized_range(quantize: ir.Node, zero: ir.Value | None, clip: ir.Node | None) -> tuple[int, int]:
    """The integers the pair's values lie in: the zero point type's range, narrowed by ``clip``'s
    constant bounds."""
    kind = _typed(zero)[1] if zero is not None else ir.DataType.UINT8
    low, high = _RANGES.get(kind, (None, None))
    if low is None:
        raise PassError(f"QuantizeLinear {quantize.name!r}: training through it needs an int8/uint8/int16/uint16 "
                        f"zero point, got {kind}")
    if clip is not None:
        lower, upper = (_clip_bound(quantize, clip, at) for at in (1, 2))
        low, high = max(low, low if lower is None else lower), min(high, high if upper is None else upper)
    return low, high


def _clip_bound(quantize: ir.Node, clip: ir.Node, at: int) -> int | None:
    """The constant bound input ``at`` of the pair's ``clip``, None where it has none; raises for a computed one."""
    bound = clip.inputs[at] if len(clip.inputs) > at else None
    if bound is None:
        return None
    found = _constant(bound)
    if found is None:
        raise PassError(f"Clip {clip.name!r} between QuantizeLinear {quantize.name!r} and its DequantizeLinear: "
                        f"training through it needs constant bounds, got {bound.name!r} computed in the graph")
    return found


def _channels(emit: Emitter, quantize: ir.Node, dequantize: ir.Node, x: ir.Value, scale: ir.Value):
    """A function shaping the pair's ``scale`` and ``zero_point`` to broadcast against ``x``: as they
    are for one scale (per tensor), ``[C]`` to ``[C, 1, ..., 1]`` along the pair's ``axis`` for one per
    channel; raises for another layout."""
    shape = _typed(scale)[0]
    if shape is not None and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == 1:
        return lambda v: emit.op("Reshape", v, emit.ints([]))
    axis, block = quantize.attributes.get_int("axis", 1), quantize.attributes.get_int("block_size", 0)
    if shape is None or len(shape) != 1 or block or dequantize.attributes.get_int("axis", 1) != axis:
        raise PassError(f"QuantizeLinear {quantize.name!r}: training through a quantize/dequantize pair needs one "
                        f"scale for the whole tensor (per tensor) or a 1-D scale along the pair's axis (per channel), "
                        f"got scale {scale.name!r} of shape {shape}, axis {axis} (DequantizeLinear's "
                        f"{dequantize.attributes.get_int('axis', 1)}), block_size {block}")
    rank = len(x_shape) if (x_shape := _typed(x)[0]) is not None else None
    if axis < 0 or rank is not None:
        ones = -axis - 1 if axis < 0 else rank - axis - 1
        target = emit.ints([-1] + [1] * ones)
    else:  # x's rank known at run time only
        ones = emit.op("Sub", emit.op("Size", emit.op("Shape", x)), emit.ints([axis + 1]))
        target = emit.op("Concat", emit.ints([-1]), emit.op("Expand", emit.ints([1]), ones), axis=0)
    return lambda v: emit.op("Reshape", v, target)


def _constant(value: ir.Value) -> int | None:
    """The one number a constant ``value`` holds (through Casts and Identities), else None."""
    producer = value.producer()
    if producer is not None and producer.op_type in ("Cast", "Identity"):
        return _constant(producer.inputs[0])
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None or tensor.size != 1 else int(tensor.numpy().reshape(-1)[0])


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
