"""The activations torch has beyond the first ones (ReLU6 ... LogSoftmax): modules and functional
forms against torch.nn (values and input gradients, float32 on the numpy and ort-cpu backends,
float64 at every kink where torch defines a value) and ``gc.grad`` against float64 central
finite differences away from the kinks."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

try:
    from torch_grad_util import assert_grads_match_central_differences, assert_module_matches_torch, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_grads_match_central_differences, assert_module_matches_torch,
                                      gc_grads)

R = np.random.default_rng(5)
X = (R.standard_normal((2, 3, 9)) * 3).astype(np.float32)
X2 = (R.standard_normal((4, 6)) * 4).astype(np.float32)
X3 = R.standard_normal((2, 4, 3)).astype(np.float32)
# every kink of the functions below, and points either side of them
KINKS = np.array([-7, -6, -2, -1, -0.5, -0.3, -0.1, 0, 0.1, 0.3, 0.5, 1, 2, 6, 7], np.float64)

# (id, gc module factory, torch.nn constructor, input)
MODULES = [
    ("ReLU6", nn.ReLU6, "ReLU6()", X2 * 1.5),
    ("Hardtanh", lambda: nn.Hardtanh(-0.5, 2.0), "Hardtanh(-0.5, 2.0)", X),
    ("SELU", nn.SELU, "SELU()", X),
    ("CELU", lambda: nn.CELU(0.7), "CELU(0.7)", X),
    ("GLU", nn.GLU, "GLU()", X2),
    ("GLUDim1", lambda: nn.GLU(dim=1), "GLU(dim=1)", X3),
    ("LogSigmoid", nn.LogSigmoid, "LogSigmoid()", X * 10),
    ("Softsign", nn.Softsign, "Softsign()", X),
    ("Tanhshrink", nn.Tanhshrink, "Tanhshrink()", X),
    ("Softshrink", lambda: nn.Softshrink(0.3), "Softshrink(0.3)", X3),
    ("Hardshrink", nn.Hardshrink, "Hardshrink()", X3),
    ("Threshold", lambda: nn.Threshold(0.1, -2.0), "Threshold(0.1, -2.0)", X),
    ("Softmin", lambda: nn.Softmin(dim=1), "Softmin(dim=1)", X3),
    ("LogSoftmax", lambda: nn.LogSoftmax(dim=1), "LogSoftmax(dim=1)", X),
    ("LogSoftmaxLast", lambda: nn.LogSoftmax(-1), "LogSoftmax(-1)", X2),
]

# (id, gc.nn.functional call, the same call on torch.nn.functional)
FUNCTIONS = [
    ("relu6", lambda f, x: f.relu6(x)),
    ("hardtanh", lambda f, x: f.hardtanh(x)),
    ("hardtanh_bounds", lambda f, x: f.hardtanh(x, -2.0, 0.5)),
    ("selu", lambda f, x: f.selu(x)),
    ("celu", lambda f, x: f.celu(x)),
    ("celu_alpha", lambda f, x: f.celu(x, 0.5)),
    ("logsigmoid", lambda f, x: f.logsigmoid(x)),
    ("softsign", lambda f, x: f.softsign(x)),
    ("tanhshrink", lambda f, x: f.tanhshrink(x)),
    ("softshrink", lambda f, x: f.softshrink(x)),
    ("softshrink_1", lambda f, x: f.softshrink(x, 1.0)),
    ("hardshrink", lambda f, x: f.hardshrink(x)),
    ("hardshrink_2", lambda f, x: f.hardshrink(x, 2.0)),
    ("threshold", lambda f, x: f.threshold(x, 0.5, -2.0)),
    ("threshold_0", lambda f, x: f.threshold(x, 0.0, 0.0)),
]
FN_IDS = [c[0] for c in FUNCTIONS]


def _torch_grads(torch, fn, x: np.ndarray, c: np.ndarray):
    """torch's ``fn(x)`` and d sum(fn(x) * c) / dx."""
    xt = torch.tensor(x, requires_grad=True)
    out = fn(xt)
    (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("name,factory,ctor,x", MODULES, ids=[c[0] for c in MODULES])
def test_module_matches_torch(name, factory, ctor, x):
    torch = pytest.importorskip("torch")
    layer = factory()
    assert layer.state_dict() == {}
    assert_module_matches_torch(layer, eval(f"torch.nn.{ctor}", {"torch": torch}), x)  # noqa: S307 - listed above


@pytest.mark.parametrize("dtype,backends", [(np.float64, ("numpy", "ort-cpu")), (np.float32, ("numpy", "ort-cpu"))],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name,fn", FUNCTIONS, ids=FN_IDS)
def test_values_and_gradients_at_the_kinks_are_torch(name, fn, dtype, backends):
    """At 0, at the clamp bounds, at +-lambd and at the threshold: torch's value and the
    gradient torch defines there (Hardtanh/ReLU6 0 at their bounds, unlike Clip's; Softshrink
    and Hardshrink 0 at +-lambd; Threshold 0 at the threshold; SELU the negative branch at 0)."""
    torch = pytest.importorskip("torch")
    x = KINKS.astype(dtype)
    c = np.ones_like(x)  # the gradient itself, element by element
    want, want_dx = _torch_grads(torch, lambda t: fn(torch.nn.functional, t), x, c)
    for backend in backends:
        got = gc_grads(lambda f, x: fn(f, x), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-6, atol=1e-7, err_msg=backend)
        np.testing.assert_allclose(got["x"], want_dx, rtol=1e-6, atol=1e-7, err_msg=backend)


# activations written out in float64 (their ONNX ops take float32 constants, and onnxruntime has no
# float64 kernel for them): torch's value and gradient to 1e-13 on both backends, at the kinks and
# NaN too (torch's hardsigmoid gradient is its float32 1/6, even in float64)
FLOAT64_WRITTEN = [
    ("leaky_relu", lambda f, x: f.leaky_relu(x, 0.2)),
    ("elu", lambda f, x: f.elu(x, 0.7)),
    ("selu", lambda f, x: f.selu(x)),
    ("celu", lambda f, x: f.celu(x, 0.5)),
    ("hardsigmoid", lambda f, x: f.hardsigmoid(x)),
    ("hardswish", lambda f, x: f.hardswish(x)),
    ("softsign", lambda f, x: f.softsign(x)),
    ("gelu", lambda f, x: f.gelu(x)),
]


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("name,fn", FLOAT64_WRITTEN, ids=[c[0] for c in FLOAT64_WRITTEN])
def test_float64_activations_are_torch_on_both_backends(name, fn, opset):
    torch = pytest.importorskip("torch")
    x = np.concatenate([KINKS, [-40.0, -3.0, -1e-9, 1e-9, 3.0, 40.0, np.nan]])
    c = np.random.default_rng(4).standard_normal(x.shape)
    want, want_dx = _torch_grads(torch, lambda t: fn(torch.nn.functional, t), x, c)
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda f, x: fn(f, x), {"x": x}, {}, c, backend=backend, opset=opset)
        np.testing.assert_allclose(got["out"], want, rtol=1e-13, atol=1e-300, err_msg=backend)
        np.testing.assert_allclose(got["x"], want_dx, rtol=1e-7 if name == "hardsigmoid" else 1e-13, atol=1e-300,
                                   err_msg=backend)


def test_kink_gradients_are_the_ones_torch_gives():
    """The same kinks, written down (torch not needed): 1 strictly inside the clamp, 0 on it."""
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 6.0])
    ones = np.ones_like(x)
    cases = {"relu6": [0, 0, 0, 1, 1, 0], "hardtanh": [0, 1, 1, 1, 0, 0], "softshrink": [1, 0, 0, 0, 1, 1],
             "hardshrink": [1, 0, 0, 0, 1, 1], "threshold": [0, 0, 0, 0, 1, 1]}
    for name, want in cases.items():
        fn = getattr(F, name)
        got = gc_grads(lambda f, x: fn(x, 0.5, 0.0) if name == "threshold" else fn(x), {"x": x}, {}, ones)
        np.testing.assert_array_equal(got["x"], want, err_msg=name)


