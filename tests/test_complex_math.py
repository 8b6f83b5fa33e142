"""Complex elementwise math (``graphc.dsl.complex_math``: log, sqrt, the trigonometric and hyperbolic functions
and their inverses, ...) against torch 2.13 in complex128 on the numpy backend and ort-cpu: values at random
points of many magnitudes and at points on and near every branch cut (signed zero imaginary and real parts),
to 1e-12 of ``|want|`` (or 1e-15 absolute: torch's own ``acos`` near 1 is ``pi/2 - asin``, off by 8e-17); the
gradients of a complex Parameter as torch's ``.grad``; the predicates and ``isclose``/``allclose``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl.tensor import ComplexTensor

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]

UNARY = ("sqrt rsqrt reciprocal square log log2 log10 log1p expm1 sigmoid sin cos tan sinh cosh tanh asin acos atan "
         "asinh acosh atanh arcsin arccos arctan arcsinh arccosh arctanh sgn neg negative conj_physical exp abs "
         "angle").split()


def _points() -> tuple[np.ndarray, np.ndarray]:
    """Real and imaginary parts: random points of magnitudes 0.05 to 20, then the branch points' axes (cuts of
    log, sqrt, log1p, acosh on the real axis left of 1; asin, acos, atanh beyond +-1; asinh, atan on the
    imaginary axis beyond +-i) at exact +-0 and 1e-12, 1e-6 off them, and large |x| for tanh's far form."""
    z = (RNG.standard_normal(400) + 1j * RNG.standard_normal(400)) * np.exp(RNG.uniform(-3, 3, 400))
    re, im = [z.real], [z.imag]
    for v in (-30.0, -3.0, -2.0, -1.5, -1.0, -0.5, -1e-8, 0.0, 1e-8, 0.5, 1.0, 1.5, 2.0, 3.0, 30.0):
        off = np.array([0.0, -0.0, 1e-12, -1e-12, 1e-6, -1e-6])
        re += [np.full(6, v), off]
        im += [off, np.full(6, v)]
    return np.concatenate(re), np.concatenate(im)


X, Y = _points()


def _torch_fn(name):
    return lambda z: getattr(torch, name)(z)


def _complex_run(fn, backend, x, y):
    def forward(x, y):
        out = fn(gc.complex(x, y))
        return gc.view_as_real(out) if isinstance(out, ComplexTensor) else out
    model = gc.capture(forward, x=gc.spec("float64", x.shape), y=gc.spec("float64", y.shape))
    return next(iter(gc.Session(model, backend=backend).run({"x": x, "y": y}).values()))


def _assert_close(got, want):
    """``got`` (the [..., 2] pair, or real) is ``want`` (torch's): the same nan and inf entries, the rest within
    1e-12 of the modulus of ``want`` or 1e-15."""
    want = torch.view_as_real(want.resolve_conj()).numpy() if want.is_complex() else want.numpy()[..., None]
    got = got.reshape(want.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    infinite = np.isinf(want)
    np.testing.assert_array_equal(got[infinite], want[infinite])
    finite = np.isfinite(want).all(-1)
    error = np.hypot(*np.moveaxis(np.where(np.isfinite(want), got - want, 0.0), -1, 0)) if want.shape[-1] == 2 \
        else np.abs(np.nan_to_num(got - want))[..., 0]
    size = np.hypot(*np.moveaxis(np.nan_to_num(want), -1, 0)) if want.shape[-1] == 2 else np.abs(want[..., 0])
    bad = finite & (error > 1e-12 * size + 1e-15)
    assert not bad.any(), f"{bad.sum()} off, at {np.nonzero(bad)[0][:3]}: got {got[bad][:3]}, want {want[bad][:3]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", UNARY)
def test_each_function_matches_torch_on_and_near_its_branch_cuts(name, backend):
    got = _complex_run(lambda z: getattr(gc, name)(z), backend, X, Y)
    with np.errstate(all="ignore"):
        _assert_close(got, getattr(torch, name)(torch.complex(torch.from_numpy(X), torch.from_numpy(Y))))


def test_each_method_matches_torch_s():
    x, y = X[:50], Y[:50]
    for name in UNARY:
        got = _complex_run(lambda z: getattr(z, name)(), "numpy", x, y)
        _assert_close(got, getattr(torch.complex(torch.from_numpy(x), torch.from_numpy(y)), name)())


def test_the_cuts_take_the_side_of_the_signed_zero():
    """Spot values at the cuts, written out: the imaginary part's sign picks the side, as torch's."""
    z = np.array([-4.0, -4.0, 2.0, 2.0]), np.array([0.0, -0.0, 0.0, -0.0])
    for name, want in [("sqrt", [2j, -2j, 2 ** 0.5, 2 ** 0.5]),
                       ("log", [np.log(4) + np.pi * 1j, np.log(4) - np.pi * 1j, np.log(2), np.log(2)]),
                       ("atanh", [np.arctanh(-0.25) + np.pi / 2 * 1j, np.arctanh(-0.25) - np.pi / 2 * 1j,
                                  np.arctanh(0.5) + np.pi / 2 * 1j, np.arctanh(0.5) - np.pi / 2 * 1j])]:
        got = _complex_run(lambda z: getattr(gc, name)(z), "ort-cpu", *z)
        np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-15, atol=1e-15, err_msg=name)


