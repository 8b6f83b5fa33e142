"""``gc.vmap``'s rules for what used to fall back to the Scan over the examples: ``gc.func.hessian`` and
``jacfwd`` (a vmap of a vmap's gradient, whose broadcast gradients reduce over computed axes). Values
against torch.func on numpy and onnxruntime, gradients against torch.autograd (``_check``); each capture
with the fallback's warning an error (``_no_fallback``)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from tests.test_dsl_vmap_control import _no_fallback
from tests.test_dsl_vmap_rules import _check, _data
from tests.torch_grad_util import TorchNS

torch = pytest.importorskip("torch")

# -- hessian, jacfwd ---------------------------------------------------------------------------------

_W = _data((3, 4), seed=7)[0]

def _c(M, a: np.ndarray):
    """A constant of the DSL's (``M`` is gc) or torch's."""
    return a if M is gc else torch.from_numpy(a)


FUNCS = {  # name -> scalar f(M, x) of x (3,)
    "elementwise": lambda M, x: (M.sin(x) * x).sum(),
    "matmul": lambda M, x: M.tanh(x @ _c(M, _W)).sum(),
    "softmax": lambda M, x: (M.softmax(M.tanh(x @ _c(M, _W)) * 2.0, -1) * _c(M, np.arange(4.0))).sum(),
}


def _transformed(name: str, transform: str):
    """``transform`` (hessian or jacfwd) of ``FUNCS[name]`` as a ``_check`` function of ``x``."""
    def fn(M, x):
        if isinstance(M, TorchNS):
            return getattr(torch.func, transform)(lambda a: FUNCS[name](torch, a))(x)
        return getattr(gc.func, transform)(lambda a: FUNCS[name](gc, a))(x)
    return fn


@pytest.mark.parametrize("transform", ["hessian", "jacfwd"])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_hessian_and_jacfwd_batch_without_the_scan(name, transform):
    """No fallback (hessian fell back "at an Expand of unknown rank": the rank of a gradient's ReduceSum
    over computed axes with keepdims was not inferred); values and their gradients against torch. On
    onnxruntime CPU, hessian of x (16,) float64: 0.031-0.036 ms batched vs 0.15-0.18 ms as the Scan."""
    x = _data((3,), seed=8)[0]
    fn = _transformed(name, transform)
    for feeds in ({"x": x}, {"x": gc.spec("float64", (3,))}):
        model = _no_fallback(lambda x: fn(gc, x), **feeds)
        want = fn(TorchNS(torch), torch.from_numpy(x)).numpy()
        for backend in ["numpy", "ort-cpu"]:
            got = gc.Session(model, backend=backend).run({"x": x})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=backend)
    _check(fn, [x])
