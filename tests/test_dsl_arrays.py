"""torch's array functions and methods (``graphc/dsl/ops_reshape.py``, ``graphc/dsl/ops_scatter.py``
and the dtype methods of ``methods_torch``): each case's output on the numpy and ort-cpu backends
(after the full ONNX checker) and its ``gc.grad`` gradients against torch's; float64 central
differences for the lowerings built of several nodes; symbolic batch dims; bad arguments."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import (assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                 run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                       run_both)

R = np.random.default_rng(7)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
Y = R.standard_normal((2, 3, 4)).astype(np.float32)
SRC = R.standard_normal((2, 3, 5)).astype(np.float32)
SIDX = np.array([[[0, 2, 0], [3, 3, 1], [1, 1, 1]], [[2, 2, 2], [0, 1, 3], [3, 0, 0]]], np.int64)  # repeats
TIES = np.array([[[1.0, 2.0, 2.0, 0.0], [3.0, 3.0, 3.0, 3.0]]], np.float32)
TIES_SRC = np.array([[[2.0, 2.0, 5.0], [3.0, 1.0, 3.0]]], np.float32)
TIES_IDX = np.array([[[1, 2, 3], [0, 1, 0]]], np.int64)
ROWS = np.array([1, -1, 0], np.int64)
COLS = np.array([[2], [0]], np.int64)
MASK = X[0] > 0  # [3, 4], broadcast over X's dim 0
SQ = R.standard_normal((2, 1, 4, 1)).astype(np.float32)
I8 = np.array([[-3, 0, 2, 5], [1, -1, 0, 4]], np.int64)


def _joined(M, pieces, dim):
    """The pieces back in one Tensor, each scaled by its position, so their order and sizes count."""
    return M.cat([p * (k + 1) for k, p in enumerate(pieces)], dim)


def _dtype(M, name):
    """``name`` as torch's dtype object or graphc's dtype."""
    return getattr(getattr(M, "torch", None), name, None) or gc.spec(name, ()).dtype


# (id, fn(M, *params, **inputs), params (differentiated), inputs (graph inputs, not differentiated))
CASES = [
    # splitting
    ("unbind", lambda M, x: M.stack(M.unbind(x, 1), 0) * x.unbind(-1)[2].sum(), (X,), {}),
    ("tensor_split_sections", lambda M, x: _joined(M, M.tensor_split(x, 3, dim=2), 2), (X,), {}),
    ("tensor_split_indices", lambda M, x: _joined(M, x.tensor_split([1, 5, 2], dim=-1), 2), (X,), {}),
    ("tensor_split_more_sections", lambda M, x: _joined(M, x.tensor_split(5, 1), 1), (X,), {}),
    ("hsplit_vsplit_dsplit", lambda M, x: _joined(M, M.hsplit(x, 3), 1) + _joined(M, x.vsplit([1]), 0)
     + _joined(M, M.dsplit(x, [1, 3]), 2), (X,), {}),
    ("hsplit_1d", lambda M, x: _joined(M, x.hsplit(2), 0), (X[0, 0],), {}),
    ("split_with_sizes", lambda M, x: _joined(M, M.split_with_sizes(x, [1, 3], dim=-1), 2)
     + _joined(M, x.split_with_sizes([2, 1], 1), 1), (X,), {}),
    # axes
    ("squeeze", lambda M, x: M.squeeze(x, (1, 3)) * x.squeeze(1, 3) + x.squeeze() + M.squeeze(x, 0).squeeze(-1)
     .squeeze(0), (SQ,), {}),
    ("squeeze_other_sizes_stay", lambda M, x: M.squeeze(x, (0, 2)) * x.squeeze(-2), (SQ,), {}),
    ("unsqueeze", lambda M, x: M.unsqueeze(x, -1).sum(0) * x.unsqueeze(0).sum(0).unsqueeze(3)
     + M.unsqueeze(x, 3).sum(0), (X,), {}),
    ("swapaxes_swapdims", lambda M, x: M.swapaxes(x, 0, 2) * x.swapdims(-1, 0) + M.swapdims(x, 2, 0), (X,), {}),
    ("moveaxis", lambda M, x: M.moveaxis(x, (0, 1), (-1, 0)), (X,), {}),
    ("rot90", lambda M, x: M.stack([x.rot90(), M.rot90(x, 2), M.rot90(x, -1, (0, 1)), x.rot90(3, [1, 0]),
                                     x.rot90(4)]), (X[0, :, :3],), {}),
    ("rot90_dims", lambda M, x: M.rot90(x, 1, (2, 0)) + x.rot90(-3, (-1, 0)), (X,), {}),
    ("fliplr_flipud", lambda M, x: M.fliplr(x) * x.flipud() + M.flipud(x[0, 0]).sum(), (X,), {}),
    ("ravel", lambda M, x: M.ravel(x) * x.ravel().flip(0) + M.ravel(x[0, 0, 0]), (X,), {}),
    # broadcasting and copies
    ("broadcast_to", lambda M, x: M.broadcast_to(x[:, :1], (2, 3, 4)) * x[0].broadcast_to((5, 3, -1)).sum(0),
     (X,), {}),
    ("broadcast_tensors", lambda M, a, b, c: M.stack(M.broadcast_tensors(a, b, c)), (X[:, :1], Y[0, :, :1], Y[0, 0]),
     {}),
    ("atleast", lambda M, x: M.atleast_1d(x[0, 0, 0]) * M.atleast_2d(x[0, 0]).sum() + M.atleast_3d(x[0])
     .sum((0, 2)) + M.cat(M.atleast_3d(x[0, 0], x[1, 0, 0]), 1).sum() + M.atleast_2d([x])[0].sum(), (X,), {}),
    ("atleast_3d_shapes", lambda M, x: M.stack([M.atleast_3d(x[0, 0]), M.atleast_3d(x[0, 0].unsqueeze(0))]), (X,),
     {}),
    ("clone", lambda M, x: M.clone(x) * 2 + x.clone(), (X,), {}),
    # picking
    ("take_along_dim", lambda M, x, i: M.take_along_dim(x, i, dim=2).sum()
     * x.take_along_dim(i[:, :2, :1], 1), (X,), {"i": SIDX[:, :, :2] % 3}),
    ("take_along_dim_broadcast", lambda M, x, i: M.take_along_dim(x, i[:1, :, :2], -1)
     + M.take_along_dim(x[:, :1], i[:, :, :2], 2).sum(1, keepdim=True), (X,), {"i": SIDX}),
    ("take_along_dim_flat", lambda M, x, i: M.take_along_dim(x, i), (X,), {"i": SIDX * 5}),
    ("take", lambda M, x, i: M.take(x, i) * x.take(i[0]), (X,), {"i": np.array([[-1, 0, 7], [23, 5, 5]])}),
    # sizes and dtypes
    ("sizes", lambda M, x: x * (x.numel() + M.numel(x) * 10 + x.nelement() * 100 + x.ndimension() * 1000
                                + x.element_size() * 1e4 + int(x.is_floating_point()) * 1e5
                                + int(M.is_floating_point(x.long())) * 2e5 + int(x.is_complex()) * 4e5), (X,), {}),
    ("element_sizes", lambda M, x: x * (x.double().element_size() + x.half().element_size() * 10
                                        + x.bool().element_size() * 100 + x.short().element_size() * 1000), (X,), {}),
    ("short_byte_char", lambda M, x: M.stack([(x * 10).short().long(), (x.abs() * 20).byte().long(),
                                              (x * 30).char().long()]), (), {"x": X}),
    ("bfloat16", lambda M, x: x.bfloat16().float() * x, (X,), {}),
    ("to_dtype", lambda M, x: x.to(_dtype(M, "float64")) * x.double().to(x).double() + x.to("cpu").to(device="cpu")
     .to("cpu", _dtype(M, "float64")), (X,), {}),
    ("to_other_int", lambda M, x, i: x.to(i) + i.to(x.dtype).to(dtype=i.dtype), (), {"x": X[0, :2] * 9, "i": I8}),
    ("type_dtype", lambda M, x: x.type(_dtype(M, "int32")).type(x.dtype) + x.type("torch.DoubleTensor").float(),
     (X * 9,), {}),
    # writing
    ("scatter_add", lambda M, x, s, i: M.scatter_add(x, 2, i, s) + x.scatter_add(-1, i[:1, :2], s[:1, :2] * 2),
     (X, SRC[..., :3]), {"i": SIDX}),
    # src larger than the index (torch reads its first entries; torch's backward refuses it)
    ("scatter_add_src_larger", lambda M, x, s, i: M.scatter_add(x, 2, i, s) + x.scatter_add(-1, i[:1, :2], s[:1] * 2),
     (X,), {"s": SRC, "i": SIDX}),
    *[(f"scatter_reduce_{r}_{'self' if inc else 'noself'}",
       lambda M, x, s, i, r=r, inc=inc: M.scatter_reduce(x, 2, i, s, r, include_self=inc), (X, SRC[..., :3]),
       {"i": SIDX})
      for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)],
    *[(f"scatter_reduce_{r}_ties_{inc}", lambda M, x, s, i, r=r, inc=inc: x.scatter_reduce(2, i, s, r,
                                                                                         include_self=inc),
       (TIES, TIES_SRC), {"i": TIES_IDX}) for r in ("amax", "amin") for inc in (True,)],
    *[(f"scatter_reduce_int_{r}_{inc}", lambda M, x, s, i, r=r, inc=inc: x.scatter_reduce(1, i, s, r,
                                                                                        include_self=inc),
       (), {"x": I8 * 3 - 2, "s": I8[:, ::-1] * 5 - 1, "i": np.array([[0, 0, 3, 3], [1, 0, 1, 1]])})
      for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)],
    ("index_fill", lambda M, x, i: x.index_fill(1, i, -2.0) + M.index_fill(x, -1, i[:2], 0.5), (X,), {"i": ROWS}),
    ("index_fill_tensor_value", lambda M, x, v, i: M.index_fill(x, 2, i, v) * x.index_fill(0, i[2], v * 2),
     (X, np.float32(1.5)), {"i": ROWS % 3}),  # torch's backward fails on a negative index
    ("index_put", lambda M, x, v, r, k: M.index_put(x, (r[:2], k), v) + x.index_put((r[:2],), v[0, :1]),
     (X, Y[0, :2]), {"r": ROWS, "k": COLS}),
    ("index_put_accumulate", lambda M, x, v, r: x.index_put((r, r + 1, r[:1]), v, accumulate=True)
     + M.index_put(x, (r,), v[0], accumulate=True), (X, Y[0, 0, :3]), {"r": np.array([1, 1, 0])}),
    ("index_put_mask", lambda M, x, v, m: x.index_put((m,), v) + M.index_put(x, (m[:, 0],), v[:2], accumulate=True),
     (X, Y[0, 0, :1]), {"m": np.array([[True, False, True], [False, False, True]])}),
    ("select_scatter", lambda M, x, s: M.select_scatter(x, s, 1, -1) + x.select_scatter(s[:, :3] * 2, 2, 0),
     (X, Y[:, 0]), {}),
    ("slice_scatter", lambda M, x, s: M.slice_scatter(x, s, 2, 1, None, 2) + x.slice_scatter(x[:, 1:] * 2, 1, -5, 2)
     + M.slice_scatter(x, s, -1, -2) + x.slice_scatter(s[:, :, :1] * 0.5, 2, 1, 10, 3), (X, Y[:, :, :2]), {}),
    ("diagonal_scatter", lambda M, x, s, t, u: M.diagonal_scatter(x, s) + x.diagonal_scatter(t, 1, 1, 2)
     + M.diagonal_scatter(x, u, -1, 2, 0), (X, Y[0, :2, :].T, Y[:, 0, :3], Y[1, :, :2]), {}),
    ("masked_scatter", lambda M, x, s, m: M.masked_scatter(x, m, s) * x.masked_scatter(m[0], s[1]), (X, Y),
     {"m": MASK}),
    ("masked_select", lambda M, x, m: M.masked_select(x, m) * x.masked_select(m[0]).sum() + M.masked_select(x[0], x[0]
                                                                                                        > 0.3).sum(),
     (X,), {"m": MASK}),
    ("nonzero_argwhere", lambda M, x: M.cat([M.nonzero(x > 0), x.nonzero(), M.argwhere(x < 0), x.argwhere()]), (),
     {"x": X * (np.abs(X) > 0.5)}),
    ("nonzero_tuple", lambda M, x: M.stack([*M.nonzero(x, as_tuple=True), *x.nonzero(as_tuple=True)]), (),
     {"x": I8}),
    ("nonzero_float64_nan_and_minus_zero", lambda M, x: M.nonzero(x), (),
     {"x": np.array([[0.0, np.nan], [-0.0, 2.0]])}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name,fn,params,inputs", CASES, ids=IDS)
def test_output_and_gradients_match_torch(name, fn, params, inputs):
    assert_matches_torch(fn, params, inputs, R)


@pytest.mark.parametrize("fn", [
    lambda M, x: M.masked_scatter(x, x[0] > 0, x[:, ::-1] * 3),
    lambda M, x: M.diagonal_scatter(x, x[:, 0, :2] ** 2, 1, 2, 1),
    lambda M, x: M.scatter_reduce(x, 1, SIDX[:, :, :3] % 3, x[:, :, 1:] * x[:, :, :3], "mean", include_self=False),
    lambda M, x: M.scatter_reduce(x * x, 2, SIDX, x[:, :, :3] * 2, "prod"),
    lambda M, x: M.index_put(x, (np.array([1, 1, 0]),), x[0] * x[1], accumulate=True),
    lambda M, x: M.index_fill(x, 1, ROWS, x[0, 0, 0] * 3),
    lambda M, x: M.masked_select(x, x > 0) * M.take_along_dim(x, SIDX[:, :, :2], 2).sum(),
], ids=["masked_scatter", "diagonal_scatter", "scatter_mean_noself", "scatter_prod", "index_put_acc", "index_fill",
        "masked_select_take_along"])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, X.astype(np.float64))


def test_symbolic_batch_dims():
    """The lowerings that read a size at run time (the mask's count, an index_fill position, the
    broadcast shape) on a symbolic batch dim: one graph, two batch sizes, against numpy."""
    def fn(x, m, i):
        a, b = gc.broadcast_tensors(x, m[0].astype("float32"))
        return {"select": gc.masked_select(x, m), "nonzero": gc.nonzero(m), "fill": x.index_fill(0, i, 7.0),
                "broadcast": a + b, "squeeze": x[:, :1].squeeze(1), "take": gc.take_along_dim(x, i[None], 0),
                "put": gc.index_put(x, (i,), x[0], accumulate=True), "ravel": x.ravel(), "swap": x.swapaxes(0, 1),
                "squeeze_all": gc.squeeze(x[:, None, :1])}
    model = gc.capture(fn, x=gc.spec("float32", ("N", 3)), m=gc.spec("bool", ("N", 3)), i=gc.spec("int64", [1]))
    onnx.checker.check_model(model.proto, full_check=True)
    shapes = {o.name: tuple(o.shape) for o in model.outputs}
    assert shapes["fill"] == shapes["broadcast"] == ("N", 3) and shapes["squeeze"] == shapes["squeeze_all"] == ("N",)
    rng = np.random.default_rng(0)
    for n in (2, 5):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        m = x > 0
        out = run_both(model, {"x": x, "m": m, "i": np.array([-1])})
        filled, put = x.copy(), x.copy()
        filled[-1] = 7
        put[-1] += x[0]
        want = {"select": x[m], "nonzero": np.argwhere(m), "fill": filled, "broadcast": x + m[0], "squeeze": x[:, 0],
                "take": x[-1:], "put": put, "ravel": x.ravel(), "swap": x.T, "squeeze_all": x[:, 0]}
        for k, v in want.items():
            np.testing.assert_allclose(out[k], v, rtol=1e-6, err_msg=f"{k} at N={n}")


def test_scatter_extremes_without_self_share_ties_among_the_sources():
    """amax/amin with include_self=False: tied sources share the gradient of their place evenly and
    the input gets none there, so the shares add up to it (torch 2.13 also counts the left-out
    input in the share, so its gradients there add up to less than the output's)."""
    x = np.array([[3.0, 3.0, 3.0, 3.0]], np.float32)
    src = np.array([[3.0, 1.0, 3.0]], np.float32)
    index = np.array([[0, 1, 0]])
    c = np.array([[2.0, 5.0, 7.0, 11.0]], np.float32)
    for reduce in ("amax", "amin"):
        grads = gc_grads(lambda M, x, s: M.scatter_reduce(x, 1, index, s, reduce, include_self=False),
                         {"x": x, "s": src}, {}, c)
        np.testing.assert_allclose(grads["out"], [[3.0, 1.0, 3.0, 3.0]])
        np.testing.assert_allclose(grads["x"], [[0.0, 0.0, 7.0, 11.0]])
        np.testing.assert_allclose(grads["s"], [[1.0, 5.0, 1.0]])


def test_type_without_dtype_names_the_tensor_type():
    seen = {}
    gc.capture(lambda x, i: seen.update(x=x.type(), i=i.type(), b=(x > 0).type()) or x, x=X, i=I8)
    assert seen == {"x": "torch.FloatTensor", "i": "torch.LongTensor", "b": "torch.BoolTensor"}


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.unbind(x, 0), "needs a static size on dim 0"),
    (lambda x: x.tensor_split(0, 1), "tensor_split needs sections >= 1, got 0"),
    (lambda x: x.tensor_split(1.5, 1), "tensor_split takes an int or a list of ints"),
    (lambda x: gc.hsplit(x, 2), "hsplit: 2 sections do not divide dim 1 of size 3"),
    (lambda x: gc.dsplit(x[0], 2), "dsplit needs a Tensor of rank >= 3, got rank 2"),
    (lambda x: x.split_with_sizes(2, 1), "split_with_sizes takes a list of sizes"),
    (lambda x: x.split_with_sizes([1, 1], 1), r"sections \[1, 1\] do not add up to dim 1's size 3"),
    (lambda x: x.squeeze(3), "dim 3 out of range for rank 3"),
    (lambda x: gc.unsqueeze(x, 4), r"unsqueeze dim 4 out of range \[-4, 3\]"),
    (lambda x: x.swapaxes(0, 3), "dim 3 out of range for rank 3"),
    (lambda x: x.rot90(1, (1, 1)), r"rot90 dims must differ, got \[1, 1\]"),
    (lambda x: x.rot90(1, (0, 1, 2)), r"rot90 takes 2 dims of a Tensor of rank >= 2, got dims \[0, 1, 2\]"),
    (lambda x: x[0, 0].fliplr(), "fliplr needs a Tensor of rank >= 2, got rank 1"),
    (lambda x: gc.broadcast_tensors(x, x[:, :2, :1]), "broadcast_tensors: float32.* do not broadcast"),
    (lambda x: x.take(x), "indices must be int64 or int32, got float32"),
    (lambda x: x.take_along_dim(gc.zeros(3, 4, dtype="int64"), 1), "the indices have rank 2, the input 3"),
    (lambda x: x.scatter_add(1, x.long(), x.double()), "dtype mismatch float32 vs float64"),
    (lambda x: x.scatter_add(1, x, x), "scatter_reduce: index must be int64 or int32, got float32"),
    (lambda x: x.scatter_reduce(1, x.long(), x, "max"), r"scatter_reduce reduce='max'; expected one of \['amax'"),
    (lambda x: x.scatter_add(1, x[0].long(), x), "input, index and src need one rank, got 3, 2 and 3"),
    (lambda x: x.index_fill(1, x.long(), 0.0), "index_fill takes a 1-D int64 or int32 index, got int64"),
    (lambda x: x.index_fill(1, gc.arange(2), x[0]), "index_fill takes a number or a 0-D Tensor as value"),
    (lambda x: x.index_put(x.long(), x), "index_put takes a tuple of index Tensors"),
    (lambda x: x.index_put((x,), x), "index_put indices must be int64, int32 or bool, got float32"),
    (lambda x: x.select_scatter(x[:, 0], 1, 3), "select_scatter index 3 out of range for dim 1 of size 3"),
    (lambda x: x.slice_scatter(x, 1, step=0), "slice_scatter step must be >= 1, got 0"),
    (lambda x: x.diagonal_scatter(x[0], 0, 1, -2), "diagonal_scatter dim1 and dim2 must differ, got 1 and -2"),
    (lambda x: x.masked_scatter(x, x), "masked_scatter's mask must be bool, got float32"),
    (lambda x: gc.masked_select(x, x.long()), "masked_select's mask must be bool, got int64"),
    (lambda x: gc.nonzero(x[0, 0, 0]), "nonzero of a 0-D Tensor is not supported"),
    (lambda x: x.numel(), r"numel\(\) needs static dims"),
    (lambda x: x.to("tpu"), r"to\(\) takes a dtype, a device \(cpu, cuda\[:N\], mps, xpu, hip, meta\) or a Tensor, "
                            "got 'tpu'"),
    (lambda x: x.to("float64", dtype="int32"), r"to\(\) got more than one dtype"),
    (lambda x: x.type("cuda"), "type.. takes a dtype, got the device 'cuda'"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3, 4)))
    assert "test_dsl_arrays.py" in str(err.value)
