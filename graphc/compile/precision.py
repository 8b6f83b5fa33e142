"""`gc.convert_float`: a float32 model as float16 or bfloat16, for deployment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import onnx
import onnx.inliner
import onnx_ir as ir

from graphc.errors import GraphError, PassError, did_you_mean
from graphc.model import load
from graphc.passes.autodiff.model import infer_shapes
from graphc.passes.precision import DEFAULT_BLOCKED, TARGETS, FloatReport, convert_in_place

__all__ = ["DEFAULT_BLOCKED", "FloatReport", "check_keep_io_types", "convert_float"]


def convert_float(model, dtype: str = "float16", keep_io_types: bool = False,
                  op_block_list: Optional[Iterable[str]] = None, node_block_list: Iterable[str] = (),
                  report: bool = False):
    """A copy of ``model`` with its float32 computation in ``dtype``; the caller's model is unchanged.

    float32 initializers, Constants, graph inputs and outputs, intermediate values and dtype
    attributes (Cast's ``to``, RandomNormal's ``dtype``, ConstantOfShape's ``value``) become
    ``dtype``, inside If/Loop/Scan bodies too (local functions are inlined first). Inputs the op's
    schema fixes to float32 (Resize's ``scales``) stay float32; nodes that must run in float32
    (an op without a ``dtype`` kernel in its schema, e.g. Range, or blocked) get Casts around them.

    Args:
        model: a ``gc.Model``, ``onnx.ModelProto``, ``onnx_ir.Model``, bytes or a path.
        dtype: ``"float16"`` or ``"bfloat16"``.
        keep_io_types: float32 inputs and outputs stay float32 (Casts at the edges).
        op_block_list: op types kept in float32; None: ``DEFAULT_BLOCKED`` (ReduceSumSquare and
            ReduceL2, whose sums of squares overflow float16).
        node_block_list: node names kept in float32.
        report: also return a ``FloatReport`` (nodes converted and blocked, Casts added, values
            clamped or flushed to 0 per tensor, model bytes before and after).

    Finite values beyond ``dtype``'s range (float16: +-65504) in initializers and Constants are
    clamped to it with a ``RangeWarning`` naming each tensor (attention masks of -1e9 still mask).

    Raises:
        GraphError: a bad ``dtype`` or block list; ``PassError``: the converted model fails
            ``onnx.checker`` (full check) or an If/Loop/Scan node was blocked as a whole.
    """
    if dtype not in TARGETS:
        raise GraphError(f"convert_float: dtype must be one of {sorted(TARGETS)}, got {dtype!r}{did_you_mean(dtype, TARGETS)}")
    if not isinstance(keep_io_types, bool):
        raise GraphError(f"convert_float: keep_io_types must be True or False, got {keep_io_types!r}")
    ops = None if op_block_list is None else _names(op_block_list, "op_block_list")
    names = _names(node_block_list, "node_block_list")
    source = load(model)
    proto = onnx.inliner.inline_local_functions(source.proto) if source.proto.functions else source.proto
    typed = infer_shapes(ir.serde.deserialize_model(proto))
    known = {n.name for n in ir.traversal.RecursiveGraphIterator(typed.graph)}
    if unknown := sorted(set(names) - known):
        raise GraphError(f"convert_float: node_block_list names nodes model {source.name!r} does not have: "
                         f"{', '.join(map(repr, unknown))}")
    result = FloatReport(dtype, bytes_before=source.proto.ByteSize())
    convert_in_place(typed, dtype, keep_io_types, ops, names, result)
    out = ir.serde.serialize_model(typed)
    try:
        onnx.checker.check_model(out, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise PassError(f"convert_float to {dtype} produced an invalid model from {source.name!r}: "
                        f"{str(exc).strip().splitlines()[0]}") from None
    result.bytes_after = out.ByteSize()
    converted = load(out)
    return (converted, result) if report else converted


def check_keep_io_types(dtype: Optional[str], keep_io_types: bool, default: bool) -> None:
    """The one-step forms' check (export, deploy), before any work: without a ``dtype`` to convert
    to, ``keep_io_types`` must be the form's ``default``; another value would ask for a conversion
    that does not happen."""
    if dtype is None and keep_io_types is not default:
        raise GraphError(f"keep_io_types={keep_io_types!r} says how to convert to a dtype, and no dtype was "
                         "given: pass dtype='float16' or 'bfloat16' too, or leave keep_io_types out")


def _names(values: Iterable[str], what: str) -> frozenset[str]:
    items = None if isinstance(values, str) else tuple(values)
    if items is None or not all(isinstance(v, str) for v in items):
        raise GraphError(f"convert_float: {what} must be a list of names, got {values!r}")
    return frozenset(items)
