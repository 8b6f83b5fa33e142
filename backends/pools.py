"""Pools onnxruntime would shape differently from ONNX's kernels, given explicit pads in an
onnxruntime session's copy of a model (nodes in the main graph with static spatial dims only).

Dilated SAME_*: ONNX pads a SAME_* pool so that its output has ceil(input / stride) positions,
counting the window's dilated extent, (kernel - 1) * dilation + 1; onnxruntime 1.31 leaves the
dilations out of those pads and returns a smaller output (MaxPool, AveragePool and LpPool of
kernel [3, 2], dilations [2, 2] on 7 x 6: 5 x 5, not 7 x 6). The copy states the pads ONNX
computes (the odd one at the end for SAME_UPPER, at the start for SAME_LOWER).

ceil_mode: a last ceil window that would start in the end padding is dropped by the kernels
(onnxruntime's, onnx.reference's, PyTorch's, the numpy backend's), but onnx 1.23's shape formula,
which onnxruntime's optimizer plans with, counts it: ``Shape`` of a MaxPool(3, 3, padding=1,
ceil_mode) of 5 x 5 folded to 3 x 3 on a 2 x 2 output. Where an axis drops such a window, the copy
has ceil_mode=0 and end pads that slide the kernels' windows (those ceil mode adds inside the
input stay); an AveragePool that counts pads and gains end pads reads the input zero-padded by its
own pads (a Pad node) and counts no pads, so the extra ones are not counted, as in ceil mode.

Either can need a pad as wide as the kernel (kernel 2, dilation 3, SAME on 7: pads 1 and 2), which
onnxruntime refuses to load ("Pad should be smaller than kernel"): such pads move into a Pad node in
front (``_pads_within_kernel``), and the session runs without onnxruntime's ``Pad_Fusion``, which
would fold them back (``fusion_refused``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.numpy.conv import geometry
from graphc.backends.written_out import Writer
from graphc.errors import BackendError
from graphc.model.file import ai_onnx_opset, with_nodes
from graphc.model.inferred import TypesOf, tensor_types
from graphc.model.windows import ceil_as_floor_pads

__all__ = ["explicit_pads", "fusion_refused"]

_KERNEL_PADS = "kernel_pads"  # the Writer tag of those Pad nodes

_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _dilated_same(node: onnx.NodeProto) -> bool:
    attrs = {a.name: a for a in node.attribute}
    return (node.op_type in _POOLS and node.domain in ("", "ai.onnx") and "auto_pad" in attrs
            and attrs["auto_pad"].s in (b"SAME_UPPER", b"SAME_LOWER") and "dilations" in attrs
            and any(d != 1 for d in attrs["dilations"].ints))


def _ceil_mode(node: onnx.NodeProto) -> bool:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (node.op_type in _POOLS and node.domain in ("", "ai.onnx") and attrs.get("ceil_mode") == 1
            and attrs.get("auto_pad", b"NOTSET") == b"NOTSET")


def explicit_pads(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when its main graph has no dilated SAME_* or ceil_mode pool, else a copy in
    which each whose input's spatial dims are static has explicit pads (the module docstring).
    ``types_of``: how it gets ``tensor_types`` (``SharedTypes`` along a session's rewrites)."""
    if not any(_dilated_same(node) or _ceil_mode(node) for node in model.graph.node):
        return model
    types, opset = types_of(model) or {}, ai_onnx_opset(model)
    nodes = []
    for node in model.graph.node:
        typed = types.get(node.input[0]) if node.input else None
        written = ([_with_pads(node, typed)] if _dilated_same(node) else _as_floor(node, typed, opset)
                   if _ceil_mode(node) else [node])
        nodes += written if written[-1] is node else [*written[:-1], *_pads_within_kernel(written[-1], typed, opset)]
    return with_nodes(model, nodes)


def _static(typed) -> list[int] | None:
    spatial = None if typed is None else typed[1][2:]
    return spatial if spatial and all(isinstance(d, int) for d in spatial) else None


