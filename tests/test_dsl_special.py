"""Special functions (graphc.dsl.ops_special, gc.special) against torch: values over a wide grid
(tiny, huge, negative, near and at poles, +-inf, nan) in float64 and float32 on the numpy and
ort-cpu backends with a symbolic batch dim, through the full ONNX checker; gradients against
torch.autograd and float64 central differences; mpmath where torch's float64 is the less accurate;
Tensor methods and in-place forms; and the errors for bad arguments."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads

S, TS = gc.special, torch.special
GRID = np.array([0.0, -0.0, 1e-300, 1e-30, 1e-8, -1e-8, 0.1, 0.5, 1, 1.4616321449683623, 1.5, 2, 2.5, 3.7, 6, 9.99,
                 10, 10.5, 25, 100.5, 1e5, 1e15, 1e30, 1e300, -0.5, -1, -1.5, -2, -3.3, -7.3, -10.5, -100.25, -1e30,
                 np.inf, -np.inf, np.nan])
FINITE_NOT_POLE = GRID[np.isfinite(GRID) & ((GRID > 0) | (GRID != np.round(GRID))) & (np.abs(GRID) < 1e20)]
NORMAL = np.array([-1e5, -40, -30, -26, -10, -5, -1.5, -1.2, -1, -0.5, -1e-8, 0, 1e-8, 0.3, 1.2247, 1.23, 2, 5, 8,
                   10, 27, 40, 1e5, 1e120, np.inf, -np.inf, np.nan])
PROBS = np.array([0, 1, 0.5, 1e-300, 1e-20, 1e-10, 0.01, 0.13, 0.2, 0.7, 0.87, 0.9, 0.999, 1 - 1e-12, -0.1, 1.1,
                  np.nan])
A = np.array([0.5, 1, 2, 5, 10.5, 20, 0.01, 3, 0, 0, 1, np.inf, 1, -1, 0.5, np.nan, 3, 1e-3, 7, 2.5])
X = np.array([0.3, 1, 5, 4, 9, 30, 2, 1e-3, 0, 1, 0, 1, np.inf, 1, 100, 1, np.nan, 0.5, 7.9, 3.5])
FREXP = np.array([0.0, -0.0, 1, -3, 0.75, 1024, 1e-40, 3e38, 1e-310, 1e300, 2.0 ** -1074, 1 - 2 ** -53, np.inf,
                  -np.inf, np.nan, 2.0 ** 1023, -1.7976931348623157e308])  # exponent 1024: 2**1024 is inf

# (id, gc function, torch function, arrays, float64 rtol): gc's result must be torch's on both backends
VALUES = [
    ("lgamma", gc.lgamma, torch.lgamma, [GRID], 1e-10),
    ("digamma", gc.digamma, torch.digamma, [GRID], 1e-10),
    # torch's trigamma is ~5e-10 off (its asymptotic series is short): mpmath checks ours to 1e-14 below
    ("polygamma_1", lambda x: gc.polygamma(1, x), lambda x: torch.polygamma(1, x), [np.r_[FINITE_NOT_POLE, 0]], 2e-9),
    ("polygamma_2", lambda x: gc.polygamma(2, x), lambda x: torch.polygamma(2, x), [np.r_[FINITE_NOT_POLE, 0, -3]],
     1e-10),
    ("polygamma_5", lambda x: gc.polygamma(5, x), lambda x: torch.polygamma(5, x), [np.r_[FINITE_NOT_POLE, 0]], 1e-10),
    ("polygamma_0", lambda x: gc.polygamma(0, x), lambda x: torch.polygamma(0, x), [GRID], 1e-10),
    ("mvlgamma", lambda x: gc.mvlgamma(x, 3), lambda x: torch.mvlgamma(x, 3), [np.array([1.5, 2.2, 5, 30, 1e5])],
     1e-10),
    ("multigammaln", lambda x: S.multigammaln(x, 1), lambda x: TS.multigammaln(x, 1), [GRID[GRID > 0]], 1e-10),
    ("i0", gc.i0, torch.i0, [GRID], 1e-10),
    ("i0e", S.i0e, TS.i0e, [GRID], 1e-10),
    ("i1", S.i1, TS.i1, [GRID], 1e-10),
    ("i1e", S.i1e, TS.i1e, [GRID], 1e-10),
    # torch's igamma is ~1e-9 off for a above 20 (mpmath below): the grid stays at a <= 20 here
    ("igamma", gc.igamma, torch.igamma, [A, X], 1e-10),
    ("igammac", gc.igammac, torch.igammac, [A, X], 1e-10),
    ("gammainc", S.gammainc, TS.gammainc, [A[::-1].copy(), X], 1e-10),
    ("zeta", S.zeta, TS.zeta, [np.array([2, 1, 0.5, 2, 4, 2.5, 7, 1.5, 3, 2, 2, 11, 2, np.inf, np.inf, np.inf, np.inf,
                                         1e300, 1100, 60]),
                               np.array([1, 1, 1, 0, 2, 0.3, 1e-3, 1e5, -2, np.inf, np.nan, 0.7, 1e-30, 1, 0.5, 2, 0,
                                         0.468, 0.5, 1])],
     1e-10),
    ("bessel_j0", S.bessel_j0, TS.bessel_j0, [np.r_[GRID, 2.4048, 5.5201, 4.99, 5.01, 1e-5, 2e-5]], 1e-10),
    ("bessel_j1", S.bessel_j1, TS.bessel_j1, [np.r_[GRID, 3.8317, 7.0156, 4.99, 5.01, -1e4]], 1e-10),
    ("ndtr", S.ndtr, TS.ndtr, [NORMAL], 1e-10),
    ("log_ndtr", S.log_ndtr, TS.log_ndtr, [NORMAL], 1e-10),
    ("erfcx", S.erfcx, TS.erfcx, [NORMAL], 1e-10),
    ("ndtri", S.ndtri, TS.ndtri, [PROBS], 1e-10),
    ("entr", S.entr, TS.entr, [np.array([-1, 0, 1e-300, 0.5, 1, 7, np.inf, np.nan])], 1e-10),
    ("xlog1py", S.xlog1py, TS.xlog1py, [np.array([0, 0, 0, 1, 2, -1, 0, 3]),
                                        np.array([np.nan, -1, 3, 0.5, -0.5, np.inf, -2, 1e-20])], 1e-10),
    ("frexp_mantissa", lambda x: gc.frexp(x).mantissa, lambda x: torch.frexp(x).mantissa, [FREXP], 0),
    ("frexp_exponent", lambda x: gc.frexp(x)[1], lambda x: torch.frexp(x)[1], [FREXP], 0),
    ("ldexp", lambda x, e: gc.ldexp(x, e), lambda x, e: torch.ldexp(x, e.to(torch.int64)),
     [np.array([1, 2, -3, 0.75, 5, np.inf]), np.array([3, -2, 10, -1074, 0, 1])], 0),
]


def _run(fn, arrays: list, symbolic: bool = True) -> dict:
    """``fn`` captured on ``arrays`` (dim 0 symbolic), checked, run on numpy and ort-cpu."""
    names = [f"x{i}" for i in range(len(arrays))]
    specs = {n: gc.spec(a.dtype.name, ("N", *a.shape[1:])) if symbolic else a for n, a in zip(names, arrays)}
    with np.errstate(all="ignore"):
        model = gc.capture(lambda **kw: fn(*(kw[n] for n in names)), **specs)
    onnx.checker.check_model(model.proto, full_check=True)
    feeds = dict(zip(names, arrays))
    with np.errstate(all="ignore"):
        return {b: gc.Session(model, backend=b).run(feeds)["output"] for b in ("numpy", "ort-cpu")}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("fn", "tfn", "arrays", "rtol"), [c[1:] for c in VALUES], ids=[c[0] for c in VALUES])
def test_values_match_torch(fn, tfn, arrays, rtol, dtype):
    with np.errstate(all="ignore"):
        arrays = [a.astype(dtype) for a in arrays]
    want = tfn(*(torch.from_numpy(a) for a in arrays)).numpy()
    if dtype == "float32":  # computed in float64 and rounded: torch's float64 rounded is the oracle (torch's
        # own float32 trigamma is 2e-5 off at -100.25, from its float32 sin(pi x))
        with np.errstate(over="ignore"):
            want = tfn(*(torch.from_numpy(a.astype(np.float64)) for a in arrays)).numpy().astype(want.dtype)
    rtol, atol = (rtol, 1e-13) if dtype == "float64" else (1e-5 if rtol else 0, 1e-6 if rtol else 0)
    for backend, got in _run(fn, arrays).items():
        assert got.dtype == want.dtype and got.shape == want.shape, backend
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=backend)
        ok = np.abs(want) > atol  # the signs of tiny values and zeros are checked below, for frexp
        np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]), err_msg=f"{backend}: signs")


def test_frexp_keeps_signed_zeros_and_digamma_reads_them():
    x = np.array([0.0, -0.0])
    mantissas, psis = _run(lambda t: gc.frexp(t).mantissa, [x]), _run(gc.digamma, [x])
    for backend in mantissas:
        np.testing.assert_array_equal(np.signbit(mantissas[backend]), [False, True], err_msg=backend)
        np.testing.assert_array_equal(psis[backend], [-np.inf, np.inf], err_msg=backend)


def test_integer_inputs_become_float32_as_torch():
    ints = np.array([1, 2, 7], np.int64)
    for fn, tfn in [(gc.lgamma, torch.lgamma), (gc.digamma, torch.digamma), (gc.i0, torch.i0), (S.ndtr, TS.ndtr),
                    (lambda x: gc.ldexp(x, x), lambda x: torch.ldexp(x, x))]:
        want = tfn(torch.from_numpy(ints)).numpy()
        for got in _run(fn, [ints]).values():
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_more_accurate_than_torch_where_its_float64_is_short():
    """torch's trigamma and its igamma for large ``a`` are ~1e-9 off; ours agree with mpmath to 1e-13."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    x = np.array([0.5, 1, 2, 1.4616321, 3.7, 1e-3, 25, -2.5, -7.3])
    got = _run(lambda t: gc.polygamma(1, t), [x])
    exact = np.array([float(mpmath.polygamma(1, v)) for v in x])
    a, x = np.array([50, 100, 30, 20, 0.5, 80]), np.array([45, 110, 31, 21, 1.4, 60])
    lower, upper = _run(gc.igamma, [a, x]), _run(gc.igammac, [a, x])
    p = np.array([float(mpmath.gammainc(u, 0, v, regularized=True)) for u, v in zip(a, x)])
    for backend in got:
        np.testing.assert_allclose(got[backend], exact, rtol=1e-13, err_msg=backend)
        np.testing.assert_allclose(lower[backend], p, rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(upper[backend], 1 - p, rtol=1e-12, err_msg=backend)


POS = np.array([0.3, 1.7, 4.2, 12.5, 40.0])
NEG = np.array([-0.3, -1.7, -4.2, -12.5])
# (id, fn of the differentiated x, torch's, x, extra constant arrays)
GRADS = [
    ("lgamma", gc.lgamma, torch.lgamma, np.r_[POS, NEG]),
    ("digamma", gc.digamma, torch.digamma, np.r_[POS, NEG]),
    ("polygamma_1", lambda x: gc.polygamma(1, x), lambda x: torch.polygamma(1, x), np.r_[POS, NEG]),
    ("polygamma_2", lambda x: x.polygamma(2), lambda x: x.polygamma(2), np.r_[POS, NEG]),
    ("mvlgamma", lambda x: x.mvlgamma(2), lambda x: x.mvlgamma(2), POS + 1),
    ("i0", gc.i0, torch.i0, np.r_[POS, NEG, 9.0]),
    ("i0e", S.i0e, TS.i0e, np.r_[POS, NEG, 9.0]),
    ("i1", S.i1, TS.i1, np.r_[POS, NEG, 9.0, 0.0]),  # slope 1/2 at 0
    ("i1e", S.i1e, TS.i1e, np.r_[POS, NEG, 9.0, 0.0]),  # slope 1/2 at 0
    ("igamma_x", lambda x: gc.igamma(np.array([0.5, 2.0, 3.0, 7.0, 0.5]), x),
     lambda x: torch.igamma(torch.tensor([0.5, 2.0, 3.0, 7.0, 0.5], dtype=x.dtype), x), POS),
    ("igammac_x", lambda x: gc.igammac(np.full(5, 2.5), x),
     lambda x: torch.igammac(torch.full((5,), 2.5, dtype=x.dtype), x), POS),
    ("ndtr", S.ndtr, TS.ndtr, np.r_[POS, NEG, -30.0]),
    ("log_ndtr", S.log_ndtr, TS.log_ndtr, np.r_[POS, NEG, -30.0]),
    ("erfcx", S.erfcx, TS.erfcx, np.r_[POS, NEG, 1e3]),
    ("ndtri", S.ndtri, TS.ndtri, np.array([1e-20, 0.01, 0.3, 0.5, 0.8, 0.95, 1 - 1e-9])),
    ("entr", S.entr, TS.entr, POS),
    ("xlog1py", lambda x: S.xlog1py(x, np.array([0.5, -0.5, 3.0, 1e-3, 9.0])),
     lambda x: TS.xlog1py(x, torch.tensor([0.5, -0.5, 3.0, 1e-3, 9.0], dtype=x.dtype)), POS),
    ("frexp", lambda x: x.frexp()[0], lambda x: x.frexp()[0], np.r_[POS, NEG]),
    # a float exponent: torch's gradient for an integer one reads 2**other in integers (0 below 0)
    ("ldexp", lambda x: x.ldexp(np.array([1.0, -2, 3, 0, 5])),
     lambda x: x.ldexp(torch.tensor([1.0, -2, 3, 0, 5], dtype=x.dtype)), POS),
]


@pytest.mark.parametrize(("fn", "tfn", "x"), [c[1:] for c in GRADS], ids=[c[0] for c in GRADS])
def test_gradients_match_torch_autograd(fn, tfn, x):
    c = np.random.default_rng(0).standard_normal(x.shape)
    xt = torch.tensor(x, requires_grad=True)
    (tfn(xt) * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x: fn(x), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=backend)


CENTRAL = [
    ("lgamma", gc.lgamma, np.r_[POS, NEG]),
    ("digamma", gc.digamma, np.r_[POS, NEG]),
    ("polygamma_3", lambda x: gc.polygamma(3, x), np.r_[POS, NEG]),
    ("i1", S.i1, np.r_[POS, NEG, 9.0]),
    ("igamma", lambda x: gc.igamma(np.array([0.5, 2.0, 3.0, 7.0, 30.0]), x), POS),
    ("igammac", lambda x: gc.igammac(np.array([0.5, 2.0, 3.0, 7.0, 30.0]), x), POS),
    ("zeta_q", lambda x: S.zeta(np.array([2.0, 3.5, 1.5, 6.0, 2.0]), x), POS),
    ("zeta_x", lambda x: S.zeta(x + 1.0, np.array([0.5, 2.0, 1.0, 3.0, 0.1])), POS),
    ("log_ndtr", S.log_ndtr, np.r_[POS, NEG, -30.0]),
    ("erfcx", S.erfcx, np.r_[POS, NEG, 1e3]),
    ("ndtri", S.ndtri, np.array([1e-3, 0.01, 0.3, 0.5, 0.8, 0.95])),
    ("bessel_j0", S.bessel_j0, np.r_[POS, NEG, 9.0]),
    ("bessel_j1", S.bessel_j1, np.r_[POS, NEG, 9.0]),
]


@pytest.mark.parametrize(("fn", "x"), [c[1:] for c in CENTRAL], ids=[c[0] for c in CENTRAL])
def test_float64_gradients_match_central_differences(fn, x):
    assert_grads_match_central_differences(lambda M, x: fn(x), x)


def test_bessel_j_gradients_are_the_derivatives_torch_lacks():
    """torch has no gradient for bessel_j0/j1; graphc's is the lowering's: ``J0' = -J1``,
    ``J1' = J0 - J1 / x``, against torch's values, to the fits' accuracy (torch's own J0 is up to 4e-7
    off near x = 5.5)."""
    x = np.r_[POS, NEG, 9.0]
    j0, j1 = (f(torch.from_numpy(x)).numpy() for f in (TS.bessel_j0, TS.bessel_j1))
    for backend in ("numpy", "ort-cpu"):
        d0 = gc_grads(lambda M, x: S.bessel_j0(x), {"x": x}, {}, np.ones_like(x), backend=backend)["x"]
        d1 = gc_grads(lambda M, x: S.bessel_j1(x), {"x": x}, {}, np.ones_like(x), backend=backend)["x"]
        np.testing.assert_allclose(d0, -j1, rtol=0, atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(d1, j0 - j1 / x, rtol=0, atol=1e-6, err_msg=backend)


def test_igamma_sends_no_gradient_to_a():
    """torch raises for ``a``'s gradient; graphc's lowering reads ``a`` detached: zero."""
    got = gc_grads(lambda M, a, x: gc.igamma(a, x), {"a": np.array([1.5, 3.0]), "x": np.array([0.7, 2.0])}, {},
                   np.ones(2))
    np.testing.assert_array_equal(got["a"], 0)
    assert np.all(got["x"] > 0)


def test_methods_and_in_place_forms_are_torchs():
    x = np.array([0.7, 1.5, 3.2, -2.5])

    def body(M, t):
        u = t.clone()
        u.lgamma_()
        v = t.clone()
        v.polygamma_(1)
        w = t.clone()
        w.igammac_(M.abs(t) + 1)
        m, e = t.frexp()
        return (t.digamma() + t.i0() + t.polygamma(2) + t.abs().mvlgamma(1) + t.abs().igamma(M.abs(t) + 1) + u + v
                + w + m * e.double() + t.ldexp(e))

    want = body(torch, torch.from_numpy(x)).numpy()
    for got in _run(lambda t: body(gc, t), [x], symbolic=False).values():
        np.testing.assert_allclose(got, want, rtol=1e-9)


def test_special_namespace_has_torchs_names_and_aliases():
    """Every function of torch 2.13's torch.special, and no other name."""
    names = sorted(n for n in dir(TS) if not n.startswith("_") and n != "Tensor" and callable(getattr(TS, n)))
    assert len(names) == 56
    assert [n for n in names if not callable(getattr(S, n, None))] == []
    assert set(S.__all__) == set(names)
    # the same functions, under gc.special's refusal of complex Tensors (graphc.dsl.special._taking_complex)
    assert [inspect.unwrap(f) for f in (S.gammaln, S.psi, S.gammainc, S.gammaincc, S.erf)] == [
        inspect.unwrap(f) for f in (gc.lgamma, gc.digamma, gc.igamma, gc.igammac, gc.erf)]
    # gc.sigmoid also takes complex Tensors (graphc.dsl.complex_math), so it is another object; same values
    for got in _run(lambda t: S.expit(t) - gc.sigmoid(t), [np.linspace(-3.0, 3.0, 7)], symbolic=False).values():
        np.testing.assert_array_equal(got, 0.0)


def test_special_aliases_of_dsl_functions_match_torch():
    x = np.array([[-2.0, -0.3, 0.2, 0.5, 0.9, 3.0]])
    p = np.array([[0.1, 0.3, 0.2, 0.5, 0.9, 0.7]])

    def body(M, x, p):
        return (M.special.expit(x) + M.special.exp2(x) + M.special.expm1(x) + M.special.log1p(p) + M.special.logit(p)
                + M.special.xlogy(p, x * x) + M.special.sinc(x) + M.special.round(x * 3)
                + M.special.softmax(x, 1) + M.special.log_softmax(x, dim=-1) + M.special.logsumexp(x, 1, keepdim=True)
                + M.special.erf(x) + M.special.erfc(x) + M.special.erfinv(p))

    want = body(torch, torch.from_numpy(x), torch.from_numpy(p)).numpy()
    for got in _run(lambda x, p: body(gc, x, p), [x.astype(np.float32), p.astype(np.float32)]).values():
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    int_softmax = torch.special.softmax(torch.tensor([[1, 2]]), 1, dtype=torch.float64).numpy()
    np.testing.assert_allclose(_run(lambda t: S.softmax(t, 1, dtype="float64"), [np.array([[1, 2]])])["ort-cpu"],
                               int_softmax)


def test_other_opsets_run_the_same():
    x = np.array([0.3, -2.5, 7.0, 40.0])

    def fn(t):
        return gc.lgamma(t) + gc.polygamma(2, t) + S.i1(t) + S.ndtr(t) + gc.igamma(gc.abs(t), gc.abs(t) + 1)

    want = _run(fn, [x])["numpy"]
    with np.errstate(all="ignore"):
        model = gc.capture(lambda x: fn(x), x=x, opset=17)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want, rtol=1e-12)


@pytest.mark.parametrize(("fn", "match"), [
    (lambda x: gc.polygamma(-1, x), r"polygamma n=-1: expected an int >= 0"),
    (lambda x: gc.polygamma(1.5, x), r"polygamma n=1.5"),
    (lambda x: x.mvlgamma(0), r"mvlgamma p=0: expected an int >= 1"),
    (lambda x: gc.mvlgamma(x > 0, 2), r"mvlgamma\(bool\[3\]\): input: expected a float or integer Tensor, got bool"),
    (lambda x: gc.igamma(x.int(), x.int()), r"igamma input: expected float Tensors, got int32"),
    (lambda x: S.gammaincc(x.long(), x.long()), r"igammac input: expected float Tensors, got int64"),
    (lambda x: gc.frexp(x.int()), r"frexp input: expected a floating-point Tensor, got int32"),
    (lambda x: S.softmax(x.int(), 0), r"special.softmax input: expected a floating-point Tensor"),
    (lambda x: gc.igamma(x.int(), x.long()), r"igamma input: expected float Tensors, got int64"),
])
def test_bad_arguments_are_refused_naming_them(fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.ones(3, np.float32))
    assert "test_dsl_special.py:" in str(info.value)


def test_igamma_for_huge_a_near_and_far_from_x_is_torchs():
    """Above ``a = 100`` near ``x = a`` the fixed-length series and fraction fall short (0.996 at a = x = 1e20,
    torch 0.5): Temme's expansion takes over. ``a`` a power of two and ``x / a`` dyadic keep torch's own
    ``x / a - 1`` exact (else its float64 is ~1e-7 off at a = 1e20); torch's float64 is ~1e-10 off here, so
    mpmath checks ours to 1e-14 where it converges (a up to 2**10); float32 against torch's float64 on the
    rounded inputs, as above. The x-gradient against torch.autograd's for a up to 2**20 (beyond, torch's
    ``(a - 1) log x - x - lgamma(a)`` cancels)."""
    mpmath = pytest.importorskip("mpmath")
    ratios = np.array([1, 1 + 2.0 ** -40, 1 - 2.0 ** -38, 1 + 2.0 ** -34, 1 - 2.0 ** -30, 1 + 2.0 ** -20,
                       1 - 2.0 ** -12, 1 + 2.0 ** -9, 1 - 2.0 ** -6, 1.25, 0.75, 0.7, 1.3, 0.5, 2])
    a = 2.0 ** np.repeat([7, 8, 10, 14, 20, 33, 50, 66], ratios.size)
    a, x = np.r_[a, 1e20, 1e20, 1e20], np.r_[a * np.tile(ratios, 8), 1e20, 0.5e20, 2e20]
    for dtype in ("float64", "float32"):
        arrays = [a.astype(dtype), x.astype(dtype)]
        for fn, tfn in ((gc.igamma, torch.igamma), (gc.igammac, torch.igammac)):
            want = tfn(*(torch.from_numpy(v.astype(np.float64)) for v in arrays)).numpy().astype(dtype)
            rtol, atol = (1e-9, 5e-10) if dtype == "float64" else (1e-5, 1e-6)
            for backend, got in _run(fn, arrays).items():
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{fn.__name__} {dtype} {backend}")
    near = a <= 2.0 ** 10
    with mpmath.workdps(30):
        want = [float(mpmath.gammainc(mpmath.mpf(ai), 0, mpmath.mpf(xi), regularized=True))
                for ai, xi in zip(a[near], x[near])]
    for backend, got in _run(gc.igamma, [a[near], x[near]]).items():
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15, err_msg=backend)
    small = a <= 2.0 ** 20
    at, xt = torch.from_numpy(a[small]), torch.tensor(x[small], requires_grad=True)
    c = np.random.default_rng(0).standard_normal(xt.shape)
    (torch.igamma(at, xt) * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x: gc.igamma(a[small], x), {"x": x[small]}, {}, c, backend=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-7, atol=1e-15, err_msg=backend)
