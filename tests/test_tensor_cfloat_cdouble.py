"""``x.cfloat()`` / ``x.cdouble()`` (absent before, found by ``scripts/reach_sweep.py``): torch's complex casts
of a real Tensor (and of a complex one), their values and dtypes on the numpy and ort-cpu backends, and the
float64 gradient of a real loss through ``cdouble()`` against torch.autograd to 1e-10."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

try:
    from torch_grad_util import run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import run_both

torch = pytest.importorskip("torch")

X = np.array([[1.5, -2.0, 0.0], [0.25, 3.0, -0.5]])
W = np.array([0.5 - 1.0j, 2.0 + 0.25j, -1.0 + 1.5j])


def test_cfloat_and_cdouble_values_and_dtypes_match_torch():
    model = gc.capture(lambda x: (x.cfloat(), x.cdouble(), x.float().cfloat()), x=gc.spec("float64", ("N", 3)))
    t = torch.from_numpy(X)
    for got, want in zip(run_both(model, {"x": X}).values(), (t.cfloat(), t.cdouble(), t.float().cfloat())):
        assert got.dtype == np.dtype(str(want.dtype).removeprefix("torch."))
        np.testing.assert_array_equal(got, want.numpy())


def test_cfloat_and_cdouble_of_a_complex_tensor_match_torch():
    """A complex Tensor's casts (complex128 -> complex64 -> complex128): refused before ('cfloat does not take
    complex Tensors')."""
    def fn(M, x):
        z = M.complex(x, -2.0 * x)
        return z.cfloat(), z.cfloat().cdouble(), z.cdouble()

    model = gc.capture(lambda x: fn(gc, x), x=gc.spec("float64", ("N", 3)))
    for got, want in zip(run_both(model, {"x": X}).values(), fn(torch, torch.from_numpy(X))):
        assert got.dtype == np.dtype(str(want.dtype).removeprefix("torch."))
        np.testing.assert_array_equal(got, want.numpy())


def test_gradient_through_cdouble_matches_torch():
    def loss(M, x):
        return (x.cdouble() * M.complex(M.from_numpy(W.real), M.from_numpy(W.imag))).abs().sum()

    xt = torch.tensor(X, requires_grad=True)
    want = loss(torch, xt)
    want.backward()
    model = gc.grad(gc.capture(lambda x: {"loss": loss(gc, x)}, x=X), "loss", wrt=["x"])
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": X})
        np.testing.assert_allclose(got["loss"], want.item(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
