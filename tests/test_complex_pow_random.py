"""Complex powers (``z ** w``, ``gc.pow``: ``graphc.dsl.complex_pow``) against torch 2.13 in complex128 on the
numpy backend and ort-cpu, values and the gradients of complex Parameters (torch's ``.grad``, its conjugate
Wirtinger convention, as the (real, imag) pair); and complex random draws (``graphc.dsl.complex_random``): the
moments of 1e5 draws, and torch's own draws, within 5 standard errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]
SHAPE = (3, 4)

POWERS = {
    "square": lambda m, z, w, x: z ** 2,
    "negative_cube": lambda m, z, w, x: z ** -3,
    "zeroth": lambda m, z, w, x: z ** 0 * w,
    "sqrt": lambda m, z, w, x: z ** 0.5,
    "complex_exponent": lambda m, z, w, x: z ** w,
    "complex_number_exponent": lambda m, z, w, x: z ** (0.3 - 1.2j),
    "real_tensor_base": lambda m, z, w, x: x ** w,
    "number_base": lambda m, z, w, x: 2.5 ** w,
    "negative_number_base": lambda m, z, w, x: (-1.5) ** w,
    "pow_real_exponent": lambda m, z, w, x: m.pow(z, x),
    "pow_complex": lambda m, z, w, x: m.pow(z, w * 0.5) + z.pow(3),
    "real_tensor_to_complex_number": lambda m, z, w, x: x ** (1 + 2j) * z,
}


class _Powers(gc.nn.Module):
    def __init__(self, fn, z, w):
        super().__init__()
        self.fn = fn
        self.z = gc.nn.Parameter(z, dtype=gc.complex128)
        self.w = gc.nn.Parameter(w, dtype=gc.complex128)

    def forward(self, x, r):
        return (gc.view_as_real(self.fn(gc, self.z, self.w, x)) * r).sum()


def _complex():
    return RNG.standard_normal(SHAPE) + 1j * RNG.standard_normal(SHAPE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(POWERS))
def test_complex_powers_and_their_gradients_match_torch(name, backend):
    fn = POWERS[name]
    z, w, x, r = _complex(), _complex() * 0.5, RNG.standard_normal(SHAPE), RNG.standard_normal((*SHAPE, 2))
    model = gc.capture(_Powers(fn, z, w), x=gc.spec("float64", SHAPE), r=gc.spec("float64", r.shape))
    got = gc.Session(gc.grad(model, "output"), backend=backend).run({"x": x, "r": r})
    zt, wt = (torch.tensor(v, requires_grad=True) for v in (z, w))
    out = fn(torch, zt, wt, torch.from_numpy(x))
    loss = (torch.view_as_real(out) * torch.from_numpy(r)).sum()
    loss.backward()
    np.testing.assert_allclose(got["output"], loss.item(), rtol=1e-12)
    for param, leaf in (("z", zt), ("w", wt)):
        want = np.zeros(SHAPE + (2,)) if leaf.grad is None else torch.view_as_real(leaf.grad).numpy()
        np.testing.assert_allclose(got[f"{param}_grad"], want, rtol=1e-10, atol=1e-10 * max(1.0, np.abs(want).max()))


def test_square_of_zero_has_torch_s_zero_gradient():
    model = gc.capture(_Powers(POWERS["square"], np.zeros(SHAPE, complex), _complex()),
                       x=gc.spec("float64", SHAPE), r=gc.spec("float64", (*SHAPE, 2)))
    got = gc.Session(gc.grad(model, "output"), backend="ort-cpu").run({"x": np.ones(SHAPE), "r": np.ones((*SHAPE, 2))})
    np.testing.assert_array_equal(got["z_grad"], np.zeros(SHAPE + (2,)))


N = 100_000
# (mean, variance) of each part: torch's randn draws N(0, 1/2) parts (E|z|^2 = 1), rand U[0, 1) parts
MOMENTS = {"randn": (0.0, 0.5), "rand": (0.5, 1 / 12)}


def _check_moments(parts: np.ndarray, kind: str) -> None:
    """``parts`` ``[N, 2]`` (real, imag) have ``kind``'s moments and no covariance, to 5 standard errors."""
    mean, var = MOMENTS[kind]
    fourth = 3 * var ** 2 if kind == "randn" else 1 / 80  # E (p - mean)^4
    np.testing.assert_allclose(parts.mean(0), mean, atol=5 * np.sqrt(var / N))
    np.testing.assert_allclose(parts.var(0), var, atol=5 * np.sqrt((fourth - var ** 2) / N))
    assert abs(np.cov(parts.T)[0, 1]) < 5 * var / np.sqrt(N)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_random_draws_have_torch_s_moments(dtype, backend):
    def draws(x):
        like = gc.zeros(N, dtype=dtype) + x
        return {"randn": gc.randn(N, dtype=dtype), "rand": gc.rand(N, dtype=dtype),
                "randn_like": gc.randn_like(like), "rand_like": gc.rand_like(like)}

    part = "float32" if dtype == "complex64" else "float64"
    out = gc.Session(gc.capture(draws, x=gc.spec(part, ())), backend=backend).run({"x": np.zeros((), part)})
    for name, z in out.items():
        assert z.dtype == np.dtype(dtype) and z.shape == (N,), name
        _check_moments(np.stack([z.real, z.imag], -1).astype(np.float64), name.removesuffix("_like"))
    for kind in MOMENTS:  # the oracle: torch's own draws pass the same checks
        z = getattr(torch, kind)(N, dtype=getattr(torch, dtype))
        _check_moments(torch.view_as_real(z).double().numpy(), kind)
