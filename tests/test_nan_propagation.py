"""NaN and infinities through the DSL functions whose NaN behaviour torch defines (reductions, pools,
orderings, clamps, activations, softmax and friends): each captured function on the numpy and ort-cpu
backends against torch on inputs holding NaN, +inf and -inf (NaNs next to infs they could tie with)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

R = np.random.default_rng(5)
ROWS = R.standard_normal((5, 7)).astype(np.float32)
ROWS[0, 2] = np.nan  # a NaN among finite values
ROWS[1, [0, 4]] = np.nan, np.inf  # a NaN before an inf
ROWS[2, [1, 3, 5]] = np.inf, np.nan, -np.inf  # an inf before a NaN, and -inf
ROWS[3, [0, 2, 6]] = -np.inf, np.nan, np.nan  # two NaNs after -inf
# row 4: no NaN
ONE_NAN = ROWS[[0, 1, 2, 4]]  # torch's topk orders tied NaNs by no fixed rule (CPU: last first)
IMAGES = R.standard_normal((2, 3, 6, 6)).astype(np.float32)
IMAGES[0, 0, 0, 0] = IMAGES[0, 1, 1, 1] = IMAGES[0, 2, 4, 3] = IMAGES[1, 0, 5, 5] = np.nan  # each corner of a window
IMAGES[0, 2, 2, 2], IMAGES[1, 1, 3, 4], IMAGES[1, 2, 0, 1] = np.inf, -np.inf, np.nan


def _values(t):
    return t.values if hasattr(t, "values") and not callable(t.values) else t[0]


def _indices(t):
    return t.indices if hasattr(t, "indices") else t[1]


# (id, fn(M, x) on torch's namespace (torch and torch.nn.functional) or F, x); the results must be torch's
CASES = [
    ("max", lambda M, x: M.max(x), ROWS),
    ("min", lambda M, x: M.min(x), ROWS),
    ("amax_dim", lambda M, x: M.amax(x, 1), ROWS),
    ("amin_dim_keepdim", lambda M, x: M.amin(x, -1, keepdim=True), ROWS),
    ("amax_dims", lambda M, x: M.amax(x, (0, 1)), ROWS),
    ("method_max", lambda M, x: x.max(), ROWS),
    ("method_amin", lambda M, x: x.amin(0), ROWS),
    ("max_dim_values", lambda M, x: M.max(x, 1).values, ROWS),
    ("max_dim_indices", lambda M, x: M.max(x, 1).indices, ROWS),
    ("min_dim_values", lambda M, x: x.min(1).values, ROWS),
    ("min_dim_indices", lambda M, x: x.min(1).indices, ROWS),
    ("argmax", lambda M, x: M.argmax(x, 1), ROWS),
    ("argmin", lambda M, x: M.argmin(x, -1), ROWS),
    ("argmax_all", lambda M, x: M.argmax(x), ROWS),
    ("aminmax", lambda M, x: M.aminmax(x, dim=1).max, ROWS),
    ("norm_inf", lambda M, x: M.norm(x, float("inf"), dim=1), ROWS),
    ("norm_ninf", lambda M, x: M.norm(x, float("-inf"), dim=1), ROWS),
    ("maximum", lambda M, x: M.maximum(x, x.flip(0)), ROWS),
    ("minimum", lambda M, x: M.minimum(x, x.flip(1)), ROWS),
    ("clamp", lambda M, x: M.clamp(x, -0.5, 0.5), ROWS),
    ("clamp_min", lambda M, x: M.clamp(x, min=-0.5), ROWS),
    ("clamp_max", lambda M, x: M.clamp(x, max=0.5), ROWS),
    ("clip", lambda M, x: M.clip(x, -1.0, 1.0), ROWS),
    ("relu", lambda M, x: M.relu(x), ROWS),
    ("relu6", lambda M, x: M.relu6(x), ROWS),
    ("hardtanh", lambda M, x: M.hardtanh(x), ROWS),
    ("leaky_relu", lambda M, x: M.leaky_relu(x, 0.1), ROWS),
    ("threshold", lambda M, x: M.threshold(x, 0.1, 20.0), ROWS),
    ("max_pool1d", lambda M, x: M.max_pool1d(x, 2), IMAGES[:, :, 0]),
    ("max_pool2d", lambda M, x: M.max_pool2d(x, 2), IMAGES),
    ("max_pool2d_overlapping", lambda M, x: M.max_pool2d(x, 3, 1, 1), IMAGES),
    ("max_pool2d_indices", lambda M, x: M.max_pool2d(x, 3, 2, 1, return_indices=True)[1], IMAGES),
    ("max_pool2d_ceil", lambda M, x: M.max_pool2d(x, 4, 3, ceil_mode=True), IMAGES),
    ("max_pool3d", lambda M, x: M.max_pool3d(x, 2), np.stack([IMAGES, IMAGES[:, ::-1]], 2)),
    ("adaptive_max_pool1d", lambda M, x: M.adaptive_max_pool1d(x, 3), IMAGES[:, :, 0]),
    ("adaptive_max_pool2d", lambda M, x: M.adaptive_max_pool2d(x, 3), IMAGES),
    ("adaptive_max_pool2d_global", lambda M, x: M.adaptive_max_pool2d(x, 1), IMAGES),
    ("adaptive_max_pool3d", lambda M, x: M.adaptive_max_pool3d(x, 2), np.stack([IMAGES, IMAGES[:, ::-1]], 2)),
    ("topk_values", lambda M, x: _values(M.topk(x, 3, 1)), ROWS),
    ("topk_indices", lambda M, x: _indices(M.topk(x, 3, 1)), ONE_NAN),
    ("topk_smallest", lambda M, x: _values(M.topk(x, 4, 1, largest=False)), ROWS),
    ("topk_smallest_indices", lambda M, x: _indices(M.topk(x, 7, 1, largest=False)), ONE_NAN),
    ("sort", lambda M, x: M.sort(x, dim=1, stable=True).values, ROWS),
    ("sort_indices", lambda M, x: M.sort(x, dim=1, stable=True).indices, ROWS),
    ("sort_descending", lambda M, x: M.sort(x, dim=0, descending=True, stable=True).values, ROWS),
    ("sort_descending_indices", lambda M, x: M.sort(x, dim=1, descending=True, stable=True).indices, ROWS),
    ("argsort", lambda M, x: M.argsort(x, dim=1, stable=True), ROWS),
    ("argsort_descending", lambda M, x: M.argsort(x, dim=1, descending=True, stable=True), ROWS),
    ("softmax", lambda M, x: M.softmax(x, 1), ROWS),
    ("log_softmax", lambda M, x: M.log_softmax(x, 0), ROWS),
    ("logsumexp", lambda M, x: M.logsumexp(x, 1), ROWS),
    ("norm", lambda M, x: M.norm(x, dim=1), ROWS),
    ("cummax", lambda M, x: M.cummax(x, 1).values, ROWS),
    ("cummax_indices", lambda M, x: M.cummax(x, 1).indices, ROWS),
    ("cummin", lambda M, x: M.cummin(x, 1).values, ROWS),
    ("cummin_indices", lambda M, x: M.cummin(x, 1).indices, ROWS),
    ("median", lambda M, x: M.median(x), ROWS),
    ("median_dim", lambda M, x: M.median(x, 1).values, ROWS),
    ("median_dim_indices", lambda M, x: M.median(x, 1).indices, ROWS),
    ("nanmedian", lambda M, x: M.nanmedian(x, 1).values, ROWS),
    ("max_float64", lambda M, x: M.amax(x, 0), ROWS.astype(np.float64)),
    ("sort_float64", lambda M, x: M.sort(x, dim=1, descending=True, stable=True).values, ROWS.astype(np.float64)),
    ("max_pool2d_float64", lambda M, x: M.max_pool2d(x, 2), IMAGES.astype(np.float64)),
    ("argmin_all_keepdim", lambda M, x: M.argmin(x, keepdim=True), ROWS),
    ("argmax_all_keepdim", lambda M, x: x.argmax(None, True), IMAGES),
]


@pytest.mark.parametrize("name,fn,x", CASES, ids=[c[0] for c in CASES])
def test_matches_torch_on_nans_and_infs(name, fn, x):
    torch = pytest.importorskip("torch")
    namespace = type("Torch", (), {"__getattr__": lambda _, n: getattr(torch.nn.functional, n, None)
                                   or getattr(torch, n)})()
    want = fn(namespace, torch.from_numpy(x.copy())).numpy()
    model = gc.capture(lambda x: fn(F, x), x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        assert got.dtype == want.dtype and got.shape == want.shape, (backend, got.dtype, got.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=backend)  # NaNs and infs where torch's are


def test_reductions_of_integers_take_no_nan_step():
    """Only float inputs pay for the NaN check."""
    model = gc.capture(lambda x: F.amax(x, 1), x=gc.spec("int64", ("N", 4)))
    assert "IsNaN" not in [n.op_type for n in model.proto.graph.node]
