"""Tensor methods and functions against torch's: each case is ``fn(M, *params, **inputs)`` with
``M`` the DSL's namespace (``gc.nn.functional``) or torch's, and methods called on the tensors
themselves. The output on the numpy and ort-cpu backends (after the full ONNX checker) and the
``gc.grad`` gradients of ``sum(out * c)`` with respect to every float ``param`` match torch's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import assert_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_matches_torch, run_both

R = np.random.default_rng(11)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
Y = R.standard_normal((2, 3, 4)).astype(np.float32)
# divisors kept away from 0 (% jumps where a quotient is whole, which random data misses)
D = (np.sign(Y) * (np.abs(Y) + 0.5)).astype(np.float32)
I = np.array([[-3, 0, 2, 5], [1, -1, 0, 4]], np.int64)
SPECIAL = np.array([[np.nan, np.inf, -np.inf, 1.5], [-2.0, 0.0, np.nan, -np.inf]], np.float32)
TIES = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5], [-1.0, 2.0, -1.0, 0.0]], np.float32)
ZERO_ROW = X.copy()
ZERO_ROW[1, 2] = 0  # a zero vector: its 2-norm's gradient is 0 in torch, not nan
WITH_ZERO = X.copy()
WITH_ZERO[0, 1, 2] = 0  # prod's gradient there is the product of the others
M34 = R.standard_normal((3, 4)).astype(np.float32)
IDX = np.array([2, 0, 2], np.int64)  # repeated: index_add sums both


def _values(result):
    """torch's ``max(x, dim)`` gives ``(values, indices)``, the DSL's the values (as numpy's)."""
    return getattr(result, "values", result)


# (id, fn(M, *params, **inputs), params (differentiated), inputs (graph inputs, not differentiated))
CASES = [
    ("remainder", lambda M, x, d: x % d, (X * 5, D), {}),
    ("remainder_scalar", lambda M, x: x % -0.7, (X,), {}),
    ("remainder_fn", lambda M, x, d: M.remainder(x, d), (X * 5, D), {}),
    ("fmod", lambda M, x, d: M.fmod(x, d), (X * 5, D), {}),
    ("clamp_tensor_bounds", lambda M, x, lo, hi: x.clamp(min=lo, max=hi), (X, X[:, :1] * 0.5, Y[:1] + 0.5), {}),
    ("clamp_tensor_min_over_max", lambda M, x, lo, hi: M.clamp(x, lo, hi), (X, Y, Y - 0.3), {}),
    ("clamp_tensor_min_broadcasts_x", lambda M, x, lo: x.clamp(lo), (X[0], Y * 0.2), {}),
    ("clamp_tensor_max_only", lambda M, x, hi: x.clamp(max=hi), (X, Y[0, 0]), {}),
    ("flatten_0d", lambda M, x: (x * 2).sum().flatten(), (X,), {}),
    ("sum_dim_keepdim", lambda M, x: x.sum(dim=(0, 2), keepdim=True), (X,), {}),
    ("sum_dim_positional_keepdim", lambda M, x: x.sum(-1, True), (X,), {}),
    ("mean_dim", lambda M, x: x.mean(dim=1), (X,), {}),
    ("max_dim_keepdim_values", lambda M, x: x.amax(dim=1, keepdim=True) if M is not F else x.max(dim=1, keepdim=True),
     (X,), {}),
    ("min_dim", lambda M, x: x.amin(-1) if M is not F else x.min(dim=-1), (X,), {}),
    ("max_elementwise", lambda M, x, y: x.max(y), (X, Y), {}),
    ("min_elementwise", lambda M, x, y: x.min(y), (X, Y), {}),
    ("functional_reductions", lambda M, x: M.sum(x, dim=1, keepdim=True) * M.mean(x, dim=(0, 2)).sum()
     + M.max(x, x * 0.5) - _values(M.min(x, -1, keepdim=True)) + M.max(x), (X,), {}),
    ("functional_transpose", lambda M, x: M.transpose(x, 0, 2).sum() * M.transpose(x, -1, 1), (X,), {}),
    ("softmax_dim", lambda M, x: x.softmax(dim=1), (X,), {}),
    ("log_softmax_dim", lambda M, x: x.log_softmax(dim=-1), (X,), {}),
    ("cumsum_bool", lambda M, x: (x > 0).cumsum(1), (X,), {}),
    # elementwise math
    ("square", lambda M, x: x.square() + M.square(x[0]), (X,), {}),
    ("reciprocal", lambda M, x: (x.abs() + 0.5).reciprocal(), (X,), {}),
    ("reciprocal_int", lambda M, i: M.reciprocal(i + 10), (), {"i": I}),
    ("neg", lambda M, x: x.neg() * M.neg(x) + x.negative(), (X,), {}),
    ("sign", lambda M, x: x.sign() * x, (X,), {}),
    ("floor", lambda M, x: M.floor(x * 3), (X,), {}),
    ("floor_ceil", lambda M, x: x.floor() * x + x.ceil(), (X * 3,), {}),
    ("round", lambda M, x: M.round(x * 3), (X,), {}),
    ("round_half_even", lambda M, x: x.round(), (np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49], np.float32),), {}),
    ("round_decimals", lambda M, x: x.round(decimals=1) * x, (X,), {}),
    ("trunc_frac", lambda M, x: x.trunc() * 2 + x.frac() * x, (X * 3,), {}),
    ("rounding_int", lambda M, i: M.floor(i) + i.ceil() + i.round() + i.trunc(), (), {"i": I}),
    ("logaddexp", lambda M, x, y: M.logaddexp(x * 30, y), (X, Y), {}),
    ("logaddexp_ties", lambda M, x: x.logaddexp(x), (X,), {}),
    ("logaddexp_infinities", lambda M, s: M.logaddexp(s, s), (), {"s": SPECIAL}),
    ("remainder_method", lambda M, x, d: x.remainder(d) + x.fmod(d), (X * 5, D), {}),
    ("maximum_minimum_where", lambda M, x, y: x.maximum(y) * x.minimum(y) + x.where(x > y, y), (X, Y), {}),
    ("where_by_keyword", lambda M, x, y: M.where(condition=x > y, input=x, other=y * 2), (X, Y), {}),
    # logic and tests
    ("logical", lambda M, x, i: M.logical_and(x > 0, i) ^ x.logical_or(i).logical_not() | M.logical_xor(i, x < 0.5),
     (), {"x": X[0, :2], "i": I}),
    ("isnan_isinf_isfinite", lambda M, s: M.stack([s.isnan(), M.isinf(s), s.isfinite()]), (), {"s": SPECIAL}),
    ("isnan_int", lambda M, i: M.stack([i.isnan(), i.isinf(), i.isfinite()]), (), {"i": I}),
    ("nan_to_num", lambda M, x: M.nan_to_num(x) * 1e-30, (SPECIAL,), {}),
    ("nan_to_num_values", lambda M, x: x.nan_to_num(nan=1.0, posinf=5.0, neginf=-5.0) * 2, (SPECIAL,), {}),
    # reductions
    ("prod", lambda M, x: x.prod(1) + M.prod(x, -1, keepdim=True).sum(), (X,), {}),
    ("prod_all_with_zero", lambda M, x: M.prod(x[0]) + x.prod(2), (WITH_ZERO,), {}),
    ("amax_amin_ties", lambda M, x: x.amax(1) + M.amin(x, 0, keepdim=True).sum() + x.amax(), (TIES,), {}),
    ("amax_dims", lambda M, x: M.amax(x, (0, 2)) - x.amin(dim=(-1, 1), keepdim=True).sum(), (X,), {}),
    ("any_all", lambda M, x, i: M.stack([(x > 0).any(1), M.all(x > -1, dim=1), i.any(1), M.all(i, 1)]), (),
     {"x": X[0, :2], "i": I}),
    ("any_all_everything", lambda M, x: M.stack([x.any(), (x > -3).all(), M.any(x > 5)]), (), {"x": X}),
    ("norm", lambda M, x: x.norm() + M.norm(x, dim=-1).sum(), (X,), {}),
    ("norm_zero_vector", lambda M, x: M.norm(x, dim=2, keepdim=True), (ZERO_ROW,), {}),
    ("norm_p", lambda M, x: M.stack([x.norm(p=1, dim=1), x.norm(p=float("inf"), dim=1), x.norm(p=3, dim=1),
                                     M.norm(x, p=-float("inf"), dim=1)]), (X,), {}),
    ("norm_p0", lambda M, x: x.norm(p=0, dim=(0, 2)), (ZERO_ROW,), {}),
    ("var_std", lambda M, x: x.var(1) + x.std(dim=1, unbiased=False) + M.var(x, 1, correction=2) * 0.5, (X,), {}),
    ("var_std_all_keepdim", lambda M, x: x.var(dim=(0, 2), keepdim=True) * M.std(x, unbiased=True), (X,), {}),
    ("logsumexp_method", lambda M, x: x.logsumexp(1) + x.logsumexp(dim=-1, keepdim=True).sum(), (X,), {}),
    # shapes, selection, sorting
    ("flip_roll", lambda M, x: x.flip(0) * x.flip(0, 2) + x.flip([1]).roll(1, 2), (X,), {}),
    # torch's dims by keyword too (docs/api.md: `.squeeze(dim=None)`)
    ("dims_by_keyword", lambda M, x: x[:, :1].squeeze(dim=1) + x.permute(dims=(0, 2, 1)).flip(dims=[1]).sum(2)
     * x[:, 1:2].squeeze(dim=(1, 0)), (X,), {}),
    ("unflatten", lambda M, x: x.unflatten(2, (2, 2)) * M.unflatten(x, 1, (1, -1)).sum(), (X,), {}),
    ("movedim", lambda M, x: x.movedim(0, -1) * M.movedim(x, (0, 1), (2, 0)), (X,), {}),
    ("moveaxis", lambda M, x: x.moveaxis(2, 0), (X,), {}),
    ("narrow", lambda M, x: x.narrow(2, 1, 2) * M.narrow(x, -1, -3, 2), (X,), {}),
    ("select", lambda M, x: x.select(1, -1) * M.select(x, 2, 0).sum(), (X,), {}),
    ("t_mT", lambda M, x: x[0].t() @ x[1] + x.mT.sum(0) @ x[0] + x[0, 0].t(), (X,), {}),
    ("diff", lambda M, x: x.diff() * M.diff(x, n=2, dim=-1).sum() + x.diff(dim=0).sum(), (X,), {}),
    ("sort", lambda M, x: x.sort(dim=1).values * M.sort(x, descending=True)[0][:, :1, :1], (X,), {}),
    ("sort_indices_ties", lambda M, x: M.stack([x.sort(stable=True).indices, M.argsort(x, dim=-1, stable=True),
                                                 x.sort(descending=True, stable=True)[1]]), (), {"x": TIES}),
    ("outer", lambda M, x, y: M.outer(x, y) + x.outer(y * 2), (X[0, 0], Y[1, 1]), {}),
    ("addmm", lambda M, b, x, y: M.addmm(b, x, y) + b.addmm(x, y, beta=0.5, alpha=-2.0), (Y[0, :, :3], M34, X[0].T),
     {}),
    ("addmm_beta0_ignores_nan", lambda M, x, y, b: M.addmm(b, x, y, beta=0), (M34, X[0].T), {"b": SPECIAL[:1, :3]}),
    ("baddbmm", lambda M, b, x, y: M.baddbmm(b, x, y, alpha=0.5) + b.baddbmm(x, y),
     (Y[:, :, :3], X, Y.transpose(0, 2, 1)), {}),
    ("index_add", lambda M, x, s, i: x.index_add(1, i, s) + M.index_add(x, 1, i, s, alpha=2.0), (X, Y), {"i": IDX}),
    ("index_add_last_dim", lambda M, x, s, i: M.index_add(x, -1, i, s), (X, Y[..., :3]), {"i": IDX}),
    ("index_copy", lambda M, x, s, i: x.index_copy(2, i, s), (X, Y[..., :2]), {"i": IDX[:2]}),
    ("repeat_interleave", lambda M, x: x.repeat_interleave(2, dim=1) + M.repeat_interleave(x, 3).sum(), (X,), {}),
    ("as_shapes", lambda M, x, y: x[:1, :, :1].expand_as(y) * y.view_as(y.reshape(4, 6)).reshape_as(x), (X, Y), {}),
    ("new_tensors", lambda M, x: x + x.new_zeros(3, 4) + x.new_ones((4,)) * x.new_full((3, 1), 2.5), (X,), {}),
    ("new_zeros_dtype", lambda M, x: x.new_zeros((2, 2), dtype=M.int64 if hasattr(M, "int64") else "int64") + 1, (),
     {"x": X}),
    ("clone_numel", lambda M, x: x.clone() * x.numel() + x.contiguous(), (X,), {}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name,fn,params,inputs", CASES, ids=IDS)
def test_output_and_gradients_match_torch(name, fn, params, inputs):
    assert_matches_torch(fn, params, inputs, R)


@pytest.mark.parametrize("call,message", [
    (lambda x: x.sum(1, dim=2), "as axis= or dim=, not both"),
    (lambda x: gc.max(x, x), r"ReduceMax.*the axes must be ints, not a Tensor \(for the elementwise max or min of two "
                             r"Tensors use gc\.maximum or gc\.minimum\)"),
    (lambda x: x.movedim((0, 1), 2), r"movedim: source \(0, 1\) and destination 2 differ in length"),
    (lambda x: x.movedim((0, 1), (2, 2)), "repeated dims"),
    (lambda x: x.narrow(1, 2, 2), r"narrow\(1, 2, 2\) is outside dim 1 of size 3"),
    (lambda x: x.narrow(0, -1, 1), "symbolic dim 0 takes a start >= 0"),
    (lambda x: x.select(2, 4), "select index 4 out of range for dim 2 of size 4"),
    (lambda x: x.permute(0, 2, 1, dims=(0, 1, 2)), r"permute\(\) got its dims both positionally and by keyword"),
    (lambda x: x.t(), r"t\(\) takes a Tensor of rank <= 2, got rank 3"),
    (lambda x: gc.outer(x, x), "outer takes two 1-D Tensors"),
    (lambda x: gc.addmm(x, x, x), "addmm takes two 2-D Tensors, got ranks 3 and 3"),
    (lambda x: x.index_add(1, x, x), "index_add takes a 1-D int64 or int32 index, got float32"),
    (lambda x: x.repeat_interleave(x), "repeat_interleave takes an int repeats"),
    (lambda x: x.norm(p="nuc"), "norm p='nuc'; expected 'fro' or a number"),
    (lambda x: x.numel(), r"numel\(\) needs static dims"),
    (lambda x: x.expand_as(x[:, :2, :1].sum(0)), "Expand"),
    (lambda x: gc.isclose(x, x.double()), "dtype mismatch float32 vs float64"),
    (lambda x: gc.fmod(x > 0, x > 1), "fmod takes integer or float Tensors, got bool"),
    (lambda x: x[x[0] > 0], r"the mask's dim 1 \(4\) does not match axis 1 of the indexed tensor \(3\)"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3, 4)))
    assert "test_dsl_torch_methods.py" in str(err.value)


def test_symbolic_batch_dims():
    """The functions that read a size (sort's length, repeat_interleave's, unflatten's, a mask's
    count) on a symbolic batch dim: one graph runs at two batch sizes, against numpy."""
    def fn(x, i):
        return {"sort": x.sort(dim=0).values, "argsort": x.argsort(dim=0), "ri": x.repeat_interleave(2, dim=0),
                "unflatten": x.unflatten(2, (2, 2)), "narrow": x.narrow(0, 1, 1), "diff": x.diff(dim=0),
                "masked": x[x > 0], "expand_as": x[:1].expand_as(x), "movedim": x.movedim(0, 2),
                "index_add": x.index_add(0, i, x[:2] * 2)}
    model = gc.capture(fn, x=gc.spec("float32", ("N", 3, 4)), i=gc.spec("int64", [2]))
    onnx.checker.check_model(model.proto, full_check=True)
    shapes = {o.name: tuple(o.shape) for o in model.outputs}
    assert shapes["sort"] == shapes["argsort"] == shapes["index_add"] == ("N", 3, 4)
    assert shapes["unflatten"] == ("N", 3, 2, 2) and shapes["movedim"] == (3, 4, "N")
    rng = np.random.default_rng(0)  # its own draws: the values do not depend on which tests ran before
    for n in (2, 5):
        x = rng.standard_normal((n, 3, 4)).astype(np.float32)
        out = run_both(model, {"x": x, "i": np.array([1, 1])})
        added = x.copy()
        added[1] += 2 * (x[0] + x[1])
        want = {"sort": np.sort(x, 0), "argsort": np.argsort(x, 0, kind="stable"), "ri": np.repeat(x, 2, 0),
                "unflatten": x.reshape(n, 3, 2, 2), "narrow": x[1:2], "diff": np.diff(x, axis=0), "masked": x[x > 0],
                "expand_as": np.broadcast_to(x[:1], x.shape), "movedim": np.moveaxis(x, 0, 2), "index_add": added}
        for k, v in want.items():
            # atol: index_add sums x[1] + 2 x[0] + 2 x[1] in another order than numpy, a float32 rounding
            np.testing.assert_allclose(out[k], v, rtol=1e-6, atol=1e-6, err_msg=f"{k} at N={n}")
