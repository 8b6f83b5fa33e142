"""Det's gradient at singular matrices (rank n-1 and rank n-2), where det(A) * inv(A)^T is undefined:
the cofactor matrix graphc's rule builds is exact there, nonzero at rank n-1 and zero below. float64
central differences (det is a polynomial, so they are exact up to rounding) are the oracle, not torch:
its ``linalg.det`` backward (2.13) gives 0 at a singular matrix of rank n-1 as well. onnxruntime runs
the gradient graph too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

try:
    from autodiff_cases import GradCase, T
    from test_autodiff_rules import grad_proto, run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.autodiff_cases import GradCase, T
    from tests.test_autodiff_rules import grad_proto, run_numpy, run_ort

SINGULAR = {
    "rank_2_of_3": np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, -1.0, 2.0]]),  # adjugate nonzero
    "rank_1_of_3": np.outer([1.0, -2.0, 0.5], [3.0, 1.0, 2.0]),  # adjugate zero
    "zero_row_of_4": np.array([[1.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, -1.0],
                               [0.5, 0.0, 1.0, 2.0]]),
}


@pytest.mark.parametrize("name", SINGULAR)
def test_det_gradient_at_a_singular_matrix(name):
    a = SINGULAR[name]
    case = GradCase("Det", [T(a.shape)])
    proto, _ = grad_proto(case, np.float64)
    grad = run_numpy(proto, {"in0": a})["in0_grad"]
    c = float(onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "c0")))
    eps, numeric = 1e-4, np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        step = np.zeros_like(a)
        step[idx] = eps
        numeric[idx] = c * (np.linalg.det(a + step) - np.linalg.det(a - step)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=1e-9)
    rank = np.linalg.matrix_rank(a)
    assert rank < len(a) and (np.abs(grad).max() > 0.1) == (rank == len(a) - 1)
    ort_grad = run_ort(grad_proto(case, np.float32)[0], {"in0": a.astype(np.float32)})["in0_grad"]
    np.testing.assert_allclose(ort_grad, grad, rtol=1e-5, atol=1e-5)
