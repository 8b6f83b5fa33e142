"""Matrix products, diagonals, determinants and cumulative products (graphc/dsl/ops_linalg.py)
against torch: values on the numpy and ort-cpu backends (models through the full ONNX checker, dim 0
symbolic too), ``gc.grad`` gradients against torch.autograd (zeros in a cumprod, -inf in a
logcumsumexp), float64 central differences for the new lowerings, integer dtypes, and the errors
for what torch refuses."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

R = np.random.default_rng(11)


def _r(*shape):
    return R.standard_normal(shape)


A, B, C = _r(3, 4), _r(4, 5), _r(5, 2)
U3, U4, V4 = _r(3), _r(4), _r(4)
BA, BB = _r(2, 3, 4), _r(2, 4, 5)
SQ = _r(2, 3, 3)
SPD = SQ @ SQ.swapaxes(-1, -2) + np.eye(3)  # positive determinants
ZEROS = np.array([[2.0, 0.0, 3.0, 0.5, 5.0], [0.0, 1.5, 0.0, 4.0, -2.0], [1.0, -3.0, 2.0, 0.0, 0.0]])
EXTREME = np.array([[-np.inf, -np.inf, 1.0, -1000.0, 2.0], [1e4, -1e4, 1e4 + 1, 0.0, -np.inf],
                    [-800.0, -805.0, -790.0, -np.inf, -801.0]])

# (id, fn(M, *xs) with M torch or gc.nn.functional, inputs): values, then gradients of sum(out * c)
CASES = [
    ("mm", lambda M, a, b: M.mm(a, b), [A, B]),
    ("mm_method", lambda M, a, b: a.mm(b), [A, B]),
    ("bmm", lambda M, a, b: M.bmm(a, b), [BA, BB]),
    ("bmm_method", lambda M, a, b: a.bmm(b), [BA, BB]),
    ("mv", lambda M, a, v: M.mv(a, v), [A, V4]),
    ("mv_method", lambda M, a, v: a.mv(v), [A, V4]),
    ("dot", lambda M, u, v: M.dot(u, v), [U4, V4]),
    ("vdot_method", lambda M, u, v: u.vdot(v), [U4, V4]),
    ("inner_1d", lambda M, u, v: M.inner(u, v), [U4, V4]),
    ("inner_nd", lambda M, a, b: M.inner(a, b), [BA, _r(5, 2, 4)]),
    ("inner_0d", lambda M, a, s: a.inner(s), [A, np.asarray(1.5)]),
    ("kron", lambda M, a, b: M.kron(a, b), [_r(2, 3), U4]),
    ("kron_3d", lambda M, a, b: a.kron(b), [_r(2, 1, 3), _r(2, 2)]),
    ("cross_dim", lambda M, a, b: M.cross(a, b, dim=1), [_r(2, 3, 4), _r(1, 3, 4)]),
    ("cross_broadcast", lambda M, a, b: a.cross(b, dim=-1), [_r(2, 4, 3), _r(1, 4, 3)]),
    ("cross_default_dim", lambda M, a, b: M.cross(a, b), [_r(4, 3, 3), _r(4, 3, 3)]),
    ("cross_default_dim_of_input", lambda M, a, b: M.cross(a, b), [_r(1, 3), _r(3, 3)]),
    ("diag_vector", lambda M, v: M.diag(v, 1), [U4]),
    ("diag_vector_below", lambda M, v: v.diag(-2), [U3]),
    ("diag_matrix", lambda M, a: M.diag(a, 1), [A]),
    ("diag_matrix_below", lambda M, a: a.diag(diagonal=-1), [A]),
    ("diagonal", lambda M, x: M.diagonal(x, 1, 0, 2), [BA]),
    ("diagonal_negative_dims", lambda M, x: x.diagonal(offset=-1, dim1=-1, dim2=1), [BA]),
    ("diagonal_default", lambda M, x: M.diagonal(x), [BA]),
    ("diag_embed", lambda M, x: M.diag_embed(x), [A]),
    ("diag_embed_offset_dims", lambda M, x: M.diag_embed(x, 1, 0, 2), [A]),
    ("diag_embed_below", lambda M, x: x.diag_embed(-2, dim1=2, dim2=0), [BA]),
    ("diagflat", lambda M, x: M.diagflat(x, -1), [_r(2, 2)]),
    ("trace", lambda M, x: M.trace(x), [A]),
    ("trace_method", lambda M, x: x.trace(), [_r(4, 4)]),
    ("addmv", lambda M, x, a, v: M.addmv(x, a, v, beta=0.5, alpha=2.0), [U3, A, V4]),
    ("addmv_method", lambda M, x, a, v: x.addmv(a, v), [U3, A, V4]),
    ("addr", lambda M, x, u, v: M.addr(x, u, v, beta=2.0, alpha=-1.0), [A, U3, V4]),
    ("addr_broadcast", lambda M, x, u, v: x.addr(u, v), [V4, U3, V4]),
    ("addbmm", lambda M, x, a, b: M.addbmm(x, a, b, beta=0.25, alpha=3.0), [_r(3, 5), BA, BB]),
    ("chain_matmul", lambda M, a, b, c: M.chain_matmul(a, b, c), [A, B, C]),
    ("chain_matmul_one", lambda M, a: M.chain_matmul(a), [A]),
    ("det", lambda M, x: M.det(x), [SQ]),
    ("det_method_1x1", lambda M, x: x.det(), [_r(4, 1, 1)]),
    ("logdet", lambda M, x: M.logdet(x), [SPD]),
    ("slogdet", lambda M, x: M.slogdet(x).logabsdet, [SQ]),
    ("slogdet_method", lambda M, x: x.slogdet()[1], [SQ]),
    ("cumprod", lambda M, x: M.cumprod(x, 1), [BA]),
    ("cumprod_zeros", lambda M, x: M.cumprod(x, -1), [ZEROS]),
    ("cumprod_zeros_dim0", lambda M, x: x.cumprod(dim=0), [ZEROS]),
    ("logcumsumexp", lambda M, x: M.logcumsumexp(x, 1), [BA]),
    ("logcumsumexp_extreme", lambda M, x: x.logcumsumexp(-1), [EXTREME]),
    ("logcumsumexp_extreme_dim0", lambda M, x: M.logcumsumexp(x, 0), [EXTREME]),
]


def _torch_out(torch, fn, xs, grad: bool):
    ts = [torch.tensor(x, requires_grad=grad) for x in xs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cross without dim, torch.chain_matmul: deprecated
        return ts, fn(torch, *ts)


@pytest.mark.parametrize("name,fn,xs", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, fn, xs):
    """float32 values on both backends; float64 gradients."""
    torch = pytest.importorskip("torch")
    ts, want = _torch_out(torch, fn, xs, grad=True)
    c = np.asarray(R.standard_normal(tuple(want.shape)))
    (want * torch.from_numpy(c)).sum().backward()
    names = [f"x{i}" for i in range(len(xs))]
    model = gc.capture(lambda **kw: fn(F, *kw.values()), **{k: x.astype(np.float32) for k, x in zip(names, xs)})
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {k: x.astype(np.float32) for k, x in zip(names, xs)})["output"]
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for backend in ("numpy", "ort-cpu"):
        grads = gc_grads(fn, {k: x.astype(np.float64) for k, x in zip(names, xs)}, {}, c, backend=backend)
        np.testing.assert_allclose(grads["out"], want.detach().numpy(), 1e-9, 1e-12, err_msg=backend)
        for k, t in zip(names, ts):
            np.testing.assert_allclose(grads[k], t.grad.numpy(), 1e-9, 1e-12, err_msg=f"{backend} {k}")


# one-input functions whose lowering is new: float64 central differences (no torch needed)
FINITE = {
    "det": (lambda M, x: M.det(x), SQ),
    "slogdet": (lambda M, x: M.slogdet(x).logabsdet, SQ),
    "logdet": (lambda M, x: M.logdet(x), SPD),
    "cumprod": (lambda M, x: M.cumprod(x, 1), BA),
    "cumprod_zeros": (lambda M, x: M.cumprod(x, -1), ZEROS),
    "logcumsumexp": (lambda M, x: M.logcumsumexp(x, -1), BA * 30),
    "cross": (lambda M, x: M.cross(x, x * x, dim=0), _r(3, 4)),
    "diag_embed": (lambda M, x: M.diag_embed(x, -1, 0, 2), A),
    "diagonal": (lambda M, x: M.diagonal(x, 1, 2, 0), BA),
    "kron": (lambda M, x: M.kron(x, x), _r(2, 3)),
}


@pytest.mark.parametrize("name", FINITE)
def test_gradients_match_float64_central_differences(name):
    fn, x = FINITE[name]
    assert_grads_match_central_differences(fn, x, backends=("numpy", "ort-cpu"))


def test_symbolic_dims_match_torch():
    """dim 0 symbolic: the running products and log-sum-exps along it build their mask at run time."""
    torch = pytest.importorskip("torch")
    x = EXTREME[:, :4].T.copy()
    cases = {"cumprod": lambda M, x: M.cumprod(x, 0), "logcumsumexp": lambda M, x: M.logcumsumexp(x, 0),
             "cumprod_last": lambda M, x: x.cumprod(-1), "diagonal": lambda M, x: M.diagonal(x, 0, 1, 2),
             "bmm": lambda M, x: M.bmm(x, x)}
    for name, fn in cases.items():
        data = ZEROS.T.copy() if name.startswith("cumprod") else SQ if name in ("bmm", "diagonal") else x
        model = gc.capture(lambda x: fn(F, x), x=gc.spec("float64", ("N", *data.shape[1:])))
        onnx.checker.check_model(model.proto, full_check=True)
        got = run_both(model, {"x": data})["output"]
        np.testing.assert_allclose(got, fn(torch, torch.from_numpy(data)).numpy(), rtol=1e-12, err_msg=name)


def test_integer_and_bool_inputs_match_torch():
    """torch's dtypes: int products stay int, trace and cumprod accumulate in int64."""
    torch = pytest.importorskip("torch")
    i = R.integers(-3, 4, (3, 3)).astype(np.int32)
    cases = {"trace": lambda M, x: M.trace(x), "cumprod": lambda M, x: M.cumprod(x, 1),
             "cumprod_bool": lambda M, x: (x > 0).cumprod(0), "dot": lambda M, x: M.dot(x[0], x[1]),
             "mm": lambda M, x: x.mm(x), "kron": lambda M, x: M.kron(x, x[:2]), "diag": lambda M, x: M.diag(x[0], 1),
             "diagonal": lambda M, x: x.diagonal(-1), "cross": lambda M, x: M.cross(x, x.flip(0) if M is torch
                                                                                  else F.flip(x, [0]), dim=1)}
    for name, fn in cases.items():
        want = fn(torch, torch.from_numpy(i))
        model = gc.capture(lambda x: fn(F, x), x=i)
        onnx.checker.check_model(model.proto, full_check=True)
        got = run_both(model, {"x": i})["output"]
        assert str(got.dtype) == str(want.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(got, want.numpy(), err_msg=name)


def test_determinant_signs_and_singular_matrices_match_torch():
    """logdet of a negative determinant is nan and of a singular matrix -inf; slogdet gives (0, -inf)
    there and the sign elsewhere, as torch's."""
    torch = pytest.importorskip("torch")
    x = np.stack([[[0.0, 1.0], [1.0, 0.0]], np.zeros((2, 2)), [[2.0, 1.0], [1.0, 3.0]],
                  [[1.0, 2.0], [2.0, 4.0]]])
    model = gc.capture(lambda x: {"logdet": gc.logdet(x), "sign": gc.slogdet(x).sign,
                                  "logabsdet": x.slogdet().logabsdet}, x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    with np.errstate(all="ignore"):
        got = run_both(model, {"x": x})
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(got["logdet"][[0, 1, 3]], [np.nan, -np.inf, -np.inf])
    np.testing.assert_allclose(got["logdet"], torch.logdet(t).numpy(), rtol=1e-6)
    sign, logabsdet = torch.slogdet(t)
    np.testing.assert_array_equal(got["sign"], sign.numpy())
    np.testing.assert_allclose(got["logabsdet"], logabsdet.numpy(), rtol=1e-6)


ERRORS = [
    (lambda x: gc.mm(x, x), BA, r"mm takes two 2-D Tensors, got ranks 3 and 3"),
    (lambda x: x.mm(x[0]), A, r"mm takes two 2-D Tensors, got ranks 2 and 1"),
    (lambda x: x.bmm(x[0]), BA, r"bmm takes two 3-D Tensors, got ranks 3 and 2"),
    (lambda x: gc.bmm(x[:1], x.transpose(1, 2)), BA, r"bmm batch sizes differ \(1 vs 2\)"),
    (lambda x: gc.baddbmm(x, x[:1], x.transpose(1, 2)), BA, r"baddbmm batch sizes differ \(1 vs 2\)"),
    (lambda x: gc.mv(x, x), A, r"mv takes a 2-D and a 1-D Tensor, got ranks 2 and 2"),
    (lambda x: gc.dot(x, x[:3]), U4, r"inner dimensions differ \(4 vs 3\)"),
    (lambda x: gc.dot(x, x.astype("float32")), U4, r"dtype mismatch float64 vs float32"),
    (lambda x: gc.det(x.astype("int64")), SQ, r"det takes a floating-point Tensor, got int64"),
    (lambda x: gc.det(x), A, r"det: the matrices are not square: their two dims differ \(3 vs 4\)"),
    (lambda x: gc.diagonal(x, 0, 1, -2), BA, r"diagonal: dim1 and dim2 are the same dim \(1, -2\)"),
    (lambda x: gc.diagonal(x, 0, 0, 3), BA, r"dim 3 out of range for rank 3"),
    (lambda x: gc.diag_embed(x, 0, 0, 3), A, r"dim 3 out of range for the output's rank 3"),
    (lambda x: gc.diag(x), BA, r"diag takes a 1-D or 2-D Tensor, got rank 3"),
    (lambda x: gc.trace(x), BA, r"trace takes a 2-D Tensor, got rank 3"),
    (lambda x: gc.cross(x[:2], x[:2]), A, r"cross: no dim of size 3 in input"),
    (lambda x: gc.cross(x, x, dim=-1), A, r"cross: dim 1 must have size 3 in both operands, got 4 and 4"),
    (lambda x: gc.cross(x, x[0], dim=0), A, r"cross takes two Tensors of one rank, got ranks 2 and 1"),
    (lambda x: gc.logcumsumexp(x.astype("int64"), 0), A, r"logcumsumexp takes a floating-point Tensor, got int64"),
    (lambda x: gc.cumprod(x, 2), A, r"dim 2 out of range for rank 2"),
    (lambda x: gc.chain_matmul(x[0]), A, r"chain_matmul takes 2-D Tensors, got rank 1"),
]


@pytest.mark.parametrize("fn,x,match", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_bad_arguments_name_the_problem_and_the_line(fn, x, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=x)
    assert "test_dsl_linalg.py:" in str(info.value)
