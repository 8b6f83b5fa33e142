"""Searching, binning, distances, windows over a dim and index writes (graphc.dsl.ops_search)
against torch: values on the numpy and ort-cpu backends (NaNs, ints, batched sequences, symbolic
dims, opset 17), gradients against torch.autograd and float64 central differences, in-place
methods, and the errors for bad arguments."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import (assert_directional_derivatives, assert_input_grad_matches_torch,
                                 assert_values_match_torch, gc_grads, run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_directional_derivatives, assert_input_grad_matches_torch,
                                       assert_values_match_torch, gc_grads, run_both)

R = np.random.default_rng(7)
X = R.standard_normal((3, 5))
Y = R.standard_normal((4, 5))
BATCH = R.standard_normal((2, 3, 4))
NAN = np.nan
EDGES = np.array([-1.0, -0.2, 0.0, 0.5, 1.5])
TAIL_NANS = np.array([1.0, 2.0, NAN, NAN, NAN])
PROBES = np.array([[-3.0, -0.2, 0.0, 0.3], [0.5, NAN, 2.0, -1.0]])
INTS = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int64)
SORTED_ROWS = np.sort(R.standard_normal((2, 6)), -1)
COORDS = np.array([0.0, 0.5, 1.75, 2.0, 4.0])
INDEX = np.array([0, 3, 0, 2], np.int64)
SOURCE = R.uniform(0.5, 2.0, (4, 5))
TIES = np.array([[0.0, 0.0, 1.0], [2.0, 2.0, 1.0], [0.0, 0.0, 1.0]])


def _fill(M, x, value, wrap):
    y = x.clone()
    y.fill_diagonal_(value, wrap=wrap)
    return y


# (id, fn(M, *arrays) with M torch or graphc, arrays); the results must be torch's in value, dtype and shape
VALUES = [
    ("searchsorted", lambda M, s, v: M.searchsorted(s, v), [EDGES, PROBES]),
    ("searchsorted_right_int32", lambda M, s, v: M.searchsorted(s, v, right=True, out_int32=True), [EDGES, PROBES]),
    ("searchsorted_side", lambda M, s, v: M.searchsorted(s, v, side="right"), [EDGES, PROBES]),
    ("searchsorted_nan_entries", lambda M, s, v: M.searchsorted(s, v), [TAIL_NANS, PROBES]),
    ("searchsorted_nan_entries_right", lambda M, s, v: M.searchsorted(s, v, right=True), [TAIL_NANS, PROBES]),
    ("searchsorted_batched", lambda M, s, v: M.searchsorted(s, v), [SORTED_ROWS, PROBES]),
    ("searchsorted_sorter", lambda M, s, v, o: M.searchsorted(s, v, sorter=o), [X[0], PROBES, np.argsort(X[0])]),
    ("searchsorted_ints_floats", lambda M, s, v: M.searchsorted(s, v), [np.arange(6), PROBES * 3]),
    ("searchsorted_scalar", lambda M, s: M.searchsorted(s, 0.25), [EDGES]),
    ("bucketize", lambda M, x, b: M.bucketize(x, b), [PROBES, EDGES]),
    ("bucketize_right_ints", lambda M, x, b: M.bucketize(x, b, right=True, out_int32=True), [INTS, np.arange(0, 9, 2)]),
    ("isin", lambda M, x, t: M.isin(x, t), [INTS, np.array([1, 5, 7])]),
    ("isin_invert", lambda M, x, t: M.isin(x, t, invert=True), [INTS, np.array([[2, 3], [9, 0]])]),
    ("isin_nan", lambda M, x, t: M.isin(x, t), [PROBES, np.array([NAN, 0.5, -3.0])]),
    ("isin_scalar", lambda M, x: M.isin(x, 5), [INTS]),
    ("isin_float_in_ints", lambda M, x, t: M.isin(x, t), [INTS, np.array([2.5, 3.0])]),
    ("histogram", lambda M, x: tuple(M.histogram(x, 6)), [X]),
    ("histogram_range", lambda M, x: tuple(M.histogram(x, 4, range=(-1.0, 1.0))), [X]),
    ("histogram_edges_weight_density", lambda M, x, b, w: tuple(M.histogram(x, b, weight=w, density=True)),
     [X, EDGES, np.abs(Y[:3])]),
    ("histogram_constant", lambda M, x: tuple(M.histogram(x, 4)), [np.ones((3,), np.float32)]),
    ("histogram_float16", lambda M, x: tuple(M.histogram(x, 4, range=(-1.0, 1.0))), [X.astype(np.float16)]),
    ("histogram_empty", lambda M, x: tuple(M.histogram(x, 3)), [np.zeros((0,), np.float32)]),  # edges 0 .. 1
    ("histogram_method_float32", lambda M, x: tuple(x.histogram(5)), [X.astype(np.float32)]),
    *[(f"cdist_p{p}", lambda M, a, b, p=p: M.cdist(a, b, p), [X, Y]) for p in (0, 1, 2, 3, 0.5, np.inf)],
    ("cdist_batched", lambda M, a, b: M.cdist(a, b), [BATCH, BATCH[:1, :2]]),
    *[(f"{f}_no_columns_p{p}", lambda M, x, f=f, p=p: M.cdist(x, x, p) if f == "cdist" else M.pdist(x, p),
       [np.zeros((3, 0))]) for f in ("cdist", "pdist") for p in (1, np.inf)],
    *[(f"pdist_p{p}", lambda M, x, p=p: M.pdist(x, p), [Y]) for p in (0, 1, 2, 0.5, np.inf)],
    ("trapezoid", lambda M, y: M.trapezoid(y), [X]),
    ("trapezoid_dx", lambda M, y: M.trapezoid(y, dx=0.5, dim=0), [X]),
    ("trapezoid_x", lambda M, y, x: M.trapezoid(y, x), [X, COORDS]),
    ("trapezoid_x_full", lambda M, y, x: M.trapezoid(y, x, dim=0), [X, np.cumsum(np.abs(X), 0)]),
    ("trapezoid_ints", lambda M, y: M.trapezoid(y), [INTS]),
    ("trapezoid_empty", lambda M, y: M.trapezoid(y), [np.zeros((3, 0))]),
    ("trapezoid_empty_ints", lambda M, y: M.trapezoid(y), [INTS[:, :0]]),  # torch's zeros keep the dtype
    ("trapz", lambda M, y, x: M.trapz(y, x), [X, COORDS]),
    ("cumulative_trapezoid", lambda M, y, x: M.cumulative_trapezoid(y, x), [X, COORDS]),
    ("cumulative_trapezoid_dx", lambda M, y: M.cumulative_trapezoid(y, dx=2.0, dim=0), [INTS]),
    ("gradient", lambda M, y: M.gradient(y), [X]),
    ("gradient_spacing_dims", lambda M, y: M.gradient(y, spacing=[2.0, 0.5], dim=[1, 0]), [X]),
    ("gradient_edge2", lambda M, y: M.gradient(y, spacing=3.0, dim=1, edge_order=2), [X]),
    ("gradient_coords", lambda M, y, c: M.gradient(y, spacing=(c,), dim=1), [X, COORDS]),
    ("gradient_coords_edge2", lambda M, y, c: M.gradient(y, spacing=[c], dim=-1, edge_order=2), [X, COORDS]),
    ("gradient_ints", lambda M, y: M.gradient(y, dim=1), [INTS]),
    *[(f"gradient_infinities_edge{e}", lambda M, y, e=e: M.gradient(y, edge_order=e), [np.array([1.0, np.inf, 2.0,
                                                                                            -np.inf, 5.0, 1.0])])
      for e in (1, 2)],  # even steps read no f[i] at i: an inf there is not a nan
    *[(f"gradient_float64_coords_{t}", lambda M, y, c: M.gradient(y, spacing=[c], dim=1), [y, COORDS])
      for t, y in (("ints", INTS), ("float32", X.astype(np.float32)))],  # promoted to float64, as torch
    ("unfold", lambda M, x: x.unfold(1, 2, 2), [X]),
    ("unfold_overlap", lambda M, x: x.unfold(0, 2, 1), [BATCH]),
    ("unfold_scalar", lambda M, x: x.unfold(0, 1, 1), [np.asarray(2.5)]),
    ("unfold_scalar_empty", lambda M, x: x.unfold(0, 0, 1), [np.asarray(2.5)]),
    ("put", lambda M, x, i, s: x.put(i, s), [X, np.array([-1, 0, 7]), np.array([7.0, 8.0, 9.0])]),
    ("put_accumulate", lambda M, x, i, s: M.put(x, i, s, accumulate=True), [INTS, np.array([[1, 1], [-2, 4]]),
                                                                             np.array([10, 20, 30, 40])]),
    *[(f"index_reduce_{r}", lambda M, x, i, s, r=r: x.index_reduce(0, i, s, r), [Y, INDEX, SOURCE])
      for r in ("prod", "mean", "amax", "amin")],
    *[(f"index_reduce_{r}_exclude", lambda M, x, i, s, r=r: M.index_reduce(x, 0, i, s, r, include_self=False),
       [Y, INDEX, SOURCE]) for r in ("prod", "mean", "amax", "amin")],
    ("index_reduce_ints_mean", lambda M, x, i, s: x.index_reduce(1, i, s, "mean"), [INTS, INDEX, INTS[:, :4] * 3]),
    ("fill_diagonal", lambda M, x: _fill(M, x, 5.0, False), [np.zeros((7, 3))]),
    ("fill_diagonal_wrap", lambda M, x: _fill(M, x, 5.0, True), [np.zeros((7, 3))]),
    ("fill_diagonal_wide", lambda M, x: _fill(M, x, -1, True), [INTS]),
    ("fill_diagonal_3d", lambda M, x: _fill(M, x, 2.0, False), [BATCH[:, :2, :2]]),
    ("renorm", lambda M, x: x.renorm(2, 0, 1.5), [X]),
    ("renorm_p1_dim1", lambda M, x: M.renorm(x, 1, 1, 1.0), [BATCH]),
    ("renorm_inf", lambda M, x: x.renorm(np.inf, -1, 0.5), [BATCH]),
]


@pytest.mark.parametrize("name,fn,arrays", VALUES, ids=[v[0] for v in VALUES])
def test_values_match_torch(name, fn, arrays):
    assert_values_match_torch(pytest.importorskip("torch"), fn, arrays)


def test_searchsorted_with_a_symbolic_batch_and_opset_17():
    torch = pytest.importorskip("torch")
    cases = {"searchsorted": lambda M, s, v: M.searchsorted(s, v, right=True),
             "bucketize": lambda M, s, v: M.bucketize(v, s[0]), "isin": lambda M, s, v: M.isin(v, s),
             "histogram": lambda M, s, v: M.histogram(v, 3)[0], "cdist": lambda M, s, v: M.cdist(s, v, 1.5),
             "trapezoid": lambda M, s, v: M.trapezoid(v, dim=0), "gradient": lambda M, s, v: M.gradient(v, dim=0)[0],
             "unfold": lambda M, s, v: v.unfold(1, 3, 1), "renorm": lambda M, s, v: v.renorm(2, 0, 1.0),
             "put": lambda M, s, v: v.put(M.tensor([0, -1]) if M is torch else np.array([0, -1]),
                                          s[0, :2].to(v.dtype) if M is torch else s[0, :2])}
    s, v = np.ascontiguousarray(SORTED_ROWS[:, :4]), np.round(R.standard_normal((2, 4)), 1)
    for opset in (17, 21):
        for name, fn in cases.items():
            spec = gc.spec("float64", ("N", 4))
            model = gc.capture(lambda s, v, fn=fn: fn(gc, s, v), s=spec, v=spec, opset=opset)
            onnx.checker.check_model(model.proto, full_check=True)
            want = fn(torch, torch.from_numpy(s), torch.from_numpy(v)).numpy()
            np.testing.assert_allclose(run_both(model, {"s": s, "v": v})["output"], want, rtol=1e-12,
                                       err_msg=f"{name} opset {opset}")


@pytest.mark.parametrize("name,fn", [("unfold", lambda x: x.unfold(0, 2, 1)),
                                     ("fill_diagonal_", lambda x: x.fill_diagonal_(1.0))])
def test_a_symbolic_dim_that_must_be_static_is_refused_naming_the_function(name, fn):
    with pytest.raises(gc.CaptureError, match=rf"^{name}\(float64\[N,5\]\): needs a static size on dim 0") as info:
        gc.capture(fn, x=gc.spec("float64", ("N", 5)))
    assert "test_dsl_search.py:" in str(info.value)


def test_searchsorted_follows_torchs_search_past_nan_entries():
    """torch's binary search reads NaN entries as passed: a value below them can land after them."""
    got = run_both(gc.capture(lambda s, v: gc.searchsorted(s, v), s=TAIL_NANS, v=PROBES),
                   {"s": TAIL_NANS, "v": PROBES})["output"]
    assert got[0, 0] == 5 and got[1, 1] == 5  # -3.0 (stepping onto a NaN first) and NaN itself


