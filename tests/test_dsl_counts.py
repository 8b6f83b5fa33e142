"""Counting and uniqueness functions, nextafter and the linalg ``*_ex`` forms (graphc.dsl.ops_counts,
ops_nextafter, linalg_ex) against torch: values, dtypes and shapes on the numpy and ort-cpu backends
(empty inputs, ties, NaN, -0.0, int and float dtypes, symbolic dims), nextafter bit for bit, the
gradients torch has, and the errors for bad arguments."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import (assert_input_grad_matches_torch, assert_values_match_torch, named_outputs, run_both,
                                 torch_values)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_input_grad_matches_torch, assert_values_match_torch, named_outputs,
                                       run_both, torch_values)

R = np.random.default_rng(11)
NAN = np.nan
INTS = np.array([3, 0, 7, 3, 3, 1, 0], np.int64)
FLOATS = np.array([3.0, 1.0, NAN, 1.0, -0.0, 0.0, NAN, 2.0, 2.0, 1.0])  # NaNs, ties, both zeros
ZEROS_FIRST = np.array([0.0, -0.0, 1.0, -0.0])
ROWS = np.array([[1, 2, 0], [0, 5, 1], [1, 2, 0], [0, 5, 1], [0, 4, 9]], np.int64)
POINTS = R.random((20, 3))
X = R.standard_normal((3, 5))
SINGULAR = np.array([[[1.0, 2.0], [2.0, 4.0]], [[2.0, 1.0], [1.0, 3.0]], [[0.0, 0.0], [0.0, 0.0]],
                     [[1.0, 2.0], [2.0, 1.0]]])  # singular, positive-definite, zero, indefinite
ZERO_COLUMN = np.array([[[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 6.0]],
                        [[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
SPD = np.array([[[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]]] * 2) + np.eye(3) * np.array([[[0.0]], [[1.0]]])


def _uc(M, x, **kw):
    return M.unique_consecutive(x, return_inverse=True, return_counts=True, **kw)


# (id, fn(M, *arrays) with M torch or graphc, arrays); the results must be torch's in value, dtype and shape
VALUES = [
    ("bincount", lambda M, x: M.bincount(x), [INTS]),
    ("bincount_minlength", lambda M, x: M.bincount(x, minlength=10), [INTS]),
    ("bincount_minlength_short", lambda M, x: M.bincount(x, minlength=2), [INTS]),
    *[(f"bincount_{t}", lambda M, x: M.bincount(x), [INTS.astype(t)]) for t in ("int32", "uint8", "int8", "int16")],
    ("bincount_weights_float32", lambda M, x, w: M.bincount(x, w), [INTS, R.random(7).astype(np.float32)]),
    ("bincount_weights_float64", lambda M, x, w: M.bincount(x, weights=w), [INTS, R.random(7)]),
    ("bincount_weights_int", lambda M, x, w: M.bincount(x, w), [INTS, np.arange(7)]),  # float64, as torch
    ("bincount_empty", lambda M, x: M.bincount(x), [INTS[:0]]),
    ("bincount_empty_minlength", lambda M, x: M.bincount(x, minlength=3), [INTS[:0]]),
    ("bincount_method", lambda M, x: x.bincount(minlength=4), [INTS]),
    ("unique", lambda M, x: M.unique(x), [INTS]),
    ("unique_all", lambda M, x: M.unique(x, return_inverse=True, return_counts=True), [FLOATS]),
    ("unique_counts", lambda M, x: M.unique(x, return_counts=True), [FLOATS.astype(np.float32)]),
    ("unique_unsorted", lambda M, x: M.unique(x, sorted=False, return_inverse=True), [INTS]),  # sorted, as torch's CPU
    ("unique_zeros_first", lambda M, x: M.unique(x, return_inverse=True), [ZEROS_FIRST]),
    ("unique_zeros_first_negative", lambda M, x: M.unique(x), [-ZEROS_FIRST]),
    ("unique_2d_inverse", lambda M, x: M.unique(x, return_inverse=True, return_counts=True), [ROWS]),
    ("unique_scalar", lambda M, x: M.unique(x, return_inverse=True, return_counts=True), [np.asarray(2.5)]),
    ("unique_empty", lambda M, x: M.unique(x, return_inverse=True, return_counts=True), [FLOATS[:0]]),
    ("unique_bool", lambda M, x: M.unique(x, return_counts=True), [INTS > 2]),
    *[(f"unique_{t}", lambda M, x: M.unique(x, return_inverse=True), [INTS.astype(t)])
      for t in ("int32", "uint8", "int8", "float16")],
    ("unique_method", lambda M, x: x.unique(return_counts=True), [INTS]),
    ("unique_dim0", lambda M, x: M.unique(x, dim=0, return_inverse=True, return_counts=True), [ROWS]),
    ("unique_dim1", lambda M, x: M.unique(x, dim=1, return_inverse=True, return_counts=True), [ROWS.T]),
    ("unique_dim_float", lambda M, x: M.unique(x, dim=0, return_counts=True), [ROWS.astype(np.float64) / 3]),
    ("unique_dim_int32", lambda M, x: M.unique(x, dim=-2), [ROWS.astype(np.int32)]),
    ("unique_dim_empty", lambda M, x: M.unique(x, dim=0, return_inverse=True, return_counts=True), [ROWS[:0]]),
    ("unique_consecutive", lambda M, x: _uc(M, x), [FLOATS]),
    ("unique_consecutive_ints", lambda M, x: _uc(M, x), [np.sort(INTS)]),
    ("unique_consecutive_2d", lambda M, x: _uc(M, x), [ROWS]),
    ("unique_consecutive_dim0", lambda M, x: _uc(M, x, dim=0), [np.repeat(ROWS, 2, 0)]),
    ("unique_consecutive_dim1", lambda M, x: _uc(M, x, dim=1), [np.repeat(ROWS.T, 2, 1)]),
    ("unique_consecutive_nan_rows", lambda M, x: _uc(M, x, dim=0), [np.array([[1.0, NAN], [1.0, NAN], [1.0, 2.0]])]),
    ("unique_consecutive_empty", lambda M, x: _uc(M, x), [FLOATS[:0]]),
    ("unique_consecutive_method", lambda M, x: x.unique_consecutive(return_counts=True), [INTS]),
    ("histogramdd", lambda M, x: tuple(M.histogramdd(x, bins=[2, 3, 4])), [POINTS]),
    ("histogramdd_int_bins", lambda M, x: tuple(M.histogramdd(x, bins=3)), [POINTS.astype(np.float32)]),
    ("histogramdd_range", lambda M, x: tuple(M.histogramdd(x, bins=[2, 2, 3], range=[0.0, 0.5, 0.2, 1.0, 0.0, 2.0])),
     [POINTS]),
    ("histogramdd_edges", lambda M, x, a, b: tuple(M.histogramdd(x, bins=[a, b])),
     [POINTS[:, :2], np.array([0.0, 0.3, 0.5, 1.0]), np.array([0.1, 0.2, 0.9])]),
    ("histogramdd_weight_density", lambda M, x, w: tuple(M.histogramdd(x, bins=[3, 2, 2], weight=w, density=True)),
     [POINTS, R.random(20)]),
    ("histogramdd_batched", lambda M, x: tuple(M.histogramdd(x, bins=2)), [POINTS.reshape(4, 5, 3)]),
    ("histogramdd_ties", lambda M, x: tuple(M.histogramdd(x, bins=2)), [np.ones((3, 2))]),  # widened by 0.5
    ("histogramdd_nan_outside", lambda M, x: tuple(M.histogramdd(x, bins=2, range=[0.0, 1.0, 0.0, 1.0])),
     [np.array([[NAN, 1.0], [0.0, 0.0], [2.0, 0.5], [0.5, 0.5]])]),
    ("histogramdd_empty", lambda M, x: tuple(M.histogramdd(x, bins=2)), [np.zeros((0, 2))]),
    ("inv_ex", lambda M, a: tuple(M.linalg.inv_ex(a)), [SPD]),
    ("inv_ex_info", lambda M, a: M.linalg.inv_ex(a).info, [np.concatenate([SINGULAR, SPD[:, :2, :2]])]),
    ("inv_ex_info_zero_column", lambda M, a: M.linalg.inv_ex(a).info, [ZERO_COLUMN]),
    ("cholesky_ex", lambda M, a: tuple(M.linalg.cholesky_ex(a)), [SPD]),
    ("cholesky_ex_upper", lambda M, a: tuple(M.linalg.cholesky_ex(a, upper=True)), [SPD]),
    ("cholesky_ex_info", lambda M, a: M.linalg.cholesky_ex(a).info, [SINGULAR]),
    ("cholesky_ex_info_3", lambda M, a: M.linalg.cholesky_ex(a, upper=True).info, [ZERO_COLUMN]),
    ("cholesky_ex_info_nan", lambda M, a: M.linalg.cholesky_ex(a).info, [np.array([[NAN, 0.0], [0.0, 1.0]])]),
    ("solve_ex", lambda M, a, b: tuple(M.linalg.solve_ex(a, b)), [SPD, R.standard_normal((2, 3))]),
    ("solve_ex_right", lambda M, a, b: tuple(M.linalg.solve_ex(a, b, left=False)), [SPD, R.standard_normal((2, 4, 3))]),
    ("solve_ex_info", lambda M, a: M.linalg.solve_ex(a, a[..., 0]).info, [np.concatenate([SINGULAR, SPD[:, :2, :2]])]),
    ("solve_ex_info_right", lambda M, a: M.linalg.solve_ex(a, a, left=False).info, [ZERO_COLUMN]),
    ("lu_factor_ex", lambda M, a: tuple(M.linalg.lu_factor_ex(a)), [R.standard_normal((3, 4, 4))]),
    ("lu_factor_ex_singular", lambda M, a: tuple(M.linalg.lu_factor_ex(a)), [np.concatenate([SINGULAR[:1],
                                                                                            SINGULAR[2:]])]),
    ("lu_factor_ex_zero_column", lambda M, a: tuple(M.linalg.lu_factor_ex(a)), [ZERO_COLUMN]),
]


@pytest.mark.parametrize("name,fn,arrays", VALUES, ids=[v[0] for v in VALUES])
def test_values_match_torch(name, fn, arrays):
    assert_values_match_torch(pytest.importorskip("torch"), fn, arrays, signs=True)


def test_symbolic_lengths_and_opset_17():
    """Inputs of a symbolic length, at opsets 17 and 21, fed two different lengths."""
    torch = pytest.importorskip("torch")
    cases = {"bincount": lambda M, x: M.bincount(x, minlength=3),
             "unique": lambda M, x: M.unique(x, return_inverse=True, return_counts=True),
             "unique_consecutive": lambda M, x: _uc(M, x), "unique_dim": lambda M, x: M.unique(x[None], dim=1)}
    for opset in (17, 21):
        for name, fn in cases.items():
            model = gc.capture(lambda x, fn=fn: named_outputs(fn(gc, x)), x=gc.spec("int64", ("N",)), opset=opset)
            onnx.checker.check_model(model.proto, full_check=True)
            for x in (INTS, np.array([5, 5, 2], np.int64)):
                got = run_both(model, {"x": x})
                for k, v in torch_values(torch, fn, [x]).items():
                    np.testing.assert_array_equal(got[k], v, err_msg=f"{name} opset {opset} {k}")


def _special_floats(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    tiny = np.array(info.smallest_subnormal, dtype)
    return np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, info.max, -info.max, info.tiny, -info.tiny, tiny,
                     -tiny, 2 * tiny, np.inf, -np.inf, NAN, 1e-3, -7.5], dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nextafter_is_torchs_bit_for_bit(dtype):
    """Every pair of special values (zeros of both signs, subnormals, the largest, infinities, NaN,
    powers of two): the same bits as torch's on both backends."""
    torch = pytest.importorskip("torch")
    values = _special_floats(dtype)
    a, b = (np.ascontiguousarray(v) for v in np.broadcast_arrays(values[:, None], values[None, :]))
    want = torch.nextafter(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    with np.errstate(all="ignore"):
        model = gc.capture(lambda a, b: a.nextafter(b), a=gc.spec(dtype, ("N", "M")), b=gc.spec(dtype, ("N", "M")))
    bits = f"uint{8 * np.dtype(dtype).itemsize}"
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"a": a, "b": b})["output"]
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan, err_msg=backend)
        np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits), err_msg=backend)


