"""Helpers for the numpy-backend tests: one-node models and onnxruntime reference runs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.numpy import NumpyBackend
from graphc.model import ir_version_for


def node_model(op_type: str, inputs: list[np.ndarray | None], attrs: dict | None = None,
               opset: int = 21, n_outputs: int = 1, output_dtypes: list | None = None) -> onnx.ModelProto:
    """A model with one node; inputs are graph inputs named in0, in1, ... (None: omitted)."""
    in_names = ["" if x is None else f"in{i}" for i, x in enumerate(inputs)]
    while in_names and in_names[-1] == "":
        in_names.pop()
    out_names = [f"out{i}" for i in range(n_outputs)]
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                    for n, x in zip(in_names, inputs) if n]
    dtypes = output_dtypes or [np.float32] * n_outputs
    graph_outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
                     for n, d in zip(out_names, dtypes)]
    node = helper.make_node(op_type, in_names, out_names, name=f"{op_type.lower()}_node", **(attrs or {}))
    graph = helper.make_graph([node], f"{op_type}_test", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version_for({"": opset})
    return model


def feeds_of(model: onnx.ModelProto, inputs: list) -> dict[str, np.ndarray]:
    names = [v.name for v in model.graph.input]
    return dict(zip(names, [x for x in inputs if x is not None]))


def run_numpy(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    exe = NumpyBackend().prepare(model)
    out = exe.run(feeds)
    return [out[n] for n in exe.output_names]


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def numpy_vs_ort(op_type, inputs, attrs=None, opset=21, n_outputs=1):
    """Run one node on both; the model's output types are the numpy backend's result types."""
    probe = node_model(op_type, inputs, attrs, opset, n_outputs)
    got = run_numpy(probe, feeds_of(probe, inputs))
    model = node_model(op_type, inputs, attrs, opset, n_outputs, [g.dtype for g in got])
    want = run_ort(model, feeds_of(model, inputs))
    return got, want


def same_sequence(got, want, what):
    """The first outputs of two runs equal bit for bit: two sequences (lists) entry by entry, or two arrays."""
    got, want = got[0], want[0]
    if not isinstance(got, list):
        got, want = [got], [want]
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w, err_msg=what)
