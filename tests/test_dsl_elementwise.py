"""torch's one-input elementwise functions (``graphc/dsl/ops_elementwise.py``): each as ``F.X``
and as the method ``x.X()`` against torch's, values on the numpy and ort-cpu backends (after the
full ONNX checker) and ``gc.grad`` gradients against torch.autograd; the careful lowerings
(log1p, expm1, erfc, log2) against torch and float64 numpy at tiny, huge and special inputs, and
their float64 gradients against central differences."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import TorchNS, assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, assert_grads_match_central_differences, gc_grads, run_both

R = np.random.default_rng(5)
X = R.standard_normal((3, 5)).astype(np.float32)
WITH_ZERO = X.copy()
WITH_ZERO[1, 2] = WITH_ZERO[0, 4] = 0
UNIT = R.uniform(-0.95, 0.95, (3, 5)).astype(np.float32)  # asin, acos, atanh's domain
PROB = R.uniform(0.02, 0.98, (3, 5)).astype(np.float32)
ABOVE_ONE = (1.05 + 2 * np.abs(X)).astype(np.float32)
POSITIVE = np.exp(2 * X).astype(np.float32)
# no -nan: ONNX cannot read a nan's sign bit, so signbit(-nan) is False (torch: True)
SPECIAL = np.array([[np.nan, np.inf, -np.inf, 1.5, -0.0], [-2.0, 0.0, np.nan, -np.inf, 3.0]], np.float32)
INTS = np.array([[0, 1, 2], [3, 1, 0]], np.int64)

# (function name, input, keyword arguments); each runs as F.name(x, **kw) and as x.name(**kw)
CASES = [
    ("tan", UNIT * 1.5, {}), ("sinh", X, {}), ("cosh", X, {}), ("asin", UNIT, {}), ("acos", UNIT, {}),
    ("atan", X * 3, {}), ("asinh", X * 3, {}), ("acosh", ABOVE_ONE, {}), ("atanh", UNIT, {}),
    ("arcsin", UNIT, {}), ("arccos", UNIT, {}), ("arctan", X, {}), ("arcsinh", X, {}), ("arccosh", ABOVE_ONE, {}),
    ("arctanh", UNIT, {}),
    ("log1p", PROB * 4 - 0.9, {}), ("expm1", X * 3, {}), ("log2", POSITIVE, {}), ("log10", POSITIVE, {}),
    ("exp2", X * 3, {}), ("erfc", X * 3, {}), ("erfinv", UNIT, {}), ("sinc", WITH_ZERO * 2, {}),
    ("logit", PROB, {}), ("logit", PROB, {"eps": 0.2}), ("logit", PROB, {"eps": -0.1}),
    ("deg2rad", X * 100, {}), ("rad2deg", X, {}), ("sgn", WITH_ZERO, {}), ("signbit", SPECIAL, {}),
    ("positive", X, {}), ("negative", X, {}), ("absolute", X, {}), ("fix", X * 3, {}),
    ("isneginf", SPECIAL, {}), ("isposinf", SPECIAL, {}), ("isreal", SPECIAL, {}),
    ("clamp_min", X, {"min": 0.2}), ("clamp_max", X, {"max": -0.1}),
]
IDS = [f"{n}{'_' + '_'.join(map(str, kw.values())) if kw else ''}" for n, _, kw in CASES]
FLOAT_FUNCTIONS = ["tan", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "log1p", "expm1", "log2",
                   "log10", "exp2", "erfc", "erfinv", "sinc", "logit", "deg2rad", "rad2deg"]


def _function(name, kw):
    return lambda M, x: getattr(M, name)(x, **kw)


def _method(name, kw):
    return lambda M, x: getattr(x, name)(**kw)


def _torch(fn, x, c=None):
    import torch

    xt = torch.tensor(x, requires_grad=x.dtype.kind == "f")
    out = fn(TorchNS(torch), xt)
    if c is not None:
        (out * torch.from_numpy(c)).sum().backward()
        return out.detach().numpy(), xt.grad.numpy(force=True)  # sgn: a ZeroTensor
    return out.detach().numpy(), None


def _check_against_torch(fn, x, rtol=1e-5, atol=1e-6):
    """``fn``'s value (numpy and ort-cpu) and gradient against torch's; returns the model."""
    want, _ = _torch(fn, x)
    model = gc.capture(lambda x: fn(F, x), x=gc.spec(x.dtype, ("N", *x.shape[1:])))
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"x": x})["output"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    if want.dtype.kind == "f" and x.dtype.kind == "f":
        c = np.random.default_rng(0).standard_normal(want.shape).astype(want.dtype)
        _, want_dx = _torch(fn, x, c)
        for backend in ("numpy", "ort-cpu"):
            grads = gc_grads(lambda M, x: fn(M, x), {"x": x}, {}, c, backend=backend)
            np.testing.assert_allclose(grads["x"], want_dx, rtol=1e-4, atol=1e-5, err_msg=backend)
    return model


@pytest.mark.parametrize("form", [_function, _method], ids=["function", "method"])
@pytest.mark.parametrize("name,x,kw", CASES, ids=IDS)
def test_matches_torch(name, x, kw, form):
    pytest.importorskip("torch")
    _check_against_torch(form(name, kw), x)


@pytest.mark.parametrize("name", FLOAT_FUNCTIONS)
def test_integer_and_bool_inputs_become_float32(name):
    """As torch's: ``torch.tan(int_tensor)`` is float32 (nan where out of the domain, as torch)."""
    pytest.importorskip("torch")
    for x in (INTS, INTS > 1):
        want, _ = _torch(_function(name, {}), x)
        model = gc.capture(lambda x: getattr(gc, name)(x), x=x)
        onnx.checker.check_model(model.proto, full_check=True)
        got = run_both(model, {"x": x})["output"]
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_clamp_bounds_that_are_tensors_broadcast():
    pytest.importorskip("torch")
    lo, hi = X[:1] * 0.5, X[:, :1] - 0.2
    for fn in (lambda M, x: M.clamp_min(x, lo if M is F else M.torch.from_numpy(lo)),
               lambda M, x: x.clamp_max(hi if M is F else M.torch.from_numpy(hi))):
        _check_against_torch(fn, X)