def test_nextafter_bfloat16_and_numbers():
    torch = pytest.importorskip("torch")
    x = np.array([1.0, -0.0, 3.5, 1e-30], np.float32)
    want = torch.nextafter(torch.from_numpy(x).bfloat16(), torch.tensor(2.0, dtype=torch.bfloat16)).float().numpy()
    model = gc.capture(lambda x: gc.nextafter(x.to("bfloat16"), 2.0).float(), x=x)
    np.testing.assert_array_equal(run_both(model, {"x": x})["output"], want)
    y = np.zeros(1)
    want64 = torch.nextafter(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    got64 = run_both(gc.capture(lambda x, y: gc.nextafter(x, y), x=x, y=y), {"x": x, "y": y})["output"]
    assert got64.dtype == want64.dtype and np.array_equal(got64, want64)  # float32 next to float64: float64


# (id, fn(M, x, **inputs) -> a Tensor, x, inputs); the gradients of sum(fn * c) go where torch's go
GRADS = [
    ("nextafter", lambda M, x: M.nextafter(x, x * 2.0) * x, R.standard_normal((3, 4)), {}),
    ("inv_ex", lambda M, x: M.linalg.inv_ex(x).inverse, SPD[0] + R.standard_normal((3, 3)) * 0.1, {}),
    ("cholesky_ex", lambda M, x: M.linalg.cholesky_ex(x @ x.mT).L, SPD[1], {}),
    ("solve_ex", lambda M, x, b: M.linalg.solve_ex(x, b).result, SPD[0] + R.standard_normal((3, 3)) * 0.1,
     {"b": R.standard_normal((3, 2))}),
    ("lu_factor_ex", lambda M, x: M.linalg.lu_factor_ex(x).LU, R.standard_normal((4, 4)), {}),
]


@pytest.mark.parametrize("name,fn,x,inputs", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_match_torch(name, fn, x, inputs):
    pytest.importorskip("torch")
    assert_input_grad_matches_torch(fn, x, inputs, R, dsl=gc)


def test_check_errors_raises_at_capture_on_eager_values():
    with pytest.raises(gc.CaptureError, match=r"linalg.inv_ex: A is singular \(info 2\)") as info:
        gc.capture(lambda a: gc.linalg.inv_ex(a, check_errors=True).inverse, a=SINGULAR[0])
    assert "test_dsl_counts.py:" in str(info.value)
    with pytest.raises(gc.CaptureError, match=r"linalg.cholesky_ex: A is not positive-definite \(info 2\)"):
        gc.capture(lambda a: gc.linalg.cholesky_ex(a, check_errors=True).L, a=SINGULAR)
    model = gc.capture(lambda a: gc.linalg.cholesky_ex(a, check_errors=True).info, a=SPD)  # no failure: captured
    np.testing.assert_array_equal(run_both(model, {"a": SPD})["output"], [0, 0])


ERRORS = [
    ("bincount_negative", lambda x: gc.bincount(gc.tensor([1, -2])), "bincount input: expected non-negative entries"),
    ("bincount_float", lambda x: gc.bincount(x), r"bincount input: expected a 1-D Tensor of integers, got float64"),
    ("bincount_2d", lambda x: gc.bincount(x.long()), r"bincount input: expected a 1-D .* got int64\[3,5\]"),
    ("bincount_weights", lambda x: gc.bincount(x[0].abs().long(), x[1, :2]), r"bincount weights: expected a 1-D Tensor of"),
    ("bincount_minlength", lambda x: gc.bincount(x[0].abs().long(), minlength=-1), "bincount minlength=-1: expected"),
    ("unique_sorted", lambda x: gc.unique(x, sorted=None), "unique sorted=None: expected a bool"),
    ("unique_dim", lambda x: gc.unique(x, dim=2), r"^unique\(float64\[3,5\]\): dim 2 out of range"),
    ("unique_consecutive_dim", lambda x: gc.unique_consecutive(x, dim=-3), r"^unique_consecutive\(.*dim -3 out"),
    ("histogramdd_1d", lambda x: gc.histogramdd(x[0]), "histogramdd input: expected a floating-point Tensor of at"),
    ("histogramdd_int", lambda x: gc.histogramdd(x.long()), "histogramdd input: expected a floating-point Tensor"),
    ("histogramdd_bins", lambda x: gc.histogramdd(x, bins=[2, 3]), r"histogramdd bins: expected .* per dim \(5\)"),
    ("histogramdd_range", lambda x: gc.histogramdd(x, range=[0.0, 1.0]),
     r"histogramdd range=\[0.0, 1.0\]: expected 10 numbers"),
    ("histogramdd_weight", lambda x: gc.histogramdd(x, weight=x),
     r"histogramdd weight: expected a float64 Tensor of the input's shape less its last dim \[3\]"),
    ("nextafter_int", lambda x: gc.nextafter(x.long(), 1), r"nextafter\(int64\[3,5\], int64\[\]\): expected float"),
    ("inv_ex_rank", lambda x: gc.linalg.inv_ex(x[0]), r"linalg.inv_ex\(float64\[5\]\): A must be"),
    ("cholesky_ex_square", lambda x: gc.linalg.cholesky_ex(x), r"linalg.cholesky_ex\(.*\): A must be batches of squ"),
    ("lu_factor_ex_pivot", lambda x: gc.linalg.lu_factor_ex(x[:, :3], pivot=False), "pivot=False is not supported"),
]


@pytest.mark.parametrize("name,fn,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_name_the_argument(name, fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=X)
    assert "test_dsl_counts.py:" in str(info.value)
