"""`gc.optimize`: run graphc's optimization pipeline on a copy of a model."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.errors import GraphError, PassError
from graphc.model import Model, load
from graphc.passes.optimize import LEVELS, OptimizeReport, optimize_in_place

__all__ = ["optimize"]


def optimize(model, level: int = 2, report: bool = False):
    """Optimize a model; the caller's model is never changed (the pipeline runs on a copy).

    Args:
        model: a ``gc.Model``, ``onnx.ModelProto``, ``onnx_ir.Model``, bytes or a path.
        level: 0 copy only; 1 library cleanups (constant folding, identity/dead-node removal,
            CSE, initializer dedup, ...); 2 (default) adds algebraic simplification,
            MatMul+Add -> Gemm and Gelu/LayerNormalization fusions, and is safe for training
            graphs; 3 adds inference-only rewrites (Conv+BatchNormalization folding, Dropout
            removal, constant weight transposes pre-applied) and marks the model inference-only
            (its metadata names the parameters it folded): ``gc.grad`` and
            ``gc.training.generate`` refuse it.
        report: also return an ``OptimizeReport`` (per pass: node counts before/after, time).

    Returns:
        ``gc.Model`` (``report=False``) or ``(gc.Model, OptimizeReport)``. Outputs equal the
        input model's within float tolerance; graph input/output names, dtypes and shapes
        (symbolic dims stay symbolic) are unchanged.

    Raises:
        GraphError: ``level`` is not 0-3; ``PassError`` (``PipelineError`` for a pass that broke
            the graph's interface): a pass failed on this model (the message names it).

    Example:
        >>> import graphc as gc
        >>> fast = gc.optimize(gc.load("model.onnx"), level=3)  # doctest: +SKIP
        >>> fast, rep = gc.optimize("model.onnx", report=True)  # doctest: +SKIP
        >>> print(rep)  # doctest: +SKIP
    """
    if isinstance(level, bool) or level not in LEVELS:
        raise GraphError(f"optimize: level must be one of {sorted(LEVELS)}, got {level!r}")
    source = load(model)
    copy = source.ir
    # the model as a proto where one is at hand: shape inference reads it instead of
    # serializing the copy again
    proto = model if isinstance(model, onnx.ModelProto) else None
    if isinstance(model, (Model, ir.Model)):
        # serialize -> deserialize is a deep copy that shares nothing with the caller's model;
        # a path, bytes or ModelProto was just deserialized by load() into a fresh IR already.
        proto = ir.serde.serialize_model(source.ir)
        copy = ir.serde.deserialize_model(proto)
    try:
        result: OptimizeReport = optimize_in_place(copy, level, source=proto)
    except Exception as exc:  # a pass bug or a model a library pass cannot handle
        raise (type(exc) if isinstance(exc, PassError) else PassError)(
            f"optimize level {level} failed on model {source.name!r}: {type(exc).__name__}: {exc}") from exc
    out = Model(copy)
    return (out, result) if report else out
