"""gc.grad on every example model (models/): the directional derivative along a random
direction in parameter space matches central finite differences (float64 copies of the models,
numpy backend), in inference and training capture; the float32 gradient graph runs the same on
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc.models import EXAMPLES

try:
    from test_autodiff_rules import run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy, run_ort

BATCH = 2


def with_loss(model: gc.Model) -> onnx.ModelProto:
    """The model plus ``loss = sum(output_0 * C)`` (C fixed, random)."""
    proto = model.proto
    out = proto.graph.output[0]
    shape = [BATCH if d.dim_param else d.dim_value for d in out.type.tensor_type.shape.dim]
    c = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    proto.graph.initializer.append(numpy_helper.from_array(c, "loss_weight"))
    proto.graph.node.extend([
        helper.make_node("Mul", [out.name, "loss_weight"], ["loss_terms"]),
        helper.make_node("ReduceSum", ["loss_terms"], ["loss"], keepdims=0),
    ])
    proto.graph.output.append(helper.make_tensor_value_info("loss", out.type.tensor_type.elem_type, []))
    return proto


def to_float64(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The same model computing in float64 (initializers, Constants, Casts, value types)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())

    def retype(vi):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE

    def convert(t):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    g = proto.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        retype(vi)
    for t in g.initializer:
        convert(t)
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                convert(a.t)
            elif a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    return proto


def feeds_for(model: gc.Model, dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {}
    for spec in model.inputs:
        if spec.name in model.params:
            continue
        shape = [BATCH if not isinstance(d, int) else d for d in spec.shape]
        if spec.dtype == "int64":
            feeds[spec.name] = rng.integers(0, 10, shape)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_gradient_matches_finite_differences(name, training):
    factory, inputs = EXAMPLES[name]
    model = gc.capture(factory(), **inputs(), training=training)
    proto64 = to_float64(with_loss(model))
    if training:  # Dropout draws differ run to run: differentiate a model with p = 0 instead
        for node in proto64.graph.node:
            if node.op_type == "Dropout" and len(node.input) > 1 and node.input[1]:
                node.input[1] = ""
                node.input[2:] = []
    grad_model = gc.grad(gc.load(proto64), "loss")
    params = gc.load(proto64).params
    params.pop("loss_weight")
    feeds = feeds_for(model, np.float64)
    out = run_numpy(grad_model.proto, feeds)
    rng = np.random.default_rng(2)
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    analytic = sum(float(np.sum(out[f"{k}_grad"] * d)) for k, d in direction.items())
    eps = 1e-8  # small: a larger step moves some ReLU inputs across 0 in the deep models
    plus = run_numpy(grad_model.proto, {**feeds, **{k: params[k] + eps * d for k, d in direction.items()}})
    minus = run_numpy(grad_model.proto, {**feeds, **{k: params[k] - eps * d for k, d in direction.items()}})
    numeric = (plus["loss"] - minus["loss"]) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_gradient_graph_runs_the_same_on_onnxruntime(name):
    factory, inputs = EXAMPLES[name]
    model = gc.capture(factory(), **inputs())
    grad_model = gc.grad(gc.load(with_loss(model)), "loss")
    feeds = feeds_for(model, np.float32)
    expected = run_numpy(grad_model.proto, feeds)
    got = run_ort(grad_model.proto, feeds)
    for key, value in expected.items():
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(got[key], value, rtol=1e-3, atol=1e-4 * scale, err_msg=key)
