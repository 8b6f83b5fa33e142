"""Solvers and factorizations (graphc/dsl/ops_solve.py) and the ``gc.linalg`` namespace
(graphc/dsl/linalg.py) against torch: float32 and float64 values on the numpy and ort-cpu backends
(models through the full ONNX checker, a symbolic batch dim too), ``gc.grad`` gradients against
torch.autograd, float64 central differences of the unrolled lowerings, singular inputs, and the
errors for what graphc or torch refuse."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

R = np.random.default_rng(7)


def _r(*shape):
    return R.standard_normal(shape)


SQ = _r(2, 4, 4) + 2 * np.eye(4)  # well-conditioned, yet pivoting swaps rows
SQ1 = _r(3, 3)
RHS, RHS1 = _r(2, 4, 3), _r(3, 2)
TALL, WIDE = _r(2, 5, 3), _r(3, 5)
TRI = _r(2, 4, 4) + 4 * np.eye(4)  # well-conditioned triangles
SMALL = _r(2, 4, 4) / 2


def _spd(G, x):
    """A symmetric positive-definite matrix from any square ``x``, in torch or graphc."""
    eye = 2 * np.eye(x.shape[-1])
    return x @ x.mT + (G.from_numpy(eye).to(x.dtype) if G is not gc else eye)


def _projector(w, v):
    """``V diag(w) V^T``, which the eigenvectors' signs leave alone."""
    return v @ (w.unsqueeze(-1) * v.mT)


def _rotation_part(u, s, vh):
    """``U @ Vh``, which the singular vectors' signs leave alone."""
    return u @ vh


def _product(u, s, vh):
    return (u * s.unsqueeze(-2)) @ vh


def _lu_solve(G, lu, b, **kw):
    packed, pivots = G.linalg.lu_factor(lu)
    return G.linalg.lu_solve(packed, pivots, b, **kw)


