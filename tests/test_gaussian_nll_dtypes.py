"""``F.gaussian_nll_loss`` and ``nn.GaussianNLLLoss`` promote float Tensors of different dtypes as torch 2.13's:
a float64 ``var`` (or target) on a float32 input gives a float64 loss, a float64 input takes a float32 target; the
input's gradient stays in its dtype. Each op runs in the dtype torch's does (``x - target`` in float32 for a float64
``var`` only), so a float64 ``var`` gives torch's values to 1e-12. Values and gradients on numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import pytest

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

RNG = np.random.default_rng(17)
F32, F64 = np.float32, np.float64

# (input, target, var dtypes, var's shape: the input's or without its last dim)
CASES = [(F32, F32, F64, (4, 3)), (F32, F64, F32, (4, 3)), (F64, F32, F32, (4, 3)), (F32, F32, F64, (4,)),
         (F32, F32, np.float16, (4, 3))]


@pytest.mark.parametrize("x_dt,t_dt,v_dt,v_shape", CASES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_mixed_dtypes_promote_as_torch(x_dt, t_dt, v_dt, v_shape, reduction):
    torch = pytest.importorskip("torch")
    x, t = RNG.normal(size=(4, 3)).astype(x_dt), RNG.normal(size=(4, 3)).astype(t_dt)
    v = (RNG.random(v_shape) + 0.2).astype(v_dt)
    xt = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.gaussian_nll_loss(xt, torch.from_numpy(t), torch.from_numpy(v), reduction=reduction)
    c = RNG.normal(size=want.shape).astype(want.detach().numpy().dtype)
    (want * torch.from_numpy(c)).sum().backward()
    tol = 1e-12 if v_dt == F64 else 1e-5  # log(var) in var's dtype: float32 logs differ by an ulp between libraries
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x, t, v: M.gaussian_nll_loss(x, t, v, reduction=reduction), {"x": x},
                       {"t": t, "v": v}, c, backend=backend)
        assert got["out"].dtype == want.detach().numpy().dtype, backend
        assert got["x"].dtype == x_dt, backend
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=tol, atol=tol, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=tol, atol=tol, err_msg=backend)


def test_the_module_promotes_too():
    torch = pytest.importorskip("torch")
    import graphc as gc

    x, t, v = RNG.normal(size=(4, 3)).astype(F32), RNG.normal(size=(4, 3)).astype(F32), RNG.random((4, 3)) + 0.2
    model = gc.capture(lambda x, t, v: gc.nn.GaussianNLLLoss(full=True)(x, t, v), x=x, t=t, v=v)
    want = torch.nn.GaussianNLLLoss(full=True)(*(torch.from_numpy(a) for a in (x, t, v))).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "t": t, "v": v})["output"]
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=backend)
