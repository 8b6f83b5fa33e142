"""NaN-aware reductions, quantiles and statistics (graphc.dsl.ops_stats) against torch: values on
the numpy and ort-cpu backends (NaNs, infs, ties, ints, keepdim, negative and symbolic dims),
gradients against torch.autograd and float64 central differences, and the errors for bad
arguments. Also torch's forms of var/std/logsumexp that these build on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import (assert_directional_derivatives, assert_input_grad_matches_torch, gc_grads,
                                 run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_directional_derivatives, assert_input_grad_matches_torch,
                                       gc_grads, run_both)

R = np.random.default_rng(11)
X = R.standard_normal((3, 5, 4))
NANS = X.copy()
NANS[0, 1, 2] = NANS[2, 0, 0] = NANS[2, 3, 0] = np.nan
NANS[1, :, 3] = np.nan
INFS = np.array([[np.nan, np.inf, 1.0, -np.inf, 2.0], [np.inf, 0.5, np.nan, 3.0, np.inf], [1.0, 2, 3, 4, 5]])
TIES = np.array([[2.0, 1, 2, 1, 1, 2], [0.5, 0.5, -1, 3, 3, -1], [4, 4, 4, 4, 4, 4], [3, 1, 3, 1, 2, 2]])
INTS = R.integers(-3, 4, (4, 7)).astype(np.int64)
QS = [0.0, 0.25, 0.5, 0.9, 1.0]
FW = np.array([1, 3, 0, 2, 1], np.int64)
AW = np.array([0.5, 1.0, 2.0, 0.25, 1.5])
INTERPOLATIONS = ("linear", "lower", "higher", "nearest", "midpoint")


def _q(M, qs):
    """``qs`` as torch takes a list of quantiles (a Tensor), or as the DSL (the list itself)."""
    return M.tensor(qs, dtype=M.float64) if M is not F else qs


# (id, fn(M, *arrays) on torch's namespace or F, arrays); the results must be torch's
VALUES = [
    ("nansum", lambda M, x: M.nansum(x), [NANS]),
    ("nansum_dim_keepdim", lambda M, x: M.nansum(x, 1, keepdim=True), [NANS]),
    ("nansum_dims_dtype", lambda M, x: M.nansum(x, (0, -1), dtype=M.float32 if M is not F else "float32"), [NANS]),
    ("nansum_int", lambda M, x: x.nansum(0), [INTS]),
    ("nanmean", lambda M, x: M.nanmean(x, -1), [NANS]),
    ("nanmean_all_keepdim", lambda M, x: x.nanmean(keepdim=True), [NANS]),
    ("nanmean_all_nan_row", lambda M, x: M.nanmean(x, 1), [INFS[:, :1]]),
    ("count_nonzero", lambda M, x: M.count_nonzero(x), [INTS]),
    ("count_nonzero_dims", lambda M, x: x.count_nonzero((0, 2)), [np.round(NANS)]),
    ("count_nonzero_dim", lambda M, x: M.count_nonzero(x, dim=-1), [INFS]),
    ("aminmax", lambda M, x: M.aminmax(x), [X]),
    ("aminmax_dim", lambda M, x: x.aminmax(dim=-2), [X]),
    ("aminmax_keepdim", lambda M, x: M.aminmax(x, keepdim=True), [INTS]),
    ("aminmax_nans", lambda M, x: M.aminmax(x, dim=1, keepdim=True), [NANS]),
    ("var_mean", lambda M, x: M.var_mean(x, 1), [X]),
    ("var_mean_correction", lambda M, x: M.var_mean(x, (0, 2), correction=0, keepdim=True), [X]),
    ("var_mean_unbiased", lambda M, x: M.var_mean(x, False), [X]),
    ("std_mean", lambda M, x: M.std_mean(x, -1, keepdim=True), [X]),
    ("std_mean_unbiased_positional", lambda M, x: M.std_mean(x, 1, False), [X]),
    ("quantile_all", lambda M, x: M.quantile(x, 0.3), [X]),
    ("quantile_list", lambda M, x: M.quantile(x, _q(M, QS), dim=1), [X]),
    ("quantile_keepdim", lambda M, x: x.quantile(_q(M, [0.1, 0.6]), dim=-1, keepdim=True), [X]),
    ("quantile_all_keepdim", lambda M, x: M.quantile(x, 0.75, keepdim=True), [X]),
    ("quantile_nans", lambda M, x: M.quantile(x, _q(M, QS), dim=2), [NANS]),
    ("quantile_infs", lambda M, x: M.quantile(x, _q(M, QS), dim=1), [INFS]),
    ("quantile_ties", lambda M, x: M.quantile(x, _q(M, QS), dim=0), [TIES]),
    ("nanquantile", lambda M, x: M.nanquantile(x, _q(M, QS), dim=-1), [NANS]),
    ("nanquantile_all", lambda M, x: x.nanquantile(0.4), [NANS]),
    ("nanquantile_infs", lambda M, x: M.nanquantile(x, _q(M, QS), dim=1, keepdim=True), [INFS]),
    ("quantile_infs_lower", lambda M, x: M.quantile(x, _q(M, QS), 1, interpolation="lower"), [INFS]),  # NaN after inf
    ("nanquantile_infs_higher", lambda M, x: M.nanquantile(x, _q(M, QS), 1, interpolation="higher"), [INFS]),
    ("nanquantile_float32", lambda M, x: M.nanquantile(x, 0.35, dim=0), [NANS.astype(np.float32)]),
    *[(f"quantile_{i}", lambda M, x, i=i: M.quantile(x, _q(M, QS), 1, interpolation=i), [X]) for i in INTERPOLATIONS],
    *[(f"nanquantile_{i}", lambda M, x, i=i: M.nanquantile(x, 0.35, -1, True, interpolation=i), [NANS])
      for i in INTERPOLATIONS],
    ("kthvalue", lambda M, x: tuple(M.kthvalue(x, 2, 1)), [X]),
    ("kthvalue_keepdim", lambda M, x: tuple(x.kthvalue(3, dim=0, keepdim=True)), [INFS]),
    ("kthvalue_nan_last", lambda M, x: tuple(M.kthvalue(x, 5, -1)), [INFS]),
    ("mode", lambda M, x: tuple(M.mode(x)), [TIES]),
    ("mode_dim_keepdim", lambda M, x: tuple(x.mode(0, keepdim=True)), [TIES]),
    ("mode_ints", lambda M, x: tuple(M.mode(x, 1)), [INTS]),
    ("mode_bools", lambda M, x: tuple(M.mode(x, 0)), [INTS > 0]),
    ("cov", lambda M, x: M.cov(x), [X[0]]),
    ("cov_vector", lambda M, x: M.cov(x), [X[0, 0]]),
    ("cov_ints", lambda M, x: x.cov(correction=0), [INTS]),
    ("cov_weights", lambda M, x, f, a: M.cov(x, correction=2, fweights=f, aweights=a), [X[1].T, FW, AW]),
    ("cov_fweights", lambda M, x, f: M.cov(x, fweights=f), [X[1].T, FW]),
    ("cov_aweights", lambda M, x, a: M.cov(x, correction=0, aweights=a), [X[1].T, AW]),
    ("corrcoef", lambda M, x: M.corrcoef(x), [X[2]]),
    ("corrcoef_one", lambda M, x: x.corrcoef(), [X[0, 0]]),
    ("dist", lambda M, a, b: M.dist(a, b), [X[0], X[1]]),
    ("dist_broadcast_p3", lambda M, a, b: a.dist(b, 3), [X, X[1, 0]]),
    *[(f"dist_p{p}", lambda M, a, b, p=p: M.dist(a, b, p), [X[0], np.round(X[1])])
      for p in (0, 1, 0.5, np.inf, -np.inf)],
    ("histc", lambda M, x: M.histc(x), [X]),
    ("histc_range", lambda M, x: x.histc(bins=6, min=-1, max=1.5), [NANS]),
    ("histc_constant", lambda M, x: M.histc(x, 4), [np.full((3,), 2.0)]),
    ("histc_float32", lambda M, x: M.histc(x, 5, -2, 2), [X.astype(np.float32)]),
    ("histc_edges", lambda M, x: M.histc(x, 7, -0.3, 2.1), [np.linspace(-0.3, 2.1, 8).astype(np.float32)]),
    ("logsumexp_int", lambda M, x: M.logsumexp(x, 1), [INTS]),
    ("logsumexp_dims_keepdim", lambda M, x: x.logsumexp((0, -1), keepdim=True), [X]),
    ("logsumexp_infs", lambda M, x: M.logsumexp(x, -1), [np.nan_to_num(INFS, nan=-np.inf)]),
    ("var_correction_float", lambda M, x: M.var(x, -1, correction=0.5), [X]),
    ("var_unbiased_positional", lambda M, x: M.var(x, False), [X]),
    ("std_correction", lambda M, x: x.std(1, correction=0, keepdim=True), [X]),
]


def _outputs(result) -> dict:
    return {"output": result} if not isinstance(result, tuple) else {f"out{k}": v for k, v in enumerate(result)}


@pytest.mark.parametrize("name,fn,arrays", VALUES, ids=[v[0] for v in VALUES])
def test_values_match_torch(name, fn, arrays):
    torch = pytest.importorskip("torch")
    want = fn(torch, *(torch.from_numpy(a) for a in arrays))
    want = {k: v.numpy() for k, v in _outputs(tuple(want) if not isinstance(want, torch.Tensor) else want).items()}
    names = [f"x{k}" for k in range(len(arrays))]
    model = gc.capture(lambda **kw: _outputs(fn(F, *(kw[n] for n in names))), **dict(zip(names, arrays)))
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(dict(zip(names, arrays)))
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (backend, k)
            np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-12, err_msg=f"{backend} {k}")


def test_kthvalue_on_ties_picks_an_index_holding_the_value():
    """torch's index on ties comes from its quickselect; graphc's is the k-th of a stable sort."""
    torch = pytest.importorskip("torch")
    model = gc.capture(lambda x: dict(zip(("v", "i"), F.kthvalue(x, 3, 1))), x=TIES)
    got = run_both(model, {"x": TIES})
    np.testing.assert_array_equal(got["v"], torch.kthvalue(torch.from_numpy(TIES), 3, 1).values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(TIES, got["i"][:, None], 1)[:, 0], got["v"])
    np.testing.assert_array_equal(got["i"], [4, 0, 2, 4])  # the third 1, the first 0.5, the third 4, the first 2


def test_symbolic_dims_match_torch():
    torch = pytest.importorskip("torch")
    cases = {"quantile": lambda M, x: M.quantile(x, _q(M, QS), dim=1),
             "nanquantile": lambda M, x: M.nanquantile(x, 0.5, dim=-1),
             "kthvalue": lambda M, x: M.kthvalue(x, 2, 1).values,
             "mode": lambda M, x: M.mode(x, -1).indices, "nansum": lambda M, x: M.nansum(x, 1),
             "cov": lambda M, x: M.cov(x), "corrcoef": lambda M, x: M.corrcoef(x),
             "histc": lambda M, x: M.histc(x, 5)}
    for name, fn in cases.items():
        x = np.round(NANS[1], 1) if name in ("mode", "nanquantile", "nansum") else X[1]
        model = gc.capture(lambda x: fn(F, x), x=gc.spec("float64", ("N", "T")))
        onnx.checker.check_model(model.proto, full_check=True)
        np.testing.assert_allclose(run_both(model, {"x": x})["output"], fn(torch, torch.from_numpy(x)).numpy(),
                                   rtol=1e-6, err_msg=name)


# (id, fn(M, x, **inputs) -> a Tensor, x, inputs); the gradients of sum(fn * c) go where torch's go
GRADS = [
    ("nansum", lambda M, x: M.nansum(x, 1), NANS, {}),
    ("nanmean", lambda M, x: M.nanmean(x, (0, 2)), NANS, {}),
    ("aminmax_ties", lambda M, x: M.aminmax(x, dim=1)[0] * 2.0 + M.aminmax(x, dim=1)[1], TIES, {}),
    ("aminmax_all", lambda M, x: M.aminmax(x)[1], TIES, {}),
    ("var_mean", lambda M, x: M.var_mean(x, 1)[0] + M.var_mean(x, 1)[1], X, {}),
    ("std_mean", lambda M, x: M.std_mean(x, -1, correction=0)[0] * M.std_mean(x, -1)[1], X, {}),
    ("quantile", lambda M, x: M.quantile(x, _q(M, QS), dim=1), X, {}),
    ("quantile_ties", lambda M, x: M.quantile(x, _q(M, QS), dim=0), TIES, {}),
    ("quantile_all_midpoint", lambda M, x: M.quantile(x, 0.3, interpolation="midpoint"), X, {}),
    ("quantile_nearest", lambda M, x: M.quantile(x, 0.3, -1, interpolation="nearest"), X, {}),
    ("nanquantile", lambda M, x: M.nanquantile(x, _q(M, QS), dim=-1), NANS, {}),
    ("kthvalue", lambda M, x: M.kthvalue(x, 3, 1).values, X, {}),
    ("mode", lambda M, x: M.mode(x, 1).values, TIES, {}),
    ("cov", lambda M, x: M.cov(x), X[0], {}),
    ("cov_weights", lambda M, x, f, a: M.cov(x, correction=2, fweights=f, aweights=a), X[1].T, {"f": FW, "a": AW}),
    ("corrcoef", lambda M, x: M.corrcoef(x), X[2], {}),
    ("dist", lambda M, x: M.dist(x, x[0] * 0.5), X[1], {}),
    ("dist_p3", lambda M, x: M.dist(x, x.flip(0), 3), X[1], {}),
    ("logsumexp", lambda M, x: M.logsumexp(x, (0, 2)), X, {}),
]


@pytest.mark.parametrize("name,fn,x,inputs", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_match_torch(name, fn, x, inputs):
    pytest.importorskip("torch")
    assert_input_grad_matches_torch(fn, x, inputs, R)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_quantile_gradient_reaches_a_tensor_q_as_torch(interpolation):
    """``q`` as a parameter: torch differentiates its interpolation weight (linear only)."""
    torch = pytest.importorskip("torch")
    q = np.array([0.1, 0.45, 0.8])
    xt, qt = torch.tensor(X, requires_grad=True), torch.tensor(q, requires_grad=True)
    out = torch.nanquantile(xt, qt, dim=1, interpolation=interpolation)
    c = np.asarray(R.standard_normal(tuple(out.shape)))
    (out * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x, q: M.nanquantile(x, q, dim=1, interpolation=interpolation), {"x": X, "q": q}, {},
                       c, backend=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=backend)
        want_q = np.zeros_like(q) if qt.grad is None else qt.grad.numpy()
        np.testing.assert_allclose(got["q"], want_q, rtol=1e-12, atol=1e-14, err_msg=backend)


FD = [g for g in GRADS if g[2] is not TIES and g[0] not in ("nansum", "nanmean", "nanquantile")]


@pytest.mark.parametrize("name,fn,x,inputs", FD, ids=[g[0] for g in FD])
def test_gradients_match_float64_finite_differences(name, fn, x, inputs):
    """Away from ties the picked entries stay picked under a small step (torch not needed)."""
    model = gc.capture(lambda x, **kw: fn(F, x, **kw), x=x, **inputs)
    sess = gc.Session(model, backend="numpy")
    rng = np.random.default_rng(len(name))
    c = np.asarray(rng.standard_normal(model.outputs[0].shape))
    grad = gc_grads(lambda M, x, **kw: fn(M, x, **kw), {"x": x}, inputs, c)["x"]
    assert_directional_derivatives(sess, {"x": x, **inputs}, {"x": grad}, ["x"], c, rng)


class _NanLoss(gc.nn.Module):
    """``nansum(3 * x) + c * sum(histc(x))`` of a parameter ``x`` holding NaNs."""

    def __init__(self):
        super().__init__()
        self.x = gc.nn.Parameter(NANS, dtype="float64")

    def forward(self, c):
        return {"loss": F.nansum(self.x * 3.0) + F.sum(F.histc(self.x, 4)) * c}


def test_nansum_routes_no_gradient_to_nans_and_histc_none():
    grads = gc.grad(gc.capture(_NanLoss(), c=np.ones(())), "loss")
    got = gc.Session(grads, backend="numpy").run({"c": np.ones(())})["x_grad"]
    np.testing.assert_array_equal(got, np.where(np.isnan(NANS), 0.0, 3.0))


ERRORS = [
    ("nanmean_int", lambda x: F.nanmean(x.long()), "nanmean input: expected a floating-point Tensor, got int64"),
    ("quantile_int", lambda x: F.quantile(x.long(), 0.5), "quantile input: expected float32 or float64, got int64"),
    ("quantile_q_range", lambda x: x.quantile(1.5), r"quantile q=1.5: expected a number or a 1-D list .* \[0, 1\]"),
    ("quantile_q_2d", lambda x: F.nanquantile(x, [[0.5]]), "nanquantile q=.*1-D list"),
    ("quantile_q_dtype", lambda x: F.quantile(x, F.full([2], 0.5, "float32")), "quantile q: expected .* float64"),
    ("quantile_interpolation", lambda x: F.quantile(x, 0.5, interpolation="cubic"),
     r"quantile interpolation='cubic': expected one of \['linear'"),
    ("quantile_dim", lambda x: F.quantile(x, 0.5, dim=3), "dim 3 out of range for rank 2"),
    ("kthvalue_k", lambda x: F.kthvalue(x, 6, 1), r"kthvalue k=6: expected an int from 1 to the size of dim 1 \(5\)"),
    ("kthvalue_zero", lambda x: x.kthvalue(0), "kthvalue k=0"),
    ("cov_rank", lambda x: F.cov(F.unsqueeze(x, 0)), "cov input: expected a 1-D or 2-D Tensor, got"),
    ("cov_fweights_float", lambda x: F.cov(x, fweights=x[0]), "cov fweights: expected a 1-D integer Tensor"),
    ("cov_aweights_int", lambda x: F.cov(x, aweights=x[0].long()), "cov aweights: expected a 1-D floating-point"),
    ("cov_weights_length", lambda x: F.cov(x, aweights=x[0, :3]), "cov aweights: expected 5 entries .*, got 3"),
    ("histc_int", lambda x: F.histc(x.long()), "histc input: expected a floating-point Tensor, got int64"),
    ("histc_range", lambda x: F.histc(x, 10, 2, 1), "histc bins=10, min=2, max=1: expected a positive int"),
    ("histc_bins", lambda x: x.histc(0), "histc bins=0"),
]


@pytest.mark.parametrize("name,fn,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_name_the_argument(name, fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=X[0].T)  # 4 variables, 5 observations
    assert "test_dsl_stats.py:" in str(info.value)


@pytest.mark.parametrize("opset", [17, 23])
def test_other_opsets_give_the_same_values(opset):
    """Reductions take their axes as an attribute below opset 18: every function at ``opset`` gives
    what it gives at 21, through the full checker, on both backends."""
    fns = {"quantile": lambda x: F.quantile(x, QS, dim=1), "nanquantile": lambda x: x.nanquantile(0.3),
           "kthvalue": lambda x: F.kthvalue(x, 2, -1).values, "mode": lambda x: x.round().mode(0).indices,
           "aminmax": lambda x: F.aminmax(x, dim=1).max, "nanmean": lambda x: F.nanmean(x, -1),
           "count_nonzero": lambda x: F.count_nonzero(x.round(), 0), "cov": lambda x: F.cov(x[0]),
           "corrcoef": lambda x: F.corrcoef(x[1]), "dist": lambda x: F.dist(x, x[0], 3),
           "histc": lambda x: F.histc(x, 6),
           "var_mean": lambda x: F.var_mean(x, -1)[1], "std_mean": lambda x: F.std_mean(x, False)[0]}
    for name, fn in fns.items():
        want = gc.Session(gc.capture(fn, x=NANS), backend="numpy").run({"x": NANS})["output"]
        model = gc.capture(fn, x=NANS, opset=opset)
        onnx.checker.check_model(model.proto, full_check=True)
        np.testing.assert_allclose(run_both(model, {"x": NANS})["output"], want, rtol=1e-12, err_msg=name)


def test_histc_of_its_own_range_skips_nans():
    """torch refuses a data range with NaN in it; graphc's is the range of the other entries."""
    torch = pytest.importorskip("torch")
    want = torch.histc(torch.from_numpy(NANS[~np.isnan(NANS)]), 6).numpy()
    got = run_both(gc.capture(lambda x: F.histc(x, 6), x=gc.spec("float64", ("N", 5, 4))), {"x": NANS})["output"]
    np.testing.assert_array_equal(got, want)