# (id, fn(G, *xs) with G torch or gc, inputs, differentiable)
CASES = [
    ("inv", lambda G, a: G.linalg.inv(a), [SQ], True),
    ("inverse", lambda G, a: G.inverse(a), [SQ1], True),
    ("inverse_method", lambda G, a: a.inverse(), [SQ], True),
    ("inv_1x1", lambda G, a: G.linalg.inv(a), [_r(3, 1, 1) + 2], True),
    ("solve", lambda G, a, b: G.linalg.solve(a, b), [SQ, RHS], True),
    ("solve_broadcast", lambda G, a, b: G.linalg.solve(a, b), [SQ, _r(4, 2)], True),
    ("solve_vector", lambda G, a, b: G.linalg.solve(a, b), [SQ, _r(2, 4)], True),
    ("solve_vector_1d", lambda G, a, b: G.linalg.solve(a, b), [SQ1, _r(3)], True),
    ("solve_right", lambda G, a, b: G.linalg.solve(a, b, left=False), [SQ, _r(2, 3, 4)], True),
    ("lu_factor", lambda G, a: G.linalg.lu_factor(a).LU, [SQ], True),
    ("lu_factor_pivots", lambda G, a: G.linalg.lu_factor(a).pivots, [SQ], False),
    ("lu_P", lambda G, a: G.linalg.lu(a).P, [SQ], False),
    ("lu_L", lambda G, a: G.linalg.lu(a).L, [SQ], True),
    ("lu_U", lambda G, a: G.linalg.lu(a)[2], [SQ1], True),
    ("lu_unpack_P", lambda G, a: G.lu_unpack(*G.linalg.lu_factor(a))[0], [SQ], False),
    ("lu_unpack_L", lambda G, a: G.lu_unpack(*G.linalg.lu_factor(a)).L, [SQ], True),
    ("lu_solve", lambda G, a, b: _lu_solve(G, a, b), [SQ, RHS], True),
    ("lu_solve_method", lambda G, a, b: b.lu_solve(*G.linalg.lu_factor(a)), [SQ, RHS], True),
    ("lu_solve_adjoint", lambda G, a, b: _lu_solve(G, a, b, adjoint=True), [SQ, RHS], True),
    ("lu_solve_right", lambda G, a, b: _lu_solve(G, a, b.mT, left=False), [SQ, RHS], True),
    ("lu_solve_right_adjoint", lambda G, a, b: _lu_solve(G, a, b.mT, left=False, adjoint=True), [SQ, RHS], True),
    ("solve_triangular_upper", lambda G, a, b: G.linalg.solve_triangular(a, b, upper=True), [TRI, RHS], True),
    ("solve_triangular_lower_unit", lambda G, a, b: G.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
     [TRI, RHS], True),
    ("solve_triangular_right", lambda G, a, b: G.linalg.solve_triangular(a, b.mT, upper=False, left=False),
     [TRI, RHS], True),
    ("solve_triangular_right_unit", lambda G, a, b: G.linalg.solve_triangular(a, b.mT, upper=True, left=False,
                                                                              unitriangular=True), [TRI, RHS], True),
    ("triangular_solve", lambda G, b, a: G.triangular_solve(b, a).solution, [RHS, TRI], True),
    ("triangular_solve_transpose", lambda G, b, a: G.triangular_solve(b, a, False, True)[0], [RHS, TRI], True),
    ("cholesky", lambda G, x: G.linalg.cholesky(_spd(G, x)), [SQ], True),
    ("cholesky_upper", lambda G, x: G.linalg.cholesky(_spd(G, x), upper=True), [SQ], True),
    ("cholesky_old", lambda G, x: G.cholesky(_spd(G, x)), [SQ1], True),
    ("cholesky_method", lambda G, x: _spd(G, x).cholesky(upper=True), [SQ1], True),
    ("cholesky_solve", lambda G, x, b: G.cholesky_solve(b, G.linalg.cholesky(_spd(G, x))), [SQ, RHS], True),
    ("cholesky_solve_upper", lambda G, x, b: b.cholesky_solve(G.linalg.cholesky(_spd(G, x)).mT, upper=True),
     [SQ, RHS], True),
    ("cholesky_inverse", lambda G, x: G.cholesky_inverse(G.linalg.cholesky(_spd(G, x))), [SQ1], True),
    ("cholesky_inverse_upper", lambda G, x: G.cholesky_inverse(G.linalg.cholesky(_spd(G, x)).mT, upper=True), [SQ],
     True),
    ("qr_Q", lambda G, a: G.linalg.qr(a).Q, [SQ], True),
    ("qr_R", lambda G, a: G.linalg.qr(a)[1], [SQ], True),
    ("qr_tall_Q", lambda G, a: G.linalg.qr(a).Q, [TALL], True),
    ("qr_tall_R", lambda G, a: G.linalg.qr(a).R, [TALL], True),
    ("qr_tall_complete_R", lambda G, a: G.linalg.qr(a, mode="complete").R, [TALL], False),
    ("qr_tall_complete_Q", lambda G, a: G.linalg.qr(a, mode="complete").Q, [TALL], False),
    ("qr_wide_Q", lambda G, a: G.linalg.qr(a).Q, [WIDE], False),
    ("qr_wide_R", lambda G, a: G.linalg.qr(a, mode="r").R, [WIDE], False),
    ("qr_r_Q_empty", lambda G, a: G.linalg.qr(a, mode="r").Q, [TALL], False),
    ("lstsq", lambda G, a, b: G.linalg.lstsq(a, b).solution, [TALL, _r(2, 5, 2)], True),
    ("matrix_power_5", lambda G, a: G.linalg.matrix_power(a, 5), [SMALL], True),
    ("matrix_power_0", lambda G, a: G.linalg.matrix_power(a, 0), [SMALL], False),
    ("matrix_power_neg", lambda G, a: a.matrix_power(-3), [SQ], True),
    ("matrix_exp", lambda G, a: G.linalg.matrix_exp(a), [SQ], True),
    ("matrix_exp_small", lambda G, a: G.matrix_exp(a), [SMALL / 100], True),
    ("matrix_exp_method", lambda G, a: a.matrix_exp(), [SQ1 * 3], True),
    ("det", lambda G, a: G.linalg.det(a), [SQ], False),
    ("slogdet", lambda G, a: G.linalg.slogdet(a).logabsdet, [SQ], False),
    ("vector_norm", lambda G, x: G.linalg.vector_norm(x), [SQ], True),
    ("vector_norm_ord", lambda G, x: G.linalg.vector_norm(x, 3, dim=(0, 2), keepdim=True), [SQ], True),
    ("vector_norm_inf", lambda G, x: G.linalg.vector_norm(x, float("inf"), dim=-1), [SQ], True),
    ("matrix_norm_fro", lambda G, x: G.linalg.matrix_norm(x), [TALL], True),
    ("matrix_norm_1", lambda G, x: G.linalg.matrix_norm(x, 1), [TALL], True),
    ("matrix_norm_neg1", lambda G, x: G.linalg.matrix_norm(x, -1, dim=(0, 2), keepdim=True), [TALL], True),
    ("matrix_norm_inf", lambda G, x: G.linalg.matrix_norm(x, float("inf")), [TALL], True),
    ("matrix_norm_neginf", lambda G, x: G.linalg.matrix_norm(x, -float("inf"), dim=(2, 1)), [TALL], True),
    ("norm_default", lambda G, x: G.linalg.norm(x), [TALL], True),
    ("norm_matrix_ord", lambda G, x: G.linalg.norm(x, 1), [WIDE], True),
    ("norm_vector_dim", lambda G, x: G.linalg.norm(x, 0.5, dim=1), [TALL], True),
    ("norm_matrix_dim", lambda G, x: G.linalg.norm(x, "fro", dim=(0, 1)), [TALL], True),
    ("vecdot", lambda G, x, y: G.linalg.vecdot(x, y, dim=1), [TALL, _r(5, 3)], True),
    ("multi_dot", lambda G, a, b, c: G.linalg.multi_dot([a, b, c]), [WIDE, _r(5, 2), _r(2, 4)], True),
    ("multi_dot_vectors", lambda G, a, b, c: G.linalg.multi_dot([a, b, c]), [_r(3), WIDE, _r(5)], True),
    ("cross", lambda G, a, b: G.linalg.cross(a, b), [_r(2, 4, 3), _r(1, 4, 3)], True),
    ("diagonal", lambda G, a: G.linalg.diagonal(a, offset=-1), [TALL], True),
    ("tensorinv", lambda G, a: G.linalg.tensorinv(a, ind=1), [_r(6, 2, 3) + np.eye(6).reshape(6, 2, 3) * 3], True),
    ("tensorsolve", lambda G, a, b: G.linalg.tensorsolve(a, b), [_r(2, 3, 6) + np.eye(6).reshape(2, 3, 6) * 3,
                                                                 _r(2, 3)], True),
    ("tensorsolve_dims", lambda G, a, b: G.linalg.tensorsolve(a, b, dims=(0,)),
     [_r(6, 2, 3) + np.eye(6).reshape(6, 2, 3) * 3, _r(2, 3)], True),
    ("eigvalsh", lambda G, x: G.linalg.eigvalsh(x + x.mT), [SQ], True),
    ("eigvalsh_upper", lambda G, x: G.linalg.eigvalsh(x + x.mT, UPLO="U"), [SQ], True),
    ("eigvalsh_upper_reads_upper", lambda G, x: G.linalg.eigvalsh(x, UPLO="U"), [SQ], False),
    ("eigh_values_reads_lower", lambda G, x: G.linalg.eigh(x).eigenvalues, [_r(5, 5)], False),
    ("eigh_projector", lambda G, x: _projector(*G.linalg.eigh(x + x.mT)), [SQ], True),
    ("svdvals", lambda G, x: G.linalg.svdvals(x), [TALL], True),
    ("svdvals_wide", lambda G, x: G.linalg.svd(x, full_matrices=False).S, [WIDE], True),
    ("svd_square_U_Vh", lambda G, x: _rotation_part(*G.linalg.svd(x)), [SQ], True),
    ("svd_wide_U_S_Vh", lambda G, x: _product(*G.linalg.svd(x, False)), [WIDE], True),
    ("pinv", lambda G, x: G.linalg.pinv(x), [TALL], True),
    ("pinv_rank_deficient", lambda G, x: G.linalg.pinv(x), [TALL @ _r(3, 4)], False),
    ("pinv_hermitian", lambda G, x: G.linalg.pinv(x @ x.mT, hermitian=True), [TALL], False),
    ("matrix_rank", lambda G, x: G.linalg.matrix_rank(x), [TALL @ _r(2, 3, 4)], False),
    ("matrix_rank_tol", lambda G, x: G.linalg.matrix_rank(x, atol=1.0, rtol=0.1), [TALL], False),
    ("matrix_rank_hermitian", lambda G, x: G.linalg.matrix_rank(x @ x.mT, hermitian=True), [TALL], False),
    ("cond", lambda G, x: G.linalg.cond(x), [SQ], True),
    ("cond_neg2", lambda G, x: G.linalg.cond(x, -2), [TALL], True),
    ("cond_1", lambda G, x: G.linalg.cond(x, 1), [SQ], False),  # torch.autograd fails on it (in-place inverse)
    ("matrix_norm_nuc", lambda G, x: G.linalg.matrix_norm(x, "nuc"), [TALL], True),
    ("matrix_norm_2", lambda G, x: G.linalg.matrix_norm(x, 2, dim=(0, 2), keepdim=True), [TALL], True),
    ("matrix_norm_neg2", lambda G, x: G.linalg.norm(x, -2, dim=(-1, -2)), [TALL], True),
]