# (id, fn(M, x, **inputs) -> a Tensor, x, inputs); the gradients of sum(fn * c) go where torch's go
GRADS = [
    *[(f"cdist_p{p}", lambda M, x, p=p: M.cdist(x, x[1:] * 0.5, p), X, {}) for p in (1, 2, 3, 0.5, np.inf)],
    *[(f"cdist_equal_points_p{p}", lambda M, x, p=p: M.cdist(x, x[:2], p), TIES, {}) for p in (2, 3, 0.5, np.inf)],
    ("cdist_p0", lambda M, x: M.cdist(x, x[:2] * 2, 0) + x.sum(), X, {}),
    *[(f"pdist_equal_points_p{p}", lambda M, x, p=p: M.pdist(x, p), np.vstack([TIES, [[1.0, 3.0, 1.0]]]), {})
      for p in (1, 2, 3, 0.5, np.inf)],
    ("trapezoid", lambda M, x: M.trapezoid(x, dx=0.5), X, {}),
    ("trapezoid_x", lambda M, x: M.trapezoid(x[1:], x[0].cumsum(0)), np.abs(X), {}),
    ("cumulative_trapezoid", lambda M, x, co: M.cumulative_trapezoid(x, co), X, {"co": COORDS}),
    ("gradient", lambda M, x: M.gradient(x, spacing=2.0)[0] * M.gradient(x, edge_order=2)[1], X, {}),
    ("gradient_coords", lambda M, x, co: M.gradient(x, spacing=(co,), dim=1, edge_order=2)[0], X, {"co": COORDS}),
    ("unfold", lambda M, x: x.unfold(1, 3, 1), X, {}),
    ("put", lambda M, x, i: x.put(i, x[0, :3] * 2.0), X, {"i": np.array([-1, 0, 7])}),
    ("put_accumulate", lambda M, x, i: x.put(i, x[1, :3], accumulate=True), X, {"i": np.array([2, 2, -3])}),
    *[(f"index_reduce_{r}", lambda M, x, i, r=r: x[:3].index_reduce(0, i, x[1:] * 1.5, r), SOURCE,
       {"i": np.array([0, 2, 0])}) for r in ("prod", "mean", "amax", "amin")],
    ("index_reduce_amax_exclude", lambda M, x, i: x[:3].index_reduce(0, i, x[1:] * 1.5, "amax", include_self=False),
     SOURCE, {"i": np.array([0, 2, 0])}),
    ("renorm", lambda M, x: x.renorm(2, 0, 1.5), X, {}),
    ("renorm_p3", lambda M, x: M.renorm(x, 3, 1, 1.0), X, {}),
    ("fill_diagonal", lambda M, x: _fill(M, x * 2.0, 1.0, True), X.T, {}),
]


