"""The levels table: which passes each ``gc.optimize`` level runs, in order."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Pipeline

__all__ = ["LEVELS", "MAX_LEVEL", "build_pipeline"]

# level -> what it adds to the level below, as `graphc optimize --help` shows it; docs/api.md's
# "Optimization levels" names each pass
LEVELS: dict[int, str] = {
    0: "nothing: the model is copied unchanged",
    1: "library cleanups: constant folding, CSE, dead-node and duplicate-initializer removal",
    2: "algebraic simplification and fusions (MatMul+Add -> Gemm, Gelu, LayerNormalization); safe for training graphs",
    3: "inference only: BatchNormalization and scale folding, Dropout removal, "
       "int8 QuantizeLinear/DequantizeLinear pairs",
}
MAX_LEVEL = max(LEVELS)


def build_pipeline(level: int, opset: int, protected: frozenset[str] = frozenset(),
                   source: onnx.ModelProto | None = None) -> Pipeline:
    """The pipeline of ``level`` for a model importing ai.onnx ``opset``. Level 2 and up run
    the rewrites inside the cleanup loop so each rewrite's leftovers are folded and removed
    before the next round; the loop stops at the first round that changes nothing.
    ``protected`` initializers (the model's parameters) are never folded, merged or dropped
    below level 3. ``source``: the model as a ``ModelProto``, if the caller has one (shape
    inference then reads it instead of serializing the model again)."""
    if level not in LEVELS:
        raise ValueError(f"optimization level must be one of {sorted(LEVELS)}, got {level!r}")
    if level == 0:
        return Pipeline([])
    # The passes load onnxscript (~150 ms): imported here so `graphc --help` and every other
    # command start without it.
    from graphc.passes.optimize.algebraic import (
        BatchedMatMulAddToGemm,
        ExpandIntoBroadcast,
        NeutralOperandElimination,
        ReshapeAbsorbsUnsqueeze,
        ReshapeThroughElementwise,
        algebraic_pass,
        gemm_pass,
    )
    from graphc.passes.optimize.fake_quantize import FakeQuantizeToQDQ
    from graphc.passes.optimize.fusions import fusion_passes
    from graphc.passes.optimize.quantized_linear import GemmBiasToInt32, QDQThroughViews
    from graphc.passes.optimize.inference import ScaleIntoLinear, StopGradientRemoval, inference_pass
    from graphc.passes.optimize.library import cleanup_passes, finish_passes
    from graphc.passes.optimize.shape_folding import ShapeFolding
    from graphc.passes.optimize.shape_inference import ShapeInference
    from graphc.passes.optimize.views import ViewSimplification

    loop: list[ir.passes.PassBase] = cleanup_passes(protected, level)
    if level >= 3:
        # first: what BatchNormalization/Dropout folding leaves (dead statistics, duplicate
        # weights) is cleaned up in the same round, not one round later
        loop = [StopGradientRemoval(), inference_pass(), *loop]
    # First in every round: ONNX shape inference fills the types and shapes the rewrites' checks
    # need, then (later rounds) the static dims that the previous round's folding made
    # computable, so that shape arithmetic on them folds in this round.
    loop = [ShapeInference(source), *loop]
    if level >= 2:
        loop += [ShapeFolding(), ViewSimplification(), NeutralOperandElimination(protected if level < 3 else frozenset()),
                 ExpandIntoBroadcast(), BatchedMatMulAddToGemm(), ReshapeThroughElementwise(),
                 algebraic_pass(), ReshapeAbsorbsUnsqueeze(), gemm_pass(),
                 *fusion_passes(opset)]
    if level >= 3:
        loop += [ScaleIntoLinear(), FakeQuantizeToQDQ(), QDQThroughViews(), GemmBiasToInt32()]
    # The finish's dead-node sweep and dedup are the loop's own instances, so the pipeline skips
    # them when nothing changed after the loop left them idle (LiftConstants found nothing).
    same = {p.name: p for p in loop if p.name in ("RemoveUnusedNodes", "DeduplicateInitializers")}
    finish = [same.get(p.name, p) for p in finish_passes(protected, level)]
    return Pipeline(loop, finish)