def _torch(fn, xs, grad: bool):
    import torch

    ts = [torch.tensor(x, requires_grad=grad) for x in xs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cholesky, torch.triangular_solve: deprecated
        return ts, fn(torch, *ts)


def _capture(fn, feeds):
    model = gc.capture(lambda **kw: fn(gc, *kw.values()), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    return model


@pytest.mark.parametrize("name,fn,xs,differentiable", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, fn, xs, differentiable):
    """float32 and float64 values on both backends (the determinants in float32: onnxruntime has no
    double Det); float64 gradients of ``sum(out * c)`` against torch.autograd on both."""
    pytest.importorskip("torch")
    names = [f"x{i}" for i in range(len(xs))]
    ts, want = _torch(fn, xs, differentiable)
    want_np = want.detach().numpy()
    for dtype, rtol, atol in ((np.float32, 2e-4, 2e-4), (np.float64, 1e-9, 1e-11)):
        if dtype == np.float64 and "det" in name:
            continue
        feeds = {k: x.astype(dtype) for k, x in zip(names, xs)}
        got = run_both(_capture(fn, feeds), feeds)["output"]
        assert got.shape == want_np.shape, (got.shape, want_np.shape)
        assert got.dtype == (want_np.dtype if want_np.dtype.kind != "f" else dtype)
        np.testing.assert_allclose(got, want_np, rtol, atol, err_msg=str(dtype))
    if not differentiable:
        return
    import torch

    c = R.standard_normal(want_np.shape)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        grads = gc_grads(lambda M, *a: fn(gc, *a), dict(zip(names, xs)), {}, c, backend=backend)
        for k, t in zip(names, ts):
            np.testing.assert_allclose(grads[k], t.grad.numpy(), 1e-7, 1e-9, err_msg=f"{backend} {k}")


# the unrolled lowerings: float64 central differences (no torch needed)
FINITE = {
    "inv": (lambda G, x: G.linalg.inv(x), SQ),
    "solve": (lambda G, x: G.linalg.solve(x, x[..., :2] * x[..., 1:3]), SQ),
    "lu_factor": (lambda G, x: G.linalg.lu_factor(x).LU, SQ),
    "lu_solve": (lambda G, x: _lu_solve(G, x, x * x, adjoint=True), SQ),
    "solve_triangular": (lambda G, x: G.linalg.solve_triangular(x, x * x, upper=True, left=False), TRI),
    "cholesky": (lambda G, x: G.linalg.cholesky(_spd(G, x)), SQ),
    "cholesky_inverse": (lambda G, x: G.cholesky_inverse(G.linalg.cholesky(_spd(G, x))), SQ),
    "qr": (lambda G, x: G.linalg.qr(x).Q * 2 + G.linalg.qr(x).R, SQ),
    "qr_tall": (lambda G, x: G.linalg.qr(x).R, TALL),
    "lstsq": (lambda G, x: G.linalg.lstsq(x, x[..., :2] * 2).solution, TALL),
    "matrix_power": (lambda G, x: G.linalg.matrix_power(x, -2), SQ),
    "matrix_exp": (lambda G, x: G.linalg.matrix_exp(x), SQ),
    "matrix_norm": (lambda G, x: G.linalg.matrix_norm(x, 1), TALL),
    "eigh": (lambda G, x: _projector(*G.linalg.eigh(x + x.mT)) + G.linalg.eigvalsh(x).unsqueeze(-1), SQ),
    "svd": (lambda G, x: _rotation_part(*G.linalg.svd(x, full_matrices=False)) * 2 + G.linalg.svdvals(x).unsqueeze(-2),
            TALL),
    "pinv": (lambda G, x: G.linalg.pinv(x), TALL),
}


@pytest.mark.parametrize("name", FINITE)
def test_gradients_match_float64_central_differences(name):
    fn, x = FINITE[name]
    assert_grads_match_central_differences(lambda M, x: fn(gc, x), x)


def test_symbolic_batch_matches_torch():
    """dim 0 symbolic: the identities, pivot swaps and permutations take the batch from the run."""
    torch = pytest.importorskip("torch")
    cases = {"inv": lambda G, a: G.linalg.inv(a), "pivots": lambda G, a: G.linalg.lu_factor(a).pivots,
             "lu_P": lambda G, a: G.linalg.lu(a).P, "qr_Q": lambda G, a: G.linalg.qr(a).Q,
             "power_0": lambda G, a: G.linalg.matrix_power(a, 0), "matrix_exp": lambda G, a: G.matrix_exp(a),
             "cholesky_inverse": lambda G, a: G.cholesky_inverse(G.linalg.cholesky(_spd(G, a))),
             "eigvalsh": lambda G, a: G.linalg.eigvalsh(a), "svdvals": lambda G, a: G.linalg.svdvals(a)}
    for name, fn in cases.items():
        model = gc.capture(lambda x, fn=fn: fn(gc, x), x=gc.spec("float64", ("N", 4, 4)))
        onnx.checker.check_model(model.proto, full_check=True)
        assert model.proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N", name
        for batch in (SQ, SQ[:1]):
            got = run_both(model, {"x": batch})["output"]
            np.testing.assert_allclose(got, fn(torch, torch.from_numpy(batch)).numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=name)


@pytest.mark.parametrize("name", ["inv", "matrix_exp", "qr_R", "eigvalsh", "svdvals", "lu_factor_pivots"])
def test_opset_17_models_run_on_both_backends(name):
    """The lowerings use no op newer than opset 17 (Shape with start/end is 15)."""
    torch = pytest.importorskip("torch")
    fn, xs = next((c[1], c[2]) for c in CASES if c[0] == name)
    model = gc.capture(lambda x: fn(gc, x), x=xs[0], opset=17)
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"x": xs[0]})["output"]
    np.testing.assert_allclose(got, _torch(fn, xs, False)[1].numpy(), rtol=1e-9, atol=1e-11)