@pytest.mark.parametrize("name,fn,x,inputs", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_match_torch(name, fn, x, inputs):
    pytest.importorskip("torch")
    assert_input_grad_matches_torch(fn, x, inputs, R, dsl=gc)


FD = [g for g in GRADS if "equal_points" not in g[0] and g[0] != "cdist_p0"]


@pytest.mark.parametrize("name,fn,x,inputs", FD, ids=[g[0] for g in FD])
def test_gradients_match_float64_central_differences(name, fn, x, inputs):
    model = gc.capture(lambda x, **kw: fn(gc, x, **kw), x=x, **inputs)
    sess = gc.Session(model, backend="numpy")
    rng = np.random.default_rng(len(name))
    c = np.asarray(rng.standard_normal(model.outputs[0].shape))
    grad = gc_grads(lambda M, x, **kw: fn(gc, x, **kw), {"x": x}, inputs, c)["x"]
    assert_directional_derivatives(sess, {"x": x, **inputs}, {"x": grad}, ["x"], c, rng)


def test_in_place_methods_rebind_the_tensor():
    torch = pytest.importorskip("torch")

    def fn(M, x, i):
        y = x.clone()
        y.put_(i, x[0, :2])
        y.index_reduce_(0, i, x[1:3], "amin")
        y.renorm_(2, 0, 1.0)
        return y.fill_diagonal_(0.5)

    i = np.array([2, 0])
    want = fn(torch, torch.from_numpy(X), torch.from_numpy(i)).numpy()
    got = run_both(gc.capture(lambda x, i: fn(gc, x, i), x=X, i=i), {"x": X, "i": i})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-12)