def test_hardshrink_method():
    pytest.importorskip("torch")
    _check_against_torch(lambda M, x: x.hardshrink() + x.hardshrink(lambd=1.0), X * 2)


def _tiny_and_huge(dtype) -> np.ndarray:
    mag = np.logspace(-30 if dtype == np.float32 else -200, 1.5, 300)
    edges = [0.0, -0.0, -1.0, -0.999999, -0.5, 0.5, 1.0, 1e30, np.inf, -np.inf, np.nan, 100.0, -100.0]
    return np.concatenate([mag, -mag[mag < 1], edges]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log1p_expm1_are_accurate_for_tiny_and_huge_inputs(dtype):
    """torch's log1p(1e-10) is 1e-10 in float32, where log(1 + x) is 0; the lowerings stay within a
    few ulps of float64 numpy (and of torch) from 1e-30 to 30, and give torch's -1, -inf, inf, nan."""
    torch = pytest.importorskip("torch")
    x = _tiny_and_huge(dtype)
    model = gc.capture(lambda x: {"log1p": gc.log1p(x), "expm1": gc.expm1(x)}, x=gc.spec(x.dtype, ["N"]))
    onnx.checker.check_model(model.proto, full_check=True)
    exact = {"log1p": np.log1p, "expm1": np.expm1}
    eps = np.finfo(dtype).eps
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": x})
        for name, got in out.items():
            want = getattr(torch, name)(torch.from_numpy(x)).numpy()
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=f"{backend} {name}")
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{backend} {name}")
            with np.errstate(all="ignore"):
                ref = exact[name](x.astype(np.float64))
            np.testing.assert_allclose(got[finite], ref[finite], rtol=4 * eps, atol=0, err_msg=f"{backend} {name}")
        assert out["log1p"][0] == x[0] and out["expm1"][0] == x[0]  # 1e-30: exactly x


def test_erfc_keeps_relative_accuracy_in_the_tail():
    """Where 1 - erf(x) rounds to 0 (x > 4 in float32), erfc stays within 5e-7 of torch's
    relative error, down to the smallest normal float32, and is 2 and 0 at -inf and inf."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-4, 9.1, 2000), [np.inf, -np.inf, np.nan]]).astype(np.float32)
    model = gc.capture(gc.erfc, x=gc.spec("float32", ["N"]))
    want = torch.erfc(torch.from_numpy(x)).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        np.testing.assert_allclose(got, want, rtol=5e-7, atol=0, err_msg=backend)
    x64 = np.linspace(-4, 26, 500)
    got = gc.Session(gc.capture(gc.erfc, x=x64), backend="numpy").run({"x": x64})["output"]
    np.testing.assert_allclose(got, torch.erfc(torch.from_numpy(x64)).numpy(), rtol=2e-7, atol=0)


def test_erfinv_is_accurate_up_to_the_edges():
    """Within 3e-7 of torch's relative error in float32 from 1e-30 to 1 - 6e-8 (both polynomials),
    +-inf at +-1 (with torch's infinite gradient) and nan beyond."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-1, 1, 2001), 1 - np.logspace(-7.2, -1, 100), np.logspace(-30, -1, 50),
                        [1.5, -2.0, np.nan]]).astype(np.float32)
    model = gc.capture(gc.erfinv, x=gc.spec("float32", ["N"]))
    want = torch.erfinv(torch.from_numpy(x)).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=0, err_msg=backend)
    edges = np.array([1.0, -1.0, 0.5], np.float32)
    c = np.ones(3, np.float32)
    _, want_dx = _torch(_function("erfinv", {}), edges, c)
    got = gc_grads(_function("erfinv", {}), {"x": edges}, {}, c)
    np.testing.assert_allclose(got["x"], want_dx, rtol=1e-5)