def test_matrix_exp_scales_its_squarings_to_the_norm():
    """1-norms from 0 to about 1e3 (no squaring to ten of them): relative to the largest entry, within
    1e-12 of torch in float64 and 1e-4 in float32 (where exp(150 * x) overflows, left out); a zero
    matrix gives the identity."""
    torch = pytest.importorskip("torch")
    x = np.stack([_r(5, 5) * s for s in (0, 1e-3, 0.5, 3, 20, 150)])
    want = torch.linalg.matrix_exp(torch.from_numpy(x)).numpy()
    for dtype, count, tol in ((np.float64, 6, 1e-12), (np.float32, 5, 1e-4)):
        feeds = {"a": x[:count].astype(dtype)}
        with np.errstate(divide="ignore"):  # log of the zero matrix's norm
            got = run_both(_capture(lambda G, a: G.linalg.matrix_exp(a), feeds), feeds)["output"]
        scale = np.abs(want[:count]).max(axis=(-2, -1), keepdims=True)
        assert np.max(np.abs(got - want[:count]) / scale) < tol, dtype
        np.testing.assert_array_equal(got[0], np.eye(5))


def test_singular_matrices():
    """lu_factor of a singular matrix is LAPACK's (zero pivots kept, as torch's); its inverse and
    solutions are inf/nan, where torch raises."""
    torch = pytest.importorskip("torch")
    x = np.array([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], np.zeros((3, 3))])
    with np.errstate(all="ignore"):  # the eager capture and the numpy run divide by zero
        model = _capture(lambda G, a: {"LU": G.linalg.lu_factor(a).LU, "pivots": G.linalg.lu_factor(a).pivots,
                                       "inv": G.linalg.inv(a)}, {"a": x})
        got = run_both(model, {"a": x})
    want = torch.linalg.lu_factor_ex(torch.from_numpy(x))
    np.testing.assert_allclose(got["LU"], want.LU.numpy(), atol=1e-15)
    np.testing.assert_array_equal(got["pivots"], want.pivots.numpy())
    assert not np.isfinite(got["inv"]).all(axis=(-2, -1)).any()