ERRORS = [
    ("searchsorted_side", lambda x: gc.searchsorted(x[0], x, side="left", right=True),
     r"searchsorted side='left', right=True: expected"),
    ("searchsorted_batch", lambda x: gc.searchsorted(x, x[0]), "searchsorted sorted_sequence: expected a 1-D"),
    ("searchsorted_sorter", lambda x: gc.searchsorted(x[0], x, sorter=x[0]), "searchsorted sorter: expected an int64"),
    ("bucketize_2d", lambda x: gc.bucketize(x, x), "bucketize boundaries: expected a 1-D Tensor, got float64"),
    ("isin_numbers", lambda x: gc.isin(1, 2), "isin: expected elements or test_elements to be a Tensor"),
    ("histogram_int", lambda x: gc.histogram(x.long()), "histogram input: expected a floating-point Tensor"),
    ("histogram_bins", lambda x: gc.histogram(x, 0), "histogram bins=0: expected a positive int"),
    ("histogram_range", lambda x: gc.histogram(x, 3, range=(1.0, 0.0)), r"histogram range=\(1.0, 0.0\): expected"),
    ("histogram_weight", lambda x: gc.histogram(x, 3, weight=x[0]), "histogram weight: expected a Tensor of"),
    ("cdist_rank", lambda x: gc.cdist(x[0], x), "cdist x1, x2: expected float Tensors .* at least 2 dims"),
    ("cdist_size", lambda x: gc.cdist(x, x[:, :2]), "cdist x1, x2: expected the same size of the last dim, got 5 and"),
    ("cdist_p", lambda x: gc.cdist(x, x, -1.0), "cdist p=-1.0, compute_mode="),
    ("trapezoid_both", lambda x: gc.trapezoid(x, x, dx=1.0), "trapezoid x, dx: expected one of them, got both"),
    ("gradient_edge", lambda x: gc.gradient(x, edge_order=3), "gradient edge_order=3"),
    ("gradient_size", lambda x: gc.gradient(x[:2], dim=0, edge_order=2), "at least edge_order \\+ 1 = 3, got 2"),
    ("unfold_size", lambda x: x.unfold(1, 6, 1), r"unfold size=6, step=1: expected a size from 0 to 5"),
    ("put_index", lambda x: x.put(x[0].int(), x[0]), "put index: expected an int64 Tensor, got int32"),
    ("put_source", lambda x: x.put(gc.arange(2), x[0]), r"put source: expected as many entries as index \(2\), got 5"),
    ("index_reduce_sum", lambda x: x.index_reduce(0, gc.arange(2), x[:2], "sum"), "index_reduce reduce='sum'"),
    ("index_reduce_index", lambda x: x.index_reduce(0, x[0], x, "amax"), "index_reduce index: expected a 1-D int64"),
    ("fill_diagonal_1d", lambda x: x[0].fill_diagonal_(1.0), "fill_diagonal_ input: expected a 2-D Tensor"),
    ("renorm_p", lambda x: x.renorm(0, 0, 1.0), "renorm p=0, maxnorm=1.0: expected p > 0"),
    ("renorm_int", lambda x: x.long().renorm(2, 0, 1.0), "renorm input: expected a floating-point Tensor, got int64"),
    ("renorm_1d", lambda x: x[0].renorm(2, 0, 1.0), r"renorm\(float64\[5\]\): input: expected at least 2 dims"),
    ("isin_bool", lambda x: gc.isin(x > 0, True), r"isin\(bool\[3,5\], bool\[\]\): expected numbers .* got bool"),
    # a dim out of range, or a size that must be static, names the function (not the ONNX op it lowers to)
    ("trapezoid_dim", lambda x: gc.trapezoid(x, dim=2), r"^trapezoid\(float64\[3,5\]\): dim 2 out of range"),
    ("cumulative_trapezoid_dim", lambda x: gc.cumulative_trapezoid(x, dim=-3), r"^cumulative_trapezoid\(.*dim -3 out"),
    ("gradient_dim", lambda x: gc.gradient(x, dim=2), r"^gradient\(float64\[3,5\]\): dim 2 out of range"),
    ("unfold_dim", lambda x: x.unfold(2, 1, 1), r"^unfold\(float64\[3,5\]\): dim 2 out of range"),
    ("index_reduce_dim", lambda x: x.index_reduce(2, gc.arange(2), x, "amax"), r"^index_reduce\(.*dim 2 out of"),
    ("renorm_dim", lambda x: x.renorm(2, 2, 1.0), r"^renorm\(float64\[3,5\]\): dim 2 out of range"),
]


@pytest.mark.parametrize("name,fn,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_name_the_argument(name, fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=X)
    assert "test_dsl_search.py:" in str(info.value)