def test_log2_log10_of_powers_are_exact():
    """As torch's: log2(2**k) == k, log10(10**k) == k in float32 (the log is taken in float64)."""
    k = np.arange(-20, 21)
    x = np.concatenate([2.0 ** k, 10.0 ** k[10:-10]]).astype(np.float32)
    model = gc.capture(lambda x: {"log2": gc.log2(x), "log10": gc.log10(x), "exp2": gc.exp2(gc.log2(x))}, x=x)
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": x})
        np.testing.assert_array_equal(out["log2"][:41], k)
        np.testing.assert_array_equal(out["log10"][41:], k[10:-10])
        np.testing.assert_array_equal(out["exp2"][:41], x[:41])


@pytest.mark.parametrize("name,fn,x,backends", [
    ("log1p", lambda M, x: M.log1p(x), np.concatenate([PROB.ravel() * 4 - 0.9, [1e-9, -1e-12]]), ("numpy", "ort-cpu")),
    ("expm1", lambda M, x: M.expm1(x * 3), np.concatenate([X.ravel(), [1e-9, -1e-12]]), ("numpy", "ort-cpu")),
    ("erfc", lambda M, x: M.erfc(x * 3), X.ravel(), ("numpy", "ort-cpu")),
    ("erfinv", lambda M, x: M.erfinv(x), np.concatenate([UNIT.ravel(), [0.0, 0.998, -0.999]]), ("numpy", "ort-cpu")),
    ("sinc", lambda M, x: M.sinc(x), np.concatenate([X.ravel(), [0.0, 1.0]]), ("numpy", "ort-cpu")),
    ("logit_eps", lambda M, x: M.logit(x, eps=0.1), PROB.ravel(), ("numpy", "ort-cpu")),
    ("log2_log10_exp2", lambda M, x: M.log2(x) + M.log10(x) * M.exp2(x), POSITIVE.ravel(), ("numpy", "ort-cpu")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_float64_gradients_match_central_differences(name, fn, x, backends):
    assert_grads_match_central_differences(fn, x, backends=backends)


def test_gradients_at_the_edges_match_torch():
    """log1p at -1 (inf) and inf (0), expm1 at -inf (0), erfc at +-inf (0), sinc at 0 (0): torch's,
    not the nan a guard's other branch would give."""
    torch = pytest.importorskip("torch")
    x = np.array([-1.0, np.inf, -np.inf, 0.0, 1e-30, 2.0], np.float32)
    fn = lambda M, x: M.log1p(x[:2]) + M.expm1(x[2:4]) + M.erfc(x[1:3]) + M.sinc(x[3:5]) + M.erfc(x[4:])  # noqa: E731
    c = np.ones(2, np.float32)
    want, want_dx = _torch(fn, x, c)
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, {"x": x}, {}, c, backend=backend)
        np.testing.assert_array_equal(got["out"], want)
        np.testing.assert_allclose(got["x"], want_dx, rtol=1e-6, err_msg=backend)


def test_optimize_keeps_the_accurate_lowerings():
    x = np.array([1e-10, -3e-9, 1e-7], np.float32)
    model = gc.optimize(gc.capture(lambda x: {"l": gc.log1p(x), "e": gc.expm1(x)}, x=x), level=3)
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": x})
        np.testing.assert_allclose(out["l"], np.log1p(x.astype(np.float64)), rtol=2e-7)
        np.testing.assert_allclose(out["e"], np.expm1(x.astype(np.float64)), rtol=2e-7)


@pytest.mark.parametrize("opset", [17, 23])
def test_every_function_captures_at_the_opset_range_ends(opset):
    """Every function in one graph at opsets 17 and 23: the full checker, numpy and ort-cpu agree."""
    fns = {f"{name}_{i}": _function(name, kw) for i, (name, _, kw) in enumerate(CASES)}
    model = gc.capture(lambda x: {k: fn(F, x) for k, fn in fns.items()}, x=X, opset=opset)
    onnx.checker.check_model(model.proto, full_check=True)
    out = run_both(model, {"x": X})
    np.testing.assert_allclose(out["log1p_15"], np.log1p(X), rtol=1e-6)


UFUNCS = ["tan", "sinh", "cosh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "log1p", "expm1",
          "log2", "log10", "exp2", "deg2rad", "rad2deg", "signbit"]


@pytest.mark.parametrize("ufunc", [*UFUNCS, "radians", "degrees"])
def test_numpy_ufuncs_build_the_methods_nodes(ufunc):
    method = {"radians": "deg2rad", "degrees": "rad2deg"}.get(ufunc, ufunc)
    spec = gc.spec("float32", ("N", 3))
    ops = [[n.op_type for n in gc.capture(fn, x=spec).proto.graph.node]
           for fn in (lambda x: getattr(np, ufunc)(x), lambda x: getattr(x, method)())]
    assert ops[0] == ops[1]


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.logit(x, eps="small"), r"logit eps='small'; expected a number or None"),
    (lambda x: gc.positive(x > 0), r"positive \(\+x\) on a bool Tensor bool\[N,3\] is not supported"),
    (lambda x: np.sinc(x), r"np\.sinc cannot run on traced value .*use gc\.sinc\(\.\.\.\) instead"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3)))
    assert "test_dsl_elementwise.py" in str(err.value)
