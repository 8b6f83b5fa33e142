"""The ai.onnx opsets this onnxruntime runs, and a model brought down to them for its session.

onnx writes models at opsets newer than onnxruntime loads: ``onnx.helper.make_model`` (onnx
1.23) stamps opset 28, onnxruntime 1.31 loads up to 26 and refuses the rest with a C++ message.
A session's copy of such a model is converted down by onnx's version converter (its adapters
rewrite each node as the older opset defines it, or it stops naming what it cannot); the model
itself is not changed.
"""

from __future__ import annotations

import functools

import onnx

from graphc.errors import BackendError
from graphc.model import ir_version_for
from graphc.model.file import ai_onnx_opset

__all__ = ["newest_opset", "within_reach"]


@functools.cache
def newest_opset() -> int:
    """The newest ai.onnx opset this onnxruntime loads: a one-node model tried at each opset
    from onnx's newest down (each a session of a few milliseconds, once per process)."""
    import onnxruntime as ort

    h = onnx.helper
    graph = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "probe",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    options = ort.SessionOptions()
    options.log_severity_level = 4
    for opset in range(onnx.defs.onnx_opset_version(), 7, -1):
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
        model.ir_version = ir_version_for({"": opset})
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - onnxruntime refuses an opset it does not know in its own words
            continue
        return opset
    return 7


def within_reach(model: onnx.ModelProto, backend: str) -> onnx.ModelProto:
    """``model`` itself when onnxruntime loads its ai.onnx opset, else a copy converted down to
    the newest it loads; ``BackendError`` naming both opsets where that conversion fails."""
    opset, newest = ai_onnx_opset(model), newest_opset()
    if opset <= newest:
        return model
    try:
        return onnx.version_converter.convert_version(model, newest)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors from C++
        raise BackendError(f"{backend} cannot load the model: it imports ai.onnx opset {opset}, this onnxruntime "
                           f"runs opsets up to {newest}, and converting it down failed: {exc}") from None
