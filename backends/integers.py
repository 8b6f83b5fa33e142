"""Integer nodes onnxruntime has no kernel for, written out in a session's copy of a model.

onnxruntime 1.31's CPU provider has no int64 Relu (it has int8 and int32: "Could not find an implementation
for Relu(14)"), no int8, uint8 or int16 Trilu or Einsum, no bool Where (``masked_fill`` of a bool Tensor), no
OneHot of int32 indices with int64 depth and values (what ``F.one_hot`` of an int32 Tensor emits), no int64 Resize;
the numpy backend runs each, torch all but the last two (its ``one_hot`` takes int64 only, its ``interpolate``
no int64). The session's copy writes:

- Relu as ``Max(x, 0)``;
- Trilu and Einsum of int8, uint8 or int16 in int32 between Casts: int32 sums and products wrap modulo 2^32,
  a multiple of 2^16, and the Cast back wraps modulo 2^8 or 2^16, so the result is the narrow dtype's wrapped one exactly,
  as torch's and numpy's;
- OneHot with its indices cast to int64;
- an int64 Resize of mode nearest (no kernel either) as the Gathers ``doubles_layers`` writes a double one as;
- a bool Where as ``(c and x) or (not c and y)``, which broadcasts as Where does.

Nodes in any graph (Loop and Scan bodies, If branches too). Each written form uses ops the CPU provider has
integer kernels for, so the CUDA provider runs it too, placing on the CPU what it has no kernel for.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import TensorProto, helper

from graphc.backends import doubles_layers
from graphc.backends.written_out import Lowering, Writer, lower_written
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["MISSING", "lower"]

_NARROW = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16})


def _relu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    zero = w.const(0, helper.tensor_dtype_to_np_dtype(types[node.input[0]][0]))
    w.op("Max", node.input[0], zero, output=node.output[0])


def _in_int32(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    """``node`` on its narrow inputs cast to int32 (Trilu's int64 ``k`` kept), its output cast back."""
    wide = onnx.NodeProto()
    wide.CopyFrom(node)
    wide.input[:] = [w.op("Cast", x, to=TensorProto.INT32) if _dtype(types, x) in _NARROW else x for x in node.input]
    wide.output[:] = [f"{w.prefix}{node.output[0]}"]
    w.nodes.append(wide)
    w.op("Cast", wide.output[0], to=types[node.input[0]][0], output=node.output[0])


def _int64_indices(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    indices, *rest = node.input
    w.op("OneHot", w.op("Cast", indices, to=TensorProto.INT64), *rest, output=list(node.output),
         **{a.name: helper.get_attribute_value(a) for a in node.attribute})


def _logical_where(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    cond, x, y = node.input
    w.op("Or", w.op("And", cond, x), w.op("And", w.op("Not", cond), y), output=node.output[0])


def _dtype(types: dict, name: str) -> int | None:
    return types.get(name, (None,))[0] if name else None


def _gathers(node: onnx.NodeProto) -> bool:
    """Whether the Resize ``node`` picks input elements (mode nearest, no extrapolated positions)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("mode", b"nearest") == b"nearest" and \
        attrs.get("coordinate_transformation_mode") != b"tf_crop_and_resize"


# op type -> (whether onnxruntime has no kernel for the node, given the model's types; its writer)
MISSING: dict[str, tuple[Callable[[onnx.NodeProto, dict], bool], Lowering]] = {
    "Relu": (lambda node, types: _dtype(types, node.input[0]) == TensorProto.INT64, _relu),
    "Trilu": (lambda node, types: _dtype(types, node.input[0]) in _NARROW, _in_int32),
    "Einsum": (lambda node, types: _dtype(types, node.input[0]) in _NARROW, _in_int32),
    "OneHot": (lambda node, types: _dtype(types, node.input[0]) == TensorProto.INT32
               and _dtype(types, node.input[1]) == TensorProto.INT64, _int64_indices),
    "Where": (lambda node, types: _dtype(types, node.input[1]) == TensorProto.BOOL, _logical_where),
    "Resize": (lambda node, types: _dtype(types, node.input[0]) == TensorProto.INT64 and _gathers(node),
               doubles_layers.LOWERINGS["Resize"]),
}


def lower(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when no node of it (in any graph) is one ``MISSING`` finds no kernel for, else a copy with
    each such node written out (the module docstring). ``types_of``: ``lower_written``'s."""
    return lower_written(model, {op: writer for op, (_, writer) in MISSING.items()},
                         lambda node, types: MISSING[node.op_type][0](node, types), "integer", types_of)
