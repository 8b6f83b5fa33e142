"""``gc.linalg.ldl_factor``, ``ldl_factor_ex`` and ``ldl_solve`` (graphc/dsl/linalg_ldl.py) against torch:
the pivots exactly and ``LD`` of random symmetric indefinite matrices (small diagonals force 2x2 blocks
and interchanges), float32 and float64 on the numpy and ort-cpu backends, a symbolic batch dim; ``info``
of singular matrices; gradients (torch has none) against float64 central differences and, for
``ldl_solve``'s ``B``, against torch.linalg.solve's; errors naming the argument."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

R = np.random.default_rng(11)


def _symmetric(batch: int, n: int) -> np.ndarray:
    """Symmetric indefinite matrices, every other with its diagonal shrunk (2x2 blocks, interchanges)."""
    x = R.standard_normal((batch, n, n))
    x = x + np.swapaxes(x, -1, -2)
    x[::2] *= np.where(np.eye(n, dtype=bool), 0.01, 1.0)
    return x


def _factor(G, a):
    return dict(zip(("LD", "pivots", "info"), G.linalg.ldl_factor_ex(a)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_factor_matches_torch(n):
    """Pivots equal torch's (LAPACK sytrf) on each backend; ``LD`` within 1e-12 (float64) / 1e-4 (float32)
    of torch's largest entry. The batch holds 2x2 blocks and 1x1 interchanges (checked, n > 2)."""
    torch = pytest.importorskip("torch")
    a = _symmetric(40, n)
    a[1, 0, -1] = 1e3  # the upper triangle is not read
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-4)):
        x = a.astype(dtype)
        model = gc.capture(lambda a: _factor(gc, a), a=x)
        onnx.checker.check_model(model.proto, full_check=True)
        got = run_both(model, {"a": x})
        want = _factor(torch, torch.from_numpy(x))
        pivots = want["pivots"].numpy()
        np.testing.assert_array_equal(got["pivots"], pivots)
        assert got["pivots"].dtype == np.int32 and got["info"].dtype == np.int32
        np.testing.assert_array_equal(got["info"], want["info"].numpy())
        scale = np.abs(want["LD"].numpy()).max(axis=(-2, -1), keepdims=True)
        assert np.abs(got["LD"] - want["LD"].numpy()).max() / scale.max() < tol, dtype
        if n > 2:
            assert (pivots < 0).any() and ((pivots > 0) & (pivots != np.arange(1, n + 1))).any()


def test_solve_matches_torch_and_broadcasts():
    """torch's factors fed in; ``B`` with more batch dims than ``LD`` (torch 2.13 segfaults broadcasting a
    batched ``LD``: its oracle gets them expanded); the residual of ``A @ X = B``."""
    torch = pytest.importorskip("torch")
    a = _symmetric(6, 5)
    b = R.standard_normal((3, 6, 5, 2))
    ld, pivots = torch.linalg.ldl_factor(torch.from_numpy(a))
    want = torch.linalg.ldl_solve(ld.expand(3, -1, -1, -1), pivots.expand(3, -1, -1), torch.from_numpy(b)).numpy()
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-3)):
        feeds = {"ld": ld.numpy().astype(dtype), "pivots": pivots.numpy(), "b": b.astype(dtype)}
        model = gc.capture(lambda ld, pivots, b: gc.linalg.ldl_solve(ld, pivots, b), **feeds)
        got = run_both(model, feeds)["output"]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(dtype))
    np.testing.assert_allclose(a @ got, b, atol=1e-3)


def test_symbolic_batch():
    torch = pytest.importorskip("torch")
    model = gc.capture(lambda a, b: {**_factor(gc, a), "x": gc.linalg.ldl_solve(*gc.linalg.ldl_factor(a), b)},
                       a=gc.spec("float64", ("N", 4, 4)), b=gc.spec("float64", ("N", 4, 3)))
    onnx.checker.check_model(model.proto, full_check=True)
    for batch in (1, 7):
        a, b = _symmetric(batch, 4), R.standard_normal((batch, 4, 3))
        got = run_both(model, {"a": a, "b": b})
        want = _factor(torch, torch.from_numpy(a))
        np.testing.assert_array_equal(got["pivots"], want["pivots"].numpy())
        np.testing.assert_allclose(got["LD"], want["LD"].numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["x"], np.linalg.solve(a, b), rtol=1e-9, atol=1e-9)