@pytest.mark.parametrize("name,fn", FUNCTIONS + [("glu", lambda f, x: f.glu(x, 0)),
                                                 ("softmin", lambda f, x: f.softmin(x, 0))],
                         ids=FN_IDS + ["glu", "softmin"])
def test_gradient_matches_float64_finite_differences(name, fn):
    """d sum(f(x) * c) / dx from ``gc.grad`` (float64, on both backends) against central finite
    differences, at points 1e-3 or more from every kink."""
    x = np.random.default_rng(len(name)).uniform(-8, 8, (6, 5))
    x[np.abs(x[:, :, None] - KINKS).min(-1) < 1e-3] += 0.01
    assert_grads_match_central_differences(fn, x)


def test_each_uses_the_onnx_op_whose_gradient_rule_exists():
    ops = {name: [n.op_type for n in gc.capture(lambda x: fn(F, x), x=X).ir.graph] for name, fn in FUNCTIONS}
    assert ops["selu"] == ["Selu"] and ops["celu"] == ["Celu"] and ops["softsign"] == ["Softsign"]
    assert "Clip" not in ops["relu6"] and "Clip" not in ops["hardtanh"]  # Clip's gradient passes at the bounds
    assert "Exp" in ops["logsigmoid"] and "Softplus" not in ops["logsigmoid"]  # onnxruntime has no float64 Softplus