class _Leaf(gc.nn.Module):
    def __init__(self, fn, z):
        super().__init__()
        self.fn = fn
        self.z = gc.nn.Parameter(z, dtype=gc.complex128)

    def forward(self, x, r):
        out = self.fn(gc, self.z, x)
        return _weighted(gc.view_as_real(out) if isinstance(out, ComplexTensor) else out, r)


def _weighted(out, r):
    """The real loss: ``out``'s (real, imag) pair, or a real ``out``, times the weights ``r``, summed."""
    return (out * r).sum() if out.ndim == r.ndim else (out * r[..., 0]).sum()


GRADIENTS = {
    **{name: (lambda name: lambda m, z, x: getattr(m, name)(z))(name) for name in UNARY},
    "abs_squared": lambda m, z, x: m.sin(z).abs() ** 2,
    "real_part": lambda m, z, x: m.atanh(z * 0.5).real,
    "div_by_complex": lambda m, z, x: m.log(z) / (z.conj() + 3),
    "div_by_real": lambda m, z, x: m.sqrt(z) / x,
    "number_over": lambda m, z, x: 2.5 / m.tan(z),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_of_a_complex_parameter_match_torch_s_grad(name, backend):
    fn, shape = GRADIENTS[name], (4, 5)
    z = RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)
    x, r = RNG.uniform(1, 2, shape), RNG.standard_normal((*shape, 2))
    model = gc.capture(_Leaf(fn, z), x=gc.spec("float64", shape), r=gc.spec("float64", r.shape))
    got = gc.Session(gc.grad(model, "output"), backend=backend).run({"x": x, "r": r})
    zt = torch.tensor(z, requires_grad=True)
    out = fn(torch, zt, torch.from_numpy(x))
    loss = _weighted(torch.view_as_real(out) if out.is_complex() else out, torch.from_numpy(r))
    loss.backward()
    np.testing.assert_allclose(got["output"], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(got["z_grad"], torch.view_as_real(zt.grad).numpy(), rtol=1e-10, atol=1e-12)


def test_sgn_of_zero_is_zero_with_torch_s_zero_gradient():
    model = gc.capture(_Leaf(GRADIENTS["sgn"], np.zeros((2, 3), complex)), x=gc.spec("float64", (2, 3)),
                       r=gc.spec("float64", (2, 3, 2)))
    got = gc.Session(gc.grad(model, "output"), backend="ort-cpu").run({"x": np.ones((2, 3)), "r": np.ones((2, 3, 2))})
    assert got["output"] == 0
    np.testing.assert_array_equal(got["z_grad"], np.zeros((2, 3, 2)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_predicates_and_isclose_match_torch(backend):
    inf, nan = np.inf, np.nan
    x = np.array([1.0, inf, -inf, nan, 0.0, 1.0, nan, 2.0, 1.0 + 1e-9, 1.0])
    y = np.array([2.0, 0.0, 1.0, 1.0, nan, inf, nan, -0.0, 2.0, 2.0 + 3e-5])
    zt = torch.complex(torch.from_numpy(x), torch.from_numpy(y))
    other = torch.complex(torch.ones(10, dtype=torch.float64), torch.full((10,), 2.0, dtype=torch.float64))
    for name in ("isfinite", "isnan", "isinf"):
        np.testing.assert_array_equal(_complex_run(getattr(gc, name), backend, x, y), getattr(torch, name)(zt).numpy())
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}, {"rtol": 0.0, "atol": 0.0}):
        got = _complex_run(lambda z: gc.isclose(z, 1 + 2j, **kwargs), backend, x, y)
        np.testing.assert_array_equal(got, torch.isclose(zt, other, **kwargs).numpy(), err_msg=str(kwargs))
        got = _complex_run(lambda z: gc.allclose(z[7:], 1 + 2j, **kwargs), backend, x, y)
        assert bool(got) == torch.allclose(zt[7:], other[7:], **kwargs), kwargs


@pytest.mark.parametrize("fn,match", [
    (lambda x: gc.isclose(gc.complex(x, x), 1j, rtol=-1.0), r"isclose rtol=-1.0; expected a number >= 0"),
    (lambda x: gc.log(1j) + x, r"log: input must be a Tensor, as torch's, got complex 1j \(at .*test_complex_math"),
    (lambda x: gc.atanh(np.array([2j])) + x, r"atanh: input must be a Tensor, as torch's, got ndarray"),
])
def test_bad_inputs_are_capture_errors_naming_the_problem(fn, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(fn, x=gc.spec("float64", (3,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_division_by_huge_tiny_and_zero_divisors_matches_torch(backend):
    """torch divides as Smith (no ``|b|**2`` to overflow or underflow), and by 0 gives ``a.real / 0, a.imag / 0``."""
    x, y = RNG.standard_normal(12), RNG.standard_normal(12)
    d = np.array([1e200, -3e180, 1e-200, 2e-190, 0.0, -0.0, 1.0, 0.0, 5e170, 1e-170, 2.0, 0.0])
    e = np.array([3e199, 1e200, -2e-200, 0.0, 0.0, 0.0, 0.0, -1e-300, 1e-10, 3e-170, 0.5, 1.0])
    got = _complex_run(lambda z: z / gc.complex(gc.from_numpy(d), gc.from_numpy(e)), backend, x, y)
    torch_z = torch.complex(torch.from_numpy(x), torch.from_numpy(y))
    with np.errstate(all="ignore"):
        _assert_close(got, torch_z / torch.complex(torch.from_numpy(d), torch.from_numpy(e)))
