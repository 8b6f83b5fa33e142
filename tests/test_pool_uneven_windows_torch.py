"""Adaptive pooling to sizes that do not divide the input (torch's overlapping windows of uneven length) and
``F.interpolate``'s modes ``area`` and ``nearest-exact``, against torch: float64 values and ``gc.grad`` gradients
to 1e-10 on the numpy and ort-cpu backends, the max pools' indices and NaNs, the modules, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.dsl.resize_nearest import exact_sources

try:
    from torch_grad_util import TorchNS, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(5)
NCL, NCHW, NCDHW = R.standard_normal((2, 3, 7)), R.standard_normal((2, 2, 5, 6)), R.standard_normal((1, 2, 4, 5, 7))

# (torch.nn.functional call on x, input): each output size leaves windows of uneven length
CALLS = [
    ("adaptive_avg_pool1d(x, 3)", NCL), ("adaptive_avg_pool1d(x, 5)", NCL),
    ("adaptive_avg_pool2d(x, (3, 4))", NCHW), ("adaptive_avg_pool2d(x, (None, 4))", NCHW),
    ("adaptive_avg_pool2d(x, (2, 3))", NCHW), ("adaptive_avg_pool2d(x, 7)", NCHW),
    ("adaptive_avg_pool3d(x, (3, 2, 4))", NCDHW),
    ("adaptive_max_pool1d(x, 4)", NCL), ("adaptive_max_pool2d(x, (3, 4))", NCHW),
    ("adaptive_max_pool2d(x, (4, None))", NCHW), ("adaptive_max_pool3d(x, (3, 2, 4))", NCDHW),
    ("interpolate(x, size=4, mode='area')", NCL), ("interpolate(x, size=(3, 4), mode='area')", NCHW),
    ("interpolate(x, scale_factor=0.7, mode='area')", NCHW), ("interpolate(x, size=(9, 8), mode='area')", NCHW),
    ("interpolate(x, size=(3, 2, 5), mode='area')", NCDHW),
    ("interpolate(x, size=11, mode='nearest-exact')", NCL),
    ("interpolate(x, scale_factor=1.7, mode='nearest-exact')", NCHW),  # 6 -> 10: a tie ONNX's Resize misses
    ("interpolate(x, size=(3, 4), mode='nearest-exact')", NCHW),
    ("interpolate(x, scale_factor=(0.6, 2.5), mode='nearest-exact')", NCHW),
    ("interpolate(x, size=(7, 3, 9), mode='nearest-exact')", NCDHW),
]


def _fn(call):
    return eval(f"lambda F, x: F.{call}")  # noqa: S307 - the calls listed above


@pytest.mark.parametrize("call,x", CALLS, ids=[c[0] for c in CALLS])
def test_values_and_gradients_match_torch_on_both_backends(call, x):
    """Capture failed before: 'adaptive pooling to (3, 4) needs static spatial dims divisible by the output
    size', and interpolate refused modes area and nearest-exact."""
    fn = _fn(call)
    xt = torch.tensor(x, requires_grad=True)
    want = fn(TorchNS(torch), xt)
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


INDEXED = [("adaptive_max_pool1d(x, 4, return_indices=True)", NCL),
           ("adaptive_max_pool2d(x, (3, 4), return_indices=True)", NCHW),
           ("adaptive_max_pool3d_with_indices(x, (3, 2, 4))", NCDHW)]


@pytest.mark.parametrize("call,x", INDEXED, ids=[c[0] for c in INDEXED])
def test_max_pool_indices_ties_and_nans_match_torch(call, x):
    """torch's flat indices in each channel plane; a tie gives the first maximum; a window holding a NaN gives
    NaN (with a batch dim left symbolic)."""
    x = np.round(x * 2) / 2  # ties
    x.reshape(-1)[[3, 17]] = np.nan
    fn = _fn(call)
    want, want_indices = fn(TorchNS(torch), torch.from_numpy(x))
    model = gc.capture(lambda x: fn(F, x), x=gc.spec("float64", ("N", *x.shape[1:])))
    out = run_both(model, {"x": x})
    np.testing.assert_array_equal(out["output_0"], want.numpy())
    finite = ~np.isnan(want.numpy())
    assert out["output_1"].dtype == np.int64
    np.testing.assert_array_equal(out["output_1"][finite], want_indices.numpy()[finite])


def test_nearest_exact_sources_equal_torchs_over_sizes_and_factors():
    """torch's float32 index rule at every size 1..12 -> 1..20 and at scale factors with ties (6 * 1.7)."""
    for n in range(1, 13):
        x = torch.arange(float(n)).reshape(1, 1, n)
        for o in range(1, 21):
            want = torch.nn.functional.interpolate(x, size=o, mode="nearest-exact")[0, 0].long().numpy()
            np.testing.assert_array_equal(exact_sources(n, o, None), want, err_msg=f"{n} -> {o}")
        for f in (f for f in (0.3, 0.5, 0.7, 1.3, 1.5, 1.7, 2.0, 2.5, 3.3) if int(n * f) > 0):
            want = torch.nn.functional.interpolate(x, scale_factor=f, mode="nearest-exact")[0, 0].long().numpy()
            np.testing.assert_array_equal(exact_sources(n, len(want), f), want, err_msg=f"{n} * {f}")


@pytest.mark.parametrize("ctor", ["AdaptiveAvgPool2d((3, 4))", "AdaptiveMaxPool2d((2, 5))",
                                  "Upsample(scale_factor=1.7, mode='nearest-exact')",
                                  "Upsample(size=(3, 4), mode='area')"])
def test_modules_match_torch(ctor):
    model = gc.capture(eval(f"gc.nn.{ctor}"), x=gc.spec("float64", ("N", 2, 5, 6)))  # noqa: S307
    want = eval(f"torch.nn.{ctor}")(torch.from_numpy(NCHW)).numpy()  # noqa: S307
    np.testing.assert_allclose(run_both(model, {"x": NCHW})["output"], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), r"adaptive pooling to \(3, 4\) needs static spatial dims where "
     "they are not multiples of the output size"),
    (lambda x: F.interpolate(x, scale_factor=0.5, mode="area"), r"mode='area' with scale_factor needs static "
     "spatial dims"),
    (lambda x: F.interpolate(x, size=(3, 4), mode="nearest-exact", antialias=True), r"antialias=True takes mode "
     "'bilinear' or 'bicubic'"),
    (lambda x: F.interpolate(x, size=(3, 4), mode="box"), r"interpolate mode='box'; expected one of \['area', "),
])
def test_refusals_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float64", ("N", 2, "H", 6)))
    assert "test_pool_uneven_windows_torch.py" in str(err.value)
