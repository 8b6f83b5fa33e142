"""graphc's optimization pipeline on onnx-ir: generic cleanups from onnx-ir/onnxscript plus
graphc's rewrites, grouped into levels 0-3 (``LEVELS``) and run to a fixed point.

    report = optimize_in_place(ir_model, level=2)   # mutates ir_model; gc.optimize copies first
"""

from __future__ import annotations

import contextlib
import json

import onnx
import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.bound_values import keep_bound_values
from graphc.passes.optimize.interface import restore_interface, snapshot_interface
from graphc.passes.optimize.levels import LEVELS, MAX_LEVEL, build_pipeline
from graphc.passes.optimize.pipeline import OptimizeReport, PassRecord, Pipeline, PipelineError, count_nodes
from graphc.passes.values import INFERENCE_ONLY_KEY, onnx_opset

__all__ = ["LEVELS", "MAX_LEVEL", "OptimizeReport", "PassRecord", "Pipeline", "PipelineError",
           "build_pipeline", "count_nodes", "optimize_in_place"]


def optimize_in_place(model: ir.Model, level: int = 2, source: onnx.ModelProto | None = None) -> OptimizeReport:
    """Optimize ``model`` in place at ``level``; graph inputs and outputs keep their names,
    dtypes and shapes (symbolic dims included) exactly. Returns what each pass did.
    ``source``: ``model`` as a ``ModelProto`` (read, never changed), if the caller has one:
    shape inference runs on it instead of serializing ``model`` again."""
    from graphc.passes.optimize.library import parameter_names  # loads onnxscript: only when used

    report = OptimizeReport(level=level)
    opset = onnx_opset(model, 1)
    params = parameter_names(model)
    pipeline = build_pipeline(level, opset, params, source)
    interface = snapshot_interface(model)
    before = {name: v.const_value for name, v in model.graph.initializers.items() if name in params}
    # level 3 drops the Functions' records and backwards (``StopGradientRemoval``): nothing to keep there
    with keep_bound_values(model) if level < 3 else contextlib.nullcontext():
        pipeline.run(model, report)
    restore_interface(model, interface)
    if level >= 3:
        earlier = json.loads(model.metadata_props.get(INFERENCE_ONLY_KEY, '{"folded_parameters": []}'))
        folded = earlier["folded_parameters"] + _folded(model, before)  # an earlier level-3 run's too
        model.metadata_props[INFERENCE_ONLY_KEY] = json.dumps({"folded_parameters": folded})
    return report


def _folded(model: ir.Model, before: dict[str, ir.TensorProtocol | None]) -> list[str]:
    """The names in ``before`` (initializer name -> its value before the pipeline) that are no longer
    initializers of ``model`` holding that value."""
    def kept(name: str, old: ir.TensorProtocol | None) -> bool:
        now = model.graph.initializers.get(name)
        new = None if now is None else now.const_value
        return new is old or (new is not None and old is not None and np.array_equal(new.numpy(), old.numpy()))

    return [name for name, old in before.items() if not kept(name, old)]