def test_log_sigmoid_is_finite_far_out():
    """No overflow either way (log(1 + exp(-|x|)) has no Log1p to keep its 1e-13 at x = 30)."""
    x = np.array([-200.0, -30.0, 0.0, 30.0, 200.0], np.float32)
    got = gc_grads(lambda f, x: f.logsigmoid(x), {"x": x}, {}, np.ones_like(x), backend="ort-cpu")
    np.testing.assert_allclose(got["out"], np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got["x"], 1 / (1 + np.exp(x.astype(np.float64))), rtol=1e-6, atol=1e-30)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(gc.GraphError, match=r"hardtanh needs min_val < max_val, got 1.0 and 1.0"):
        gc.capture(lambda x: F.hardtanh(x, 1.0, 1.0), x=X)
    with pytest.raises(gc.GraphError, match=r"glu halves dim 1, which needs a static even size, got 3"):
        gc.capture(nn.GLU(1), x=X)
    with pytest.raises(gc.GraphError, match=r"glu halves dim 1, which needs a static even size, got C"):
        gc.capture(nn.GLU(1), x=gc.spec("float32", ("N", "C")))
    with pytest.raises(gc.GraphError, match=r"softshrink lambd must be >= 0, got -0.5"):
        gc.capture(nn.Softshrink(-0.5), x=X)
    with pytest.raises(gc.GraphError, match=r"celu alpha must not be 0"):
        gc.capture(nn.CELU(0.0), x=X)


def test_dim_none_is_torchs_implicit_dim_and_reprs_name_the_arguments():
    """``dim=None`` on the 3-D ``X`` is dim 0, torch's deprecated implicit choice, with its warning."""
    for layer, fn in ((nn.Softmin(), lambda x: F.softmin(x, 0)), (nn.LogSoftmax(), lambda x: F.log_softmax(x, 0))):
        want = gc.Session(gc.capture(fn, x=X), backend="numpy").run({"x": X})["output"]
        with pytest.warns(UserWarning, match=f"Implicit dimension choice for {layer.name} has been deprecated"):
            model = gc.capture(layer, x=X)
        np.testing.assert_array_equal(gc.Session(model, backend="numpy").run({"x": X})["output"], want)
    assert repr(nn.Hardtanh(-2.0, 3.0)) == "Hardtanh(min_val=-2.0, max_val=3.0)"
    assert repr(nn.ReLU6()) == "ReLU6()"  # as torch's
    assert repr(nn.Softshrink(0.25)) == "Softshrink(0.25)" and repr(nn.LogSoftmax(1)) == "LogSoftmax(dim=1)"
