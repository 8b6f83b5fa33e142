"""``F.conv_tbc`` (``gc.conv_tbc``) against torch 2.13 in float64 on the numpy and ort-cpu backends: values and
the gradients of input, weight and bias for pads 0-2 and kernels 1 and 3; bad shapes and pads refused naming the
argument."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_conv_tbc_values_and_gradients_match_torch(pad, kernel):
    params = {"x": RNG.standard_normal((6, 2, 3)), "w": RNG.standard_normal((kernel, 3, 4)),
              "b": RNG.standard_normal(4)}
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    want = torch.nn.functional.conv_tbc(leaves["x"], leaves["w"], leaves["b"], pad)
    assert want.shape == (6 + 2 * pad - kernel + 1, 2, 4)
    c = RNG.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x, w, b: M.conv_tbc(x, w, b, pad), params, {}, c, backend=backend)
        assert got["out"].dtype == np.float64
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=backend)
        for k, leaf in leaves.items():
            np.testing.assert_allclose(got[k], leaf.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"{backend} {k}")


def test_conv_tbc_takes_symbolic_time_and_batch():
    w, b = RNG.standard_normal((3, 3, 4)), RNG.standard_normal(4)
    model = gc.capture(lambda x, w, b: F.conv_tbc(x, w, b, 1), x=gc.spec("float64", ("T", "B", 3)), w=w, b=b)
    for t, n in ((5, 2), (9, 1)):
        x = RNG.standard_normal((t, n, 3))
        want = torch.conv_tbc(*(torch.from_numpy(a) for a in (x, w, b)), 1).numpy()
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"x": x, "w": w, "b": b})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize("shapes, pad, message", [
    (((7, 2), (3, 3, 4), (4,)), 0, r"input must be \(T, B, C_in\), got float64\[7,2\]"),
    (((7, 2, 3), (3, 4), (4,)), 0, r"weight must be \(k, C_in, C_out\), got float64\[3,4\]"),
    (((7, 2, 3), (3, 3, 4), (4, 1)), 0, r"bias must be \(C_out,\), got float64\[4,1\]"),
    (((7, 2, 3), (3, 5, 4), (4,)), 0, r"input's C_in \(dim 2\) must equal weight's dim 1, 5; got 3"),
    (((7, 2, 3), (3, 3, 4), (5,)), 0, r"bias's size must equal weight's dim 2, 4; got 5"),
    (((2, 2, 3), (5, 3, 4), (4,)), 1, r"the kernel \(5 wide\) is longer than input's T = 2 with pad = 1 each side"),
    (((7, 2, 3), (3, 3, 4), (4,)), -1, r"pad must be a non-negative int, got -1"),
    (((7, 2, 3), (3, 3, 4), (4,)), 1.5, r"pad must be a non-negative int, got 1.5"),
])
def test_conv_tbc_refuses_bad_arguments_naming_them(shapes, pad, message):
    x, w, b = (np.ones(s) for s in shapes)
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(lambda x, w, b: F.conv_tbc(x, w, b, pad), x=x, w=w, b=b)