def test_singular_matrices_give_lapacks_info():
    """A zero column is skipped with ``info`` its 1-based position, as torch's; ``check_errors`` raises."""
    torch = pytest.importorskip("torch")
    a = np.array([np.zeros((3, 3)), [[1.0, 0, 0], [0, 0, 0], [0, 0, 2]], [[0.0, 1, 2], [1, 0, 3], [2, 3, 0]],
                  [[0.0, 0, 0], [0, 1, 0], [0, 0, 0]]])
    got = run_both(gc.capture(lambda a: _factor(gc, a), a=a), {"a": a})
    want = _factor(torch, torch.from_numpy(a))
    for k in got:
        np.testing.assert_array_equal(got[k], want[k].numpy(), err_msg=k)
    np.testing.assert_array_equal(got["info"], [1, 2, 0, 1])
    with pytest.raises(gc.CaptureError, match=r"linalg.ldl_factor_ex: D is singular \(info 1\)"):
        gc.capture(lambda a: gc.linalg.ldl_factor_ex(a, check_errors=True).LD, a=a)


FINITE = {
    "ldl_factor": lambda G, x: G.linalg.ldl_factor(x + x.mT).LD,
    "ldl_solve": lambda G, x: G.linalg.ldl_solve(*G.linalg.ldl_factor(x + x.mT), x * x),
}


@pytest.mark.parametrize("name", FINITE)
def test_gradients_match_float64_central_differences(name):
    """Through the unrolled steps, the batch holding 2x2 blocks (pivots fixed near ``x``)."""
    x = _symmetric(4, 4) / 2
    assert_grads_match_central_differences(lambda M, x: FINITE[name](gc, x), x)


def test_solve_gradient_matches_torch_solve():
    """d/dB of ``sum(ldl_solve(..., B) * c)`` is ``A^-T c``: torch.linalg.solve's autograd (torch's
    ldl_solve has none)."""
    torch = pytest.importorskip("torch")
    a, b = _symmetric(3, 5), R.standard_normal((3, 5, 2))
    c = R.standard_normal(b.shape)
    tb = torch.from_numpy(b).requires_grad_()
    (torch.linalg.solve(torch.from_numpy(a), tb) * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, b, a: gc.linalg.ldl_solve(*gc.linalg.ldl_factor(a), b), {"b": b}, {"a": a}, c,
                       backend=backend)
        np.testing.assert_allclose(got["b"], tb.grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=backend)


ERRORS = [
    (lambda x: gc.linalg.ldl_factor(x[:, :2]),
     r"linalg.ldl_factor\(.*\): A must be batches of square matrices, got 3 x 2"),
    (lambda x: gc.linalg.ldl_factor_ex(x[0]), r"A must be \(\.\.\., rows, cols\) matrices, got rank 1"),
    (lambda x: gc.linalg.ldl_factor(x.astype("int64")), r"A must be float32 or float64, got int64"),
    (lambda x: gc.linalg.ldl_solve(x, x, x),
     r"linalg.ldl_solve\(.*\): pivots must be int32 \(\.\.\., 3\), got float64"),
    (lambda x: gc.linalg.ldl_solve(*gc.linalg.ldl_factor(x), x[:2]), r"B must have n = 3 rows, as A, got 2"),
    (lambda x: gc.linalg.ldl_solve(*gc.linalg.ldl_factor(x), x.astype("float32")), r"dtype mismatch"),
]


@pytest.mark.parametrize("fn,match", ERRORS, ids=[e[1][:40] for e in ERRORS])
def test_bad_arguments_name_the_problem_and_the_line(fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.eye(3))
    assert "test_dsl_linalg_ldl.py:" in str(info.value)