def test_graph_sizes_grow_linearly_in_n():
    """Nodes of ``inv``: about 48 per row (1,544 for n = 32); n above ``MAX_N`` is refused."""
    from graphc.dsl.ops_solve import MAX_N

    sizes = {n: len(gc.capture(lambda a: gc.linalg.inv(a), a=gc.spec("float32", (n, n))).proto.graph.node)
             for n in (8, 32)}
    assert 3.5 * sizes[8] < sizes[32] < 4.5 * sizes[8]
    with pytest.raises(gc.CaptureError, match=f"above the unrolled limit {MAX_N}"):
        gc.capture(lambda a: gc.linalg.inv(a), a=gc.spec("float32", (MAX_N + 1, MAX_N + 1)))


ERRORS = [
    (lambda x: gc.linalg.inv(x), _r(3, 4), r"A must be batches of square matrices, got 3 x 4"),
    (lambda x: gc.linalg.inv(x[0]), SQ1, r"A must be \(\.\.\., rows, cols\) matrices, got rank 1"),
    (lambda x: gc.inverse(x.astype("int64")), SQ1, r"A must be float32 or float64, got int64"),
    (lambda x: gc.linalg.solve(x, x[:2]), SQ1, r"B must have n = 3 rows, as A, got 2"),
    (lambda x: gc.linalg.solve(x, x.astype("float32")), SQ1, r"dtype mismatch float64 vs float32"),
    (lambda x: gc.linalg.solve_triangular(x, x[0], upper=True), SQ1,
     r"B must be \(\.\.\., n, k\) matrices, got rank 1"),
    (lambda x: gc.linalg.lu_factor(x, pivot=False), SQ1, r"pivot=False is not supported"),
    (lambda x: gc.linalg.lu_solve(x, x, x), SQ1, r"pivots must be int32 \(\.\.\., 3\), got float64\[3,3\]"),
    (lambda x: gc.linalg.matrix_power(x, 1.5), SQ1, r"n must be a Python int, got 1.5"),
    (lambda x: gc.linalg.qr(x, mode="full"), SQ1, r"mode must be 'reduced', 'complete' or 'r', got 'full'"),
    (lambda x: gc.linalg.lstsq(x, x), WIDE, r"at least as many rows as columns .*got 3 x 5"),
    (lambda x: gc.linalg.matrix_norm(x, 3), SQ1, r"ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got 3"),
    (lambda x: gc.linalg.eigh(x, UPLO="X"), SQ1, r"UPLO must be 'L' or 'U', got 'X'"),
    (lambda x: gc.linalg.svd(x), WIDE, r"full_matrices=True needs square matrices here, got 3 x 5"),
    (lambda x: gc.linalg.pinv(x, atol=x[0, 0]), SQ1, r"atol must be a Python number or None here, got Tensor"),
    (lambda x: gc.linalg.matrix_norm(x, dim=(1, -1)), SQ1, r"dim must be two different dims"),
    (lambda x: gc.linalg.vector_norm(x.astype("int64")), SQ1, r"expects a floating-point input, got int64"),
    (lambda x: gc.linalg.norm(x, 1), SQ, r"with ord=1 and no dim, A must be 1-D or 2-D, got rank 3"),
    (lambda x: gc.linalg.multi_dot([x]), SQ1, r"expects at least 2 tensors, got 1"),
    (lambda x: gc.linalg.multi_dot([x, x[0], x]), SQ1, r"tensor 1 must be 2-D"),
    (lambda x: gc.linalg.cross(x, x[0]), SQ1, r"cross takes two Tensors of one rank"),
    (lambda x: gc.cholesky_solve(x, x[:, :2]), SQ1, r"L must be batches of square matrices, got 3 x 2"),
]


