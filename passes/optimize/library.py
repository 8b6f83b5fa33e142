"""The generic cleanups graphc takes from onnx-ir and onnxscript instead of writing them again."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import _constant_folding

__all__ = ["cleanup_passes", "finish_passes", "fold_constants_pass"]

# Folding is bounded so the model never balloons: a node whose constant input has more
# elements than this is left for level 3's weight pre-application, and no folded result larger
# than OUTPUT_LIMIT elements is stored (onnxscript's own defaults, named here).
INPUT_LIMIT = _constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
OUTPUT_LIMIT = _constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT


def _named(p: ir.passes.PassBase, name: str, structural: bool = True) -> ir.passes.PassBase:
    """Give a library pass the name the report shows; ``structural=False`` marks passes whose
    ``modified`` flag says nothing about the node list (sorting, type annotation)."""
    p.name = name
    p.structural = structural
    return p


def fold_constants_pass() -> ir.passes.PassBase:
    """onnxscript's constant folder: evaluates nodes whose inputs are all constants (never graph
    inputs, so initializers a caller may override stay live) with the ONNX reference evaluator,
    and partially evaluates shape ops (``Shape``, ``Gather``/``Concat`` of shapes, ``Size``)
    from the static dims it knows, keeping symbolic dims symbolic. It also turns a ``Dropout``
    that the ONNX spec defines as identity (opset >= 12, no or false ``training_mode``, or ratio
    0) into Identity; training-mode Dropout is left as is."""
    return _named(_constant_folding.FoldConstantsPass(
        shape_inference=True, input_size_limit=INPUT_LIMIT, output_size_limit=OUTPUT_LIMIT),
        "FoldConstants")


def cleanup_passes() -> list[ir.passes.PassBase]:
    """Level 1's loop: fold, then drop what folding left behind. Each is sound by construction:
    identity elimination and CSE only redirect uses to an equal value (graph outputs keep their
    names), unused-node removal deletes nodes no output depends on, and initializer dedup merges
    byte-identical non-input initializers."""
    return [
        fold_constants_pass(),
        _named(common.IdentityEliminationPass(), "IdentityElimination"),
        _named(common.CommonSubexpressionEliminationPass(), "CommonSubexpressionElimination"),
        _named(common.RemoveUnusedNodesPass(), "RemoveUnusedNodes"),
        _named(common.DeduplicateInitializersPass(), "DeduplicateInitializers"),
    ]


def finish_passes() -> list[ir.passes.PassBase]:
    """Run once after the loop: constants become initializers (a ``Constant`` node costs a kernel
    launch in some runtimes; an initializer costs nothing), graph outputs that became an input or
    initializer get an Identity back (ONNX needs an output produced by a node), then a stable
    topological sort and ONNX shape inference annotate the result."""
    return [
        _named(common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
               "LiftConstantsToInitializers"),
        _named(common.DeduplicateInitializersPass(), "DeduplicateInitializers"),
        _named(common.RemoveUnusedNodesPass(), "RemoveUnusedNodes"),
        _named(common.OutputFixPass(), "OutputFix"),
        _named(common.TopologicalSortPass(), "TopologicalSort", structural=False),
        _named(common.ShapeInferencePass(), "ShapeInference", structural=False),
    ]
