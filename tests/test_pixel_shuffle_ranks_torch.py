"""``F.pixel_shuffle`` / ``nn.PixelShuffle`` on inputs of rank 3 and 5 or more (``[*, C r^2, H, W]``, as torch's;
ONNX's DepthToSpace takes 4-D only), against torch: float64 values and ``gc.grad`` gradients to 1e-10 on the
numpy and ort-cpu backends, a round trip with ``pixel_unshuffle``, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(9)


@pytest.mark.parametrize("shape,r", [((8, 2, 3), 2), ((2, 1, 8, 2, 3), 2), ((1, 2, 3, 18, 2, 2), 3),
                                     ((2, 9, 2, 3), 3)])
def test_values_and_gradients_match_torch_on_both_backends(shape, r):
    """Ranks other than 4 failed before: 'DepthToSpace(float64[2,1,8,2,3]): Input tensor must be 4-dimensional'."""
    x = R.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.pixel_shuffle(xt, r)
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x: M.pixel_shuffle(x, r), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


def test_module_with_a_symbolic_lead_dim_and_the_unshuffle_round_trip():
    x = R.standard_normal((2, 3, 8, 2, 3))
    model = gc.capture(lambda x: (gc.nn.PixelShuffle(2)(x), F.pixel_unshuffle(F.pixel_shuffle(x, 2), 2)),
                       x=gc.spec("float64", ("B", "T", 8, 2, 3)))
    out = run_both(model, {"x": x})
    np.testing.assert_array_equal(out["output_0"], torch.nn.PixelShuffle(2)(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(out["output_1"], x)


@pytest.mark.parametrize("call,message", [
    (lambda x: F.pixel_shuffle(x, 2), r"pixel_shuffle expects the channels \(6\) to divide by upscale_factor\*\*2=4"),
    # 4-D (DepthToSpace): before, captured, and onnxruntime refused the run
    (lambda x: F.pixel_shuffle(x[0], 2), r"pixel_shuffle expects the channels \(6\) to divide by upscale_factor"),
    (lambda x: F.pixel_shuffle(x[0, 0, 0], 2), r"pixel_shuffle expects an input of rank 3 or more \(\*, C, H, W\)"),
    (lambda x: F.pixel_shuffle(x, 0), r"upscale_factor"),
])
def test_refusals_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=R.standard_normal((2, 1, 6, 2, 3)))
    assert "test_pixel_shuffle_ranks_torch.py" in str(err.value)
