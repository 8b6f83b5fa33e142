"""The levels table: which passes each ``gc.optimize`` level runs, in order."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Pipeline

__all__ = ["LEVELS", "MAX_LEVEL", "build_pipeline"]

# level -> what it adds to the level below (the report and `graphc optimize --help` show these)
LEVELS: dict[int, str] = {
    0: "nothing: the model is copied unchanged",
    1: "library cleanups: shape inference, constant folding (onnxscript; never a random op or a "
       "training-mode Dropout, nor a graph input's default, which a caller may feed), identity elimination, "
       "CSE, dead-node removal, initializer dedup (never parameters below level 3), constants "
       "lifted to initializers, topological sort (onnx-ir)",
    2: "algebraic simplification (x*1, x+0, Transpose/Reshape/Cast chains, Expand before a "
       "broadcasting op, zero Pad, Slice of a Slice, Transpose of size-1 axes as a Reshape, Reshapes "
       "around elementwise ops), MatMul+Add -> Gemm (a batched MatMul "
       "by a matrix through Reshapes), "
       "Transpose into Gemm attributes, shape-subgraph folding (symbolic dims kept), Gelu (opset >= 20) and LayerNormalization (>= 17) "
       "fusions; safe for training graphs",
    3: "inference only: gc.detach marks dropped (its Identities removed), Conv/Gemm+BatchNormalization "
       "folding, inference-mode Dropout removal "
       "(a training-mode Dropout stays random), a constant per-column "
       "scale folded into the Gemm/MatMul before it, constant weight "
       "transposes (and every other constant subgraph, any size, but a DequantizeLinear) pre-applied; equal "
       "parameters merged; gc.fake_quantize_* lowerings as plain QuantizeLinear + DequantizeLinear pairs "
       "(constant scale and zero point: onnxruntime's int8 kernels), a Gemm's float bias between "
       "DequantizeLinears as int32 (QGemm), per-tensor QDQ moved past Flatten/Reshape/Squeeze/Unsqueeze "
       "(QLinearGlobalAveragePool)",
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