def _as_floor(node: onnx.NodeProto, typed, opset: int) -> list[onnx.NodeProto]:
    """A ceil_mode pool as nodes with ceil_mode=0 where an axis drops a window ONNX's formula
    counts; ``[node]`` where none does (or a dim is not static, or no window fits)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    spatial = _static(typed)
    if spatial is None:
        return [node]
    n = len(spatial)
    pads = list(attrs.get("pads") or [0] * (2 * n))
    floor = ceil_as_floor_pads(spatial, attrs["kernel_shape"], attrs.get("strides") or [1] * n,
                               attrs.get("dilations") or [1] * n, pads)
    if floor is None:
        return [node]
    source, before = node.input[0], []
    if node.op_type == "AveragePool" and attrs.get("count_include_pad", 0) and floor != pads:
        if any(pads):
            w = Writer(node, "ceil_pads", opset)
            widths = [0, 0, *pads[:n], 0, 0, *pads[n:]]
            source = _padded(w, source, widths, 0, helper.tensor_dtype_to_np_dtype(typed[0]), opset)
            before, floor = w.nodes, [0] * n + [f - p for f, p in zip(floor[n:], pads[n:])]
        attrs["count_include_pad"] = 0
    attrs.update(ceil_mode=0, pads=floor)
    copy = helper.make_node(node.op_type, [source, *node.input[1:]], list(node.output), node.name, **attrs)
    copy.metadata_props.extend(node.metadata_props)
    return [*before, copy]


def _with_pads(node: onnx.NodeProto, typed) -> onnx.NodeProto:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    spatial = _static(typed)
    if spatial is None:
        return node
    begin, end, *_ = geometry(spatial, attrs["kernel_shape"], attrs.get("strides"), attrs["dilations"], None,
                              attrs["auto_pad"].decode())
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    kept = [a for a in copy.attribute if a.name not in ("auto_pad", "pads")]
    del copy.attribute[:]
    copy.attribute.extend([*kept, helper.make_attribute("pads", begin + end)])
    return copy


def _pads_within_kernel(node: onnx.NodeProto, typed, opset: int) -> list[onnx.NodeProto]:
    """``[node]``, or where a pad is not smaller than the kernel along its axis, the pool over its
    input padded by a Pad node, with no pads of its own: MaxPool pads with the lowest value (not
    with its Indices output, which would count the padding), LpPool and a pad-counting AveragePool
    with zeros; an AveragePool that counts no pads is the average of the padded input over that of
    padded ones, window by window the sum over the input's positions over their count."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kernel = attrs["kernel_shape"]
    n, pads = len(kernel), list(attrs.get("pads") or [])
    if all(p < kernel[i % n] for i, p in enumerate(pads)):
        return [node]
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        raise BackendError(f"MaxPool node {node.name!r}: onnxruntime refuses pads {pads} not smaller than the kernel "
                           f"{kernel}, and its Indices output rules out padding the input first; run it on the "
                           "numpy backend")
    dtype = helper.tensor_dtype_to_np_dtype(typed[0])
    w = Writer(node, _KERNEL_PADS, opset)
    widths = [0, 0, *pads[:n], 0, 0, *pads[n:]]
    lowest = -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min
    fill = lowest if node.op_type == "MaxPool" else 0
    averages = node.op_type == "AveragePool" and not attrs.get("count_include_pad", 0)
    attrs.update(pads=[0] * (2 * n), **({"count_include_pad": 1} if node.op_type == "AveragePool" else {}))

    def pool(source: str, output: str | None = None) -> str:
        return w.op(node.op_type, _padded(w, source, widths, fill, dtype, opset), output=output, **attrs)

    if not averages:
        pool(node.input[0], node.output[0])
    else:
        ones = w.op("ConstantOfShape", w.op("Shape", node.input[0]),
                    value=onnx.numpy_helper.from_array(np.ones(1, dtype)))
        w.op("Div", pool(node.input[0]), pool(ones), output=node.output[0])
    return w.nodes


def _padded(w: Writer, source: str, widths: list[int], value, dtype, opset: int) -> str:
    """``source`` padded by ``widths`` (ONNX's begins then ends) with the constant ``value``."""
    if opset >= 11:
        return w.op("Pad", source, w.const(widths, np.int64), w.const(value, dtype))
    return w.op("Pad", source, pads=widths, value=float(value))


def fusion_refused(model: onnx.ModelProto) -> tuple[str, ...]:
    """``("Pad_Fusion",)`` when ``explicit_pads`` moved a pool's pads into a Pad node of ``model``'s
    main graph (onnxruntime's rewrite would put them back into the pool, which it then refuses to
    load); else ``()``."""
    tag = f"/{_KERNEL_PADS}/"
    return ("Pad_Fusion",) if any(node.op_type == "Pad" and tag in node.name for node in model.graph.node) else ()