@pytest.mark.parametrize("fn,x,match", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_bad_arguments_name_the_problem_and_the_line(fn, x, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=x)
    assert "test_dsl_solve.py:" in str(info.value)


def test_eigenvectors_and_singular_vectors_match_torch_up_to_sign():
    """Each column made positive at its largest |entry|: the vectors are torch's (distinct values)."""
    torch = pytest.importorskip("torch")

    def signed(v):
        top = np.take_along_axis(v, np.abs(v).argmax(-2)[..., None, :], -2)
        return v * np.sign(top)

    x = SQ + SQ.swapaxes(-1, -2)
    model = _capture(lambda G, a, b: {"v": G.linalg.eigh(a).eigenvectors, "u": G.linalg.svd(b, False).U,
                                      "vh": G.linalg.svd(b, False).Vh}, {"a": x, "b": TALL})
    got = run_both(model, {"a": x, "b": TALL})
    u, _, vh = torch.linalg.svd(torch.from_numpy(TALL), full_matrices=False)
    np.testing.assert_allclose(signed(got["v"]), signed(torch.linalg.eigh(torch.from_numpy(x))[1].numpy()), atol=1e-12)
    np.testing.assert_allclose(signed(got["u"]), signed(u.numpy()), atol=1e-12)
    np.testing.assert_allclose(signed(got["vh"].swapaxes(-1, -2)), signed(vh.mT.numpy()), atol=1e-12)


def test_jacobi_converges_for_larger_and_clustered_spectra():
    """n = 16 with a cluster of equal eigenvalues: within 1e-12 of torch's eigenvalues, and the
    vectors orthonormal and reconstructing ``A``."""
    torch = pytest.importorskip("torch")
    q, y = np.linalg.qr(_r(16, 16))[0], _r(16, 16)
    x = np.stack([q @ np.diag(np.r_[np.ones(6), np.arange(10.0)]) @ q.T, y + y.T])
    got = run_both(_capture(lambda G, a: dict(zip("wv", G.linalg.eigh(a))), {"a": x}), {"a": x})
    np.testing.assert_allclose(got["w"], torch.linalg.eigvalsh(torch.from_numpy(x)).numpy(), atol=1e-12)
    np.testing.assert_allclose(got["v"].swapaxes(-1, -2) @ got["v"], np.broadcast_to(np.eye(16), x.shape), atol=1e-12)
    np.testing.assert_allclose(got["v"] @ (got["w"][..., None] * got["v"].swapaxes(-1, -2)), x, atol=1e-12)


def test_symbolic_matrix_size_is_refused():
    with pytest.raises(gc.CaptureError, match=r"A's matrix size must be static .*got n x n") as info:
        gc.capture(lambda a: gc.linalg.inv(a), a=gc.spec("float32", ("b", "n", "n")))
    assert "test_dsl_solve.py:" in str(info.value)
