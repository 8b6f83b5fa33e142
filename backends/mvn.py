"""Double-precision MeanVarianceNormalization written out for onnxruntime, in a session's copy of a model.

onnxruntime 1.31 has no double kernel for MeanVarianceNormalization ("Could not find an
implementation for MeanVarianceNormalization(13)"), and so cannot load such a model. The session's
copy computes it in standard ops instead, as the numpy kernel does: ``y = (x - mean) / (std + 1e-9)``,
the mean and the (biased) standard deviation over ``axes`` (default [0, 2, 3]). Nodes in the main
graph only (``doubles.lower_double`` writes them out); float, float16 and bfloat16 ones run on
onnxruntime's kernel.
"""

from __future__ import annotations

import numpy as np
import onnx

from graphc.backends.written_out import Writer

__all__ = ["LOWERING"]


def _written_out(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), [0, 2, 3])
    centred = w.op("Sub", node.input[0], w.reduce_mean(node.input[0], axes))
    std = w.op("Sqrt", w.reduce_mean(w.op("Mul", centred, centred), axes))
    w.op("Div", centred, w.op("Add", std, w.const(1e-9, np.float64)), output=node.output[0])


LOWERING = {"MeanVarianceNormalization": _written_out}  # run by ``doubles.lower_double``
