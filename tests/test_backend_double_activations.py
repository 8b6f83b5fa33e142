"""float64 activations, Hardmax, Mean and NonZero run on ort-cpu (onnxruntime 1.31 has no double kernel for them:
``backends/doubles_activations.py`` writes them out for the session) within a few ulps of the numpy backend and of
torch float64 (given the float32 attribute values ONNX stores), every attribute, edges included (0, -0, tiny, huge,
inf, nan); torch.onnx's float64 MobileNet (HardSigmoid, HardSwish) runs on ort-cpu."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc

with np.errstate(over="ignore"):
    GRID = np.concatenate([
        np.linspace(-40, 40, 8001), 10.0 ** np.arange(-320, 308, 0.5), -(10.0 ** np.arange(-320, 308, 0.5)),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-17, -1e-17, -3.0, 3.0, 2.5, -2.5, 1.0, 0.5]])
F32 = lambda v: float(np.float32(v))  # an ONNX float attribute's value
SELU_ALPHA, SELU_GAMMA = F32(1.6732632423543772), F32(1.0507009873554805)


def _model(nodes, inputs, outputs, opset=21) -> gc.Model:
    graph = helper.make_graph(nodes, "activations", inputs, outputs)
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _double(name, shape, dtype=onnx.TensorProto.DOUBLE):
    return helper.make_tensor_value_info(name, dtype, shape)


def _torch_oracles():
    torch = sys.modules["torch"]
    F = torch.nn.functional
    softplus = lambda x: torch.logaddexp(x, torch.zeros_like(x))  # F.softplus returns x from x = 20 on
    hard_sigmoid = lambda a, b: lambda x: torch.where(x.isnan(), x, torch.clamp(x * a + b, 0, 1))
    return {
        ("Elu", ()): F.elu, ("Elu", (("alpha", 0.3),)): lambda x: F.elu(x, F32(0.3)),
        ("Celu", (("alpha", 2.0),)): lambda x: F.celu(x, 2.0),
        ("Selu", ()): lambda x: SELU_GAMMA * F.elu(x, SELU_ALPHA),
        ("Selu", (("alpha", 2.0), ("gamma", 3.0))): lambda x: 3.0 * F.elu(x, 2.0),
        ("LeakyRelu", ()): lambda x: F.leaky_relu(x, 0.01),  # an absent attribute: the numpy backend's double
        ("LeakyRelu", (("alpha", 0.2),)): lambda x: F.leaky_relu(x, F32(0.2)),
        ("ThresholdedRelu", (("alpha", 2.5),)): lambda x: torch.where(x > 2.5, x, 0.0),  # ONNX's: NaN gives 0
        ("HardSigmoid", ()): hard_sigmoid(0.2, 0.5),
        ("HardSigmoid", (("alpha", 0.25), ("beta", 0.25))): hard_sigmoid(0.25, 0.25),
        ("HardSwish", ()): F.hardswish,
        ("Softplus", ()): softplus, ("Mish", ()): lambda x: x * torch.tanh(softplus(x)), ("Softsign", ()): F.softsign}


CASES = [("Elu", ()), ("Elu", (("alpha", 0.3),)), ("Celu", (("alpha", 2.0),)), ("Selu", ()),
         ("Selu", (("alpha", 2.0), ("gamma", 3.0))), ("LeakyRelu", ()), ("LeakyRelu", (("alpha", 0.2),)),
         ("ThresholdedRelu", (("alpha", 2.5),)), ("HardSigmoid", ()), ("HardSigmoid", (("alpha", 0.25), ("beta", 0.25))),
         ("HardSwish", ()), ("Softplus", ()), ("Mish", ()), ("Softsign", ())]


def _assert_within(got: np.ndarray, want: np.ndarray, bound: float, what: str) -> None:
    """|got - want| / |want| below ``bound`` over finite normal ``want``; a few subnormal steps below; elsewhere
    the same value."""
    finite = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float64).tiny)
    subnormal = np.abs(want) < np.finfo(np.float64).tiny
    np.testing.assert_array_equal(got[~finite & ~subnormal], want[~finite & ~subnormal], err_msg=what)
    assert np.all(np.abs(got[subnormal] - want[subnormal]) <= 4 * 5e-324), what
    error = float(np.max(np.abs(got[finite] - want[finite]) / np.abs(want[finite])))
    print(f"{what}: max relative error {error:.3g}")
    assert error < bound, f"{what}: max relative error {error:.3g}"


@pytest.mark.parametrize("op, attrs", CASES, ids=[f"{op}-{'-'.join(f'{k}{v}' for k, v in a)}" for op, a in CASES])
def test_float64_activation_runs_on_ort_within_a_few_ulps(op, attrs):
    model = _model([helper.make_node(op, ["x"], ["y"], **dict(attrs))], [_double("x", [GRID.size])],
                   [_double("y", [GRID.size])])
    got = gc.Session(model, backend="ort-cpu").run({"x": GRID})["y"]
    with np.errstate(all="ignore"):
        reference = gc.Session(model, backend="numpy").run({"x": GRID})["y"]
    assert got.dtype == np.float64
    _assert_within(got, reference, 1e-15, f"{op} {attrs} against the numpy backend")
    torch = pytest.importorskip("torch")
    # normal numbers below 1e300 (torch's x relu6(x + 3) / 6 overflows first; its subnormal products differ), to an
    # ulp of 1 where 1 is the scale (HardSigmoid's alpha x + beta cancels near 0)
    normal = (np.abs(GRID) >= np.finfo(np.float64).tiny) & (np.abs(GRID) < 1e300)
    want = _torch_oracles()[op, attrs](torch.from_numpy(GRID[normal])).numpy()
    np.testing.assert_allclose(got[normal], want, rtol=1e-15, atol=2e-16, err_msg=f"{op} {attrs} against torch")


@pytest.mark.parametrize("opset, axis", [(21, -1), (21, 1), (21, 0), (11, 1), (11, 2), (11, 0), (11, -1)])
def test_float64_hardmax_runs_on_ort_first_maximum_or_nan(opset, axis):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    x[0, 0, :2] = 5.0  # a tie: the first
    x[1, 2, 1], x[0, 1, :] = np.nan, np.nan  # the first NaN, as numpy's argmax
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], [_double("x", x.shape)],
                   [_double("y", x.shape)], opset=opset)
    rows = x.reshape(int(np.prod(x.shape[:axis % 3])), -1) if opset < 13 else np.moveaxis(x, axis, -1)
    want = np.eye(rows.shape[-1])[np.argmax(rows, axis=-1)]
    want = want.reshape(x.shape) if opset < 13 else np.moveaxis(want, -1, axis)
    for backend in ("ort-cpu", "numpy"):
        np.testing.assert_array_equal(gc.Session(model, backend=backend).run({"x": x})["y"], want, err_msg=backend)


def test_float64_mean_and_nonzero_run_on_ort():
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    z = np.where(x > 0.5, x, 0.0)
    z[0, 0, 3], z[1, 1, 1] = -0.0, np.nan
    model = _model([helper.make_node("Mean", ["a", "b", "c"], ["m"]), helper.make_node("NonZero", ["a"], ["n"])],
                   [_double(n, x.shape) for n in "abc"],
                   [_double("m", x.shape), _double("n", [3, None], onnx.TensorProto.INT64)])
    got = gc.Session(model, backend="ort-cpu").run({"a": z, "b": 3 * x, "c": -x})
    np.testing.assert_allclose(got["m"], (z + 3 * x - x) / 3, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(got["n"], np.stack(np.nonzero(z)))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_torch_float64_mobilenet_runs_on_ort(exporter):
    """HardSigmoid and HardSwish (float32 alpha 1/6 in the export: 1.6e-10 from torch's x / 6)."""
    torch = pytest.importorskip("torch")
    import torch_zoo

    module, x, _ = torch_zoo.load("mobilenet", torch.float64)
    model = gc.load(torch_zoo.files("mobilenet", exporter, "float64")[0])
    got = gc.Session(model, backend="ort-cpu").run({"x": x.numpy()})["logits"]
    np.testing.assert_allclose(got, gc.Session(model, backend="numpy").run({"x": x.numpy()})["logits"],
                               rtol=1e-13, atol=1e-15)
    with torch.no_grad():
        np.testing.assert_allclose(got, module.eval()(x).numpy(), rtol=1e-8, atol=1e-9)
