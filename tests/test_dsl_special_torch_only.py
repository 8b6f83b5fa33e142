"""torch.special's Bessel/Airy functions and orthogonal polynomials that torch does not differentiate
(graphc.dsl.special_bessel, graphc.dsl.special_polynomials) against torch 2.13: values over wide grids
(0, negatives, the ends of the polynomials' intervals, huge, +-inf, nan; Tensor and static degrees, negative,
fractional, nan and inf degrees) in float64 and float32 on numpy and ort-cpu through the full ONNX checker;
torch's result dtypes; and autodiff's refusal, by name, where torch has no derivative."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.errors import MissingGradientRule

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

S, TS = gc.special, torch.special
X = np.array([0.0, -0.0, 1e-300, 1e-8, -1e-8, 0.1, 0.5, 1, 1.5, 2, 2.08, 2.1, 2.5, 3.7, 4.99, 5, 5.01, 6, 8, 8.33,
              9.99, 10, 25, 100.5, 103, 104, 1e5, 1e15, 1e300, -0.5, -1, -1.5, -2, -2.08, -2.1, -3.3, -7.3, -10.5,
              -100.25, -1e5, -1e300, np.inf, -np.inf, np.nan])
BESSELS = ["airy_ai", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0",
           "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0"]
CHEBYSHEV = [f"{s}chebyshev_polynomial_{k}" for s in ("", "shifted_") for k in "tuvw"]
POLYNOMIALS = [*CHEBYSHEV, "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
               "legendre_polynomial_p"]
XS = np.array([0.0, -0.0, 1e-8, 0.1, 0.3, 0.5, 0.7, 0.99, 1, -1, -0.3, -0.99, 1.5, -1.5, 2, -3, 10, 1e3, np.inf,
               -np.inf, np.nan, 1 - 1e-16, -1 + 2.2e-16])
NS = np.array([-3, -0.5, 0, 1, 2, 2.7, 3, 4, 5, 6, 7, 8, 9, 10, 13, 25, 40, 100, np.nan, np.inf, -np.inf])
GRID_X, GRID_N = (a.ravel() for a in np.meshgrid(XS, NS))


def _run(fn, arrays: list) -> dict:
    """``fn`` captured on ``arrays`` (dim 0 symbolic), checked, run on numpy and ort-cpu."""
    names = [f"x{i}" for i in range(len(arrays))]
    specs = {n: gc.spec(a.dtype.name, ("N", *a.shape[1:])) for n, a in zip(names, arrays)}
    with np.errstate(all="ignore"):
        model = gc.capture(lambda **kw: fn(*(kw[n] for n in names)), **specs)
    onnx.checker.check_model(model.proto, full_check=True)
    with np.errstate(all="ignore"):
        return {b: gc.Session(model, backend=b).run(dict(zip(names, arrays)))["output"] for b in ("numpy", "ort-cpu")}


def _near_ends(name: str, x: np.ndarray) -> np.ndarray:
    """Where a Chebyshev ``cos``/``sin`` of ``n acos(y)`` reads ``y`` within 1e-12 of +-1: there ``n`` times one
    ulp of ``acos`` near pi (or ``sin(theta / 2)`` rounding to 1) moves the value, so ort-cpu's written-out
    float64 ``Acos`` (a few ulps from libm's) is held to 1e-7 (torch's own error against the exact value there
    is 1.5e-9 at degree 40)."""
    y = 2 * x - 1 if name.startswith("shifted") else x
    with np.errstate(invalid="ignore"):
        return (np.abs(np.abs(y) - 1) < 1e-12) & (np.abs(y) != 1) & (name in CHEBYSHEV)


def _assert_close(got, want, rtol, near=None, err_msg=""):
    assert got.dtype == want.dtype and got.shape == want.shape, err_msg
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=err_msg)
    ok = ~np.isnan(want) & (True if near is None else ~near)
    np.testing.assert_allclose(got[ok], want[ok], rtol=rtol, atol=rtol * 1e-3, err_msg=err_msg)
    if near is not None and near.any():
        np.testing.assert_allclose(got[near], want[near], rtol=1e-7, err_msg=f"{err_msg} near +-1")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", BESSELS)
def test_bessel_values_match_torch(name, dtype):
    with np.errstate(over="ignore"):
        x = X.astype(dtype)
    want = getattr(TS, name)(torch.from_numpy(x.astype(np.float64))).numpy().astype(dtype)  # float64, rounded
    own = getattr(TS, name)(torch.from_numpy(x)).numpy()
    moderate = np.abs(x) <= 10  # beyond, torch's float32 phase (airy_ai: 2 |x|**1.5 / 3) is off by radians
    for backend, got in _run(getattr(S, name), [x]).items():
        _assert_close(got, want, 1e-12 if dtype == "float64" else 1e-6, err_msg=backend)
        if dtype == "float32":
            _assert_close(got[moderate], own[moderate], 1e-4, err_msg=f"{backend} vs torch float32")


def test_modified_bessel_i_equal_i0_i1():
    for new, old in [("modified_bessel_i0", "i0"), ("modified_bessel_i1", "i1")]:
        got, want = _run(getattr(S, new), [X]), _run(getattr(S, old), [X])
        for backend in got:
            np.testing.assert_array_equal(got[backend], want[backend], err_msg=f"{new} {backend}")


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_with_a_tensor_degree_match_torch(name):
    """Each element steps to its own degree in one Loop; -0.5 and 2.7 truncate, nan and +-inf degrees give 0.
    torch reads an unset value for a nan ``x`` at degree 2 and up (its loop stops before the first step):
    graphc gives nan there."""
    want = getattr(TS, name)(torch.from_numpy(GRID_X), torch.from_numpy(GRID_N)).numpy()
    unset = np.isnan(GRID_X) & (GRID_N >= 2) & np.isfinite(GRID_N)
    want[unset] = np.nan
    for backend, got in _run(getattr(S, name), [GRID_X, GRID_N]).items():
        _assert_close(got, want, 1e-10, _near_ends(name, GRID_X) if backend == "ort-cpu" else None, err_msg=backend)


@pytest.mark.parametrize("n", [-2, 0, 1, 3, 7, 9, 32, 40])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_with_a_static_degree_match_torch(name, n):
    """Unrolled to degree 32, a Loop beyond; float32 is float64's value rounded (torch's float32 close)."""
    for dtype in ("float64", "float32"):
        x = XS.astype(dtype)
        want = getattr(TS, name)(torch.from_numpy(x.astype(np.float64)), n).numpy().astype(dtype)
        if n >= 2:
            want[np.isnan(XS)] = np.nan
        for backend, got in _run(lambda t: getattr(S, name)(t, n), [x]).items():
            near = _near_ends(name, x.astype(np.float64)) if backend == "ort-cpu" else None
            _assert_close(got, want, 1e-10 if dtype == "float64" else 1e-6, near, err_msg=f"{backend} {dtype}")


def test_hermite_is_nan_above_torchs_degree_limit():
    """torch: nan above degree 512 in float64, 128 in float32 (where the float64 recurrence gives +-inf, or a
    finite value at degree 129 in float64)."""
    x = np.array([0.0, 0.1, -0.2])
    for dtype, limit in [("float64", 512), ("float32", 128)]:
        for name in ("hermite_polynomial_h", "hermite_polynomial_he"):
            want = getattr(TS, name)(torch.from_numpy(x.astype(dtype)), limit + 1).numpy()
            assert np.isnan(want).all()
            for backend, got in _run(lambda t: getattr(S, name)(t, limit + 1), [x.astype(dtype)]).items():
                assert np.isnan(got).all(), (name, dtype, backend)
    assert np.isfinite(_run(lambda t: S.hermite_polynomial_he(t, 129), [x])["numpy"]).all()


def test_polynomial_result_dtypes_are_torchs():
    cases = [(np.array([1, 2]), 3), (np.array([0.5, 2], np.float32), np.array([3, 2])),
             (np.array([0.5, 2], np.float32), np.array([3.0, 2.0])), (np.array([1, 2]), np.array([3, 2])),
             (np.array([0.5], np.float32), 2.5)]
    for x, n in cases:
        want = TS.chebyshev_polynomial_t(torch.from_numpy(x), torch.from_numpy(n) if isinstance(n, np.ndarray)
                                         else n).numpy()
        arrays = [x, n] if isinstance(n, np.ndarray) else [x]
        fn = S.chebyshev_polynomial_t if isinstance(n, np.ndarray) else (lambda t: S.chebyshev_polynomial_t(t, n))
        for backend, got in _run(fn, arrays).items():
            assert got.dtype == want.dtype, (x.dtype, n, backend)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=backend)


def test_polynomial_degree_must_be_a_number_or_tensor():
    with pytest.raises(gc.CaptureError, match=r"special.legendre_polynomial_p n: expected an int, a float or a "
                                              r"Tensor, got str"):
        gc.capture(lambda x: S.legendre_polynomial_p(x, "3"), x=np.ones(2))


@pytest.mark.parametrize("name", BESSELS + POLYNOMIALS)
def test_autodiff_refuses_what_torch_does_not_differentiate(name):
    """torch's result does not require grad; graphc's gradient refuses, naming the function, where its
    input is on the path to the loss, and passes when the input is detached."""
    def call(ns, t):
        fn = getattr(ns, name)
        return fn(t) if name in BESSELS else fn(t, 3)

    x = np.array([0.3, 0.7, 1.5])
    assert not call(TS, torch.tensor(x, requires_grad=True)).requires_grad
    with pytest.raises(MissingGradientRule, match=rf"special\.{name} has no derivative \(torch 2\.13 defines none"):
        gc_grads(lambda M, x: call(S, x) * x, {"x": x}, {}, np.ones(3))
    got = gc_grads(lambda M, x: call(S, gc.detach(x)) * x, {"x": x}, {}, np.ones(3))
    np.testing.assert_allclose(got["x"], call(TS, torch.from_numpy(x)).numpy(), rtol=1e-12)


def test_refusal_comes_through_a_training_graph():
    class Model(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(np.array([0.5, 1.5]))

        def forward(self, x):
            return {"loss": gc.sum(S.airy_ai(self.w * x))}

    model = gc.capture(Model(), x=np.ones(2, np.float32))
    with pytest.raises(MissingGradientRule, match=r"special\.airy_ai has no derivative"):
        gc.grad(model, "loss")
