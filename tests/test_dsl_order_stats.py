"""median, nanmedian, cummax, cummin and max/min over a dim against torch: values and indices
(NaNs and ties included) on the numpy and ort-cpu backends, gradients against torch's (which go
to the picked index, or evenly over ties for a median of everything) and float64 central
differences; and the (values, indices) result's compatibility with code that took the values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads, run_both

R = np.random.default_rng(5)
X = R.standard_normal((3, 5, 4))
TIES = np.array([[2.0, 1, 2, 1, 1, 2], [0.5, 0.5, -1, 3, 3, -1], [4, 4, 4, 4, 4, 4]])
NANS = np.array([[3.0, 1, np.nan, 2, np.nan, 0], [1, 1, 2, 2, 0, 5], [np.nan] * 6, [2, np.nan, 1, 7, 1, 1]])

# (id, fn(M, x) returning a (values, indices) pair on torch and on the DSL)
PAIRS = [
    ("median_dim", lambda M, x: M.median(x, 1)),
    ("median_dim_keepdim", lambda M, x: x.median(dim=-1, keepdim=True)),
    ("nanmedian_dim", lambda M, x: M.nanmedian(x, 0)),
    ("nanmedian_keepdim", lambda M, x: x.nanmedian(-1, keepdim=True)),
    ("cummax", lambda M, x: M.cummax(x, 1)),
    ("cummin", lambda M, x: x.cummin(dim=-1)),
    ("max_dim", lambda M, x: x.max(1)),
    ("max_dim_keepdim", lambda M, x: M.max(x, dim=-1, keepdim=True)),
    ("min_dim", lambda M, x: x.min(dim=0)),
]
DATA = {"random": X, "ties": TIES, "nans": NANS}


@pytest.mark.parametrize("data", DATA, ids=list(DATA))
@pytest.mark.parametrize("name,fn", PAIRS, ids=[p[0] for p in PAIRS])
def test_values_and_indices_match_torch(name, fn, data):
    torch = pytest.importorskip("torch")
    x = DATA[data]
    want = fn(torch, torch.from_numpy(x))
    model = gc.capture(lambda x: dict(zip(("values", "indices"), fn(F, x))), x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})
        found = ~np.isnan(want.values.numpy()) if name.startswith("nanmedian") else True  # all NaN: torch's any
        np.testing.assert_array_equal(np.where(found, got["indices"], 0), np.where(found, want.indices.numpy(), 0),
                                      err_msg=backend)
        np.testing.assert_array_equal(got["values"], want.values.numpy(), err_msg=backend)


def test_int_inputs_and_symbolic_dims_match_torch():
    torch = pytest.importorskip("torch")
    i = R.integers(-4, 4, (3, 7)).astype(np.int32)
    cases = {"median": lambda M, x: M.median(x, 1), "nanmedian": lambda M, x: M.nanmedian(x, 1),
             "cummax": lambda M, x: M.cummax(x, 1), "cummin": lambda M, x: M.cummin(x, 0),
             "max": lambda M, x: M.max(x, 1), "min": lambda M, x: M.min(x, 0)}
    for name, fn in cases.items():
        want = fn(torch, torch.from_numpy(i))
        model = gc.capture(lambda x: dict(zip(("values", "indices"), fn(F, x))), x=gc.spec("int32", ("N", "T")))
        got = run_both(model, {"x": i})
        np.testing.assert_array_equal(got["values"], want.values.numpy(), err_msg=name)
        np.testing.assert_array_equal(got["indices"], want.indices.numpy(), err_msg=name)
    for fn in (lambda M, x: M.median(x), lambda M, x: x.nanmedian()):
        got = run_both(gc.capture(lambda x: fn(F, x), x=gc.spec("float64", ("N", 6))), {"x": NANS[1:2]})["output"]
        assert got == fn(torch, torch.from_numpy(NANS[1:2])).item()


# (id, fn(M, x) -> a Tensor, data); the gradients of sum(fn * c) go where torch's go
GRADS = [
    ("median_dim", lambda M, x: M.median(x, 1).values, X),
    ("median_dim_ties", lambda M, x: x.median(-1, keepdim=True).values, TIES),
    ("median_all", lambda M, x: M.median(x), X),
    ("median_all_ties", lambda M, x: x.median(), TIES),
    ("nanmedian_dim", lambda M, x: M.nanmedian(x, 1).values, X),
    ("nanmedian_all_ties", lambda M, x: M.nanmedian(x), TIES),
    ("cummax", lambda M, x: M.cummax(x, 1).values, X),
    ("cummax_ties", lambda M, x: x.cummax(-1).values, TIES),
    ("cummin_ties", lambda M, x: M.cummin(x, 0).values, TIES),
    ("max_dim_ties", lambda M, x: x.max(1).values, TIES),
    ("max_dim_as_values", lambda M, x: (x.max(dim=-1, keepdim=True) if M is F else x.max(-1, True).values) * 2.0, X),
    ("min_dim_ties", lambda M, x: M.min(x, 0).values, TIES),
]


@pytest.mark.parametrize("name,fn,x", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_match_torch(name, fn, x):
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    out = fn(torch, xt)
    if not isinstance(out, torch.Tensor):
        out = out.values
    c = np.asarray(R.standard_normal(tuple(out.shape)))
    (out * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, x: fn(M, x), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=backend)


@pytest.mark.parametrize("name,fn,x", [g for g in GRADS if g[2] is X], ids=[g[0] for g in GRADS if g[2] is X])
def test_gradients_match_float64_finite_differences(name, fn, x):
    """Away from ties the picked entries stay picked under a small step (torch not needed)."""
    model = gc.capture(lambda x: fn(F, x), x=x)
    sess = gc.Session(model, backend="numpy")
    rng = np.random.default_rng(len(name))
    c = np.asarray(rng.standard_normal(model.outputs[0].shape))
    grad = gc_grads(lambda M, x: fn(M, x), {"x": x}, {}, c)["x"]
    eps = 1e-6
    for _ in range(2):
        t = rng.standard_normal(x.shape)
        f = [float((sess.run({"x": x + s * eps * t})["output"] * c).sum()) for s in (1, -1)]
        np.testing.assert_allclose(float((grad * t).sum()), (f[0] - f[1]) / (2 * eps), rtol=1e-7)


def test_max_over_a_dim_keeps_working_as_its_values():
    """Code that took ``x.max(dim)`` for the values still runs; torch's unpacking and attributes
    work; a bare int index, ambiguous between the two, is refused; ``gc.max`` and a tuple of
    dims, or ``axis=None``, give values only."""
    def fn(x):
        v, i = x.max(1)
        pair = F.min(x, dim=1, keepdim=True)
        assert not isinstance(gc.max(x, axis=1), type(pair)) and not isinstance(x.max((0, 1)), type(pair))
        return {"shifted": x - x.max(-1, keepdims=True), "v": v, "i": i, "pv": pair.values, "pi": pair.indices,
                "rows": x.max(dim=1)[:2], "all": x.max()}

    got = gc.Session(gc.capture(fn, x=X[0]), backend="numpy").run({"x": X[0]})
    np.testing.assert_array_equal(got["shifted"], X[0] - X[0].max(-1, keepdims=True))
    np.testing.assert_array_equal(got["v"], X[0].max(1))
    np.testing.assert_array_equal(got["i"], X[0].argmax(1))
    np.testing.assert_array_equal(got["pv"][:, 0], X[0].min(1))
    np.testing.assert_array_equal(got["pi"][:, 0], X[0].argmin(1))
    np.testing.assert_array_equal(got["rows"], X[0].max(1)[:2])
    assert got["all"] == X[0].max()
    with pytest.raises(gc.GraphError, match=r"\[0\] of a \(values, indices\) result is ambiguous: write .values"):
        gc.capture(lambda x: x.max(1)[0], x=X[0])


ARGS = {"argmax": lambda M, x: M.argmax(x, 1), "argmin_keepdim": lambda M, x: M.argmin(x, dim=0, keepdim=True),
        "argmax_flat": lambda M, x: M.argmax(x), "argmin_flat": lambda M, x: M.argmin(x),
        "method_argmax": lambda M, x: x.argmax(dim=-1), "method_argmin": lambda M, x: x.argmin(1),
        "max_indices": lambda M, x: x.max(1).indices, "min_indices": lambda M, x: x.min(dim=1).indices}


@pytest.mark.parametrize("data", [NANS, np.array([[1.0, np.nan, 3], [2, 0, 1]])], ids=["nans", "one-nan"])
@pytest.mark.parametrize("name", ARGS)
def test_argmax_argmin_pick_a_nan_as_torch(name, data):
    """A NaN is the largest and the smallest entry (its first index), as torch's, on both backends."""
    torch = pytest.importorskip("torch")
    fn = ARGS[name]
    model = gc.capture(lambda x: fn(gc, x), x=gc.spec("float64", ("N", data.shape[1])))
    onnx.checker.check_model(model.proto, full_check=True)
    np.testing.assert_array_equal(run_both(model, {"x": data})["output"], fn(torch, torch.from_numpy(data)).numpy())
