"""ScatterElements' gradients with reduction mul, max and min against torch's ``scatter_reduce``
(``include_self=True``, as ONNX always includes data), where values tie or are zero: finite
differences (``test_autodiff_rules``) cannot check a tie, where the gradient is a convention.
Both backends run the gradient graph."""

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

TORCH_REDUCE = {"max": "amax", "min": "amin", "mul": "prod"}

# data [3, 4] and updates [3, 3] scattered along axis 1: integer values so that they tie
INDEX = np.array([[1, 1, 3], [0, 0, 0], [2, 2, 2]])
DATA = np.array([[2.0, 5.0, 1.0, 4.0], [3.0, 3.0, -1.0, 0.0], [1.0, 2.0, 2.0, 7.0]])
UPDATES = {
    # row 0: two updates tie with data[0, 1] (three winners) / row 1: three updates tie at 3, data too
    # / row 2: an update ties data[2, 2] for the max, and all three updates tie for the min
    "max": np.array([[5.0, 5.0, 2.0], [3.0, 3.0, 3.0], [2.0, 2.0, 1.0]]),
    "min": np.array([[5.0, 5.0, 2.0], [3.0, 3.0, 3.0], [0.5, 0.5, 0.5]]),
    # row 0: one zero at data[0, 1]; row 1: two zeros at data[1, 0]; row 2: none, data[2, 3] is 0 below
    "mul": np.array([[0.0, 2.0, 3.0], [0.0, 1.5, 0.0], [2.0, -1.0, 0.5]]),
}


@pytest.mark.parametrize("reduction", ["max", "min", "mul"])
def test_scatter_elements_gradient_matches_torch_at_ties_and_zeros(reduction):
    torch = pytest.importorskip("torch")
    data = DATA.copy()
    if reduction == "mul":
        data[2, 3] = 0.0
    updates = UPDATES[reduction]
    case = GradCase("ScatterElements", [T(data.shape), INDEX, T(updates.shape)],
                    {"axis": 1, "reduction": reduction})
    proto64, _ = grad_proto(case, np.float64)
    dy = next(onnx.numpy_helper.to_array(t) for t in proto64.graph.initializer if t.name == "c0")  # d loss / d y

    td = torch.tensor(data, requires_grad=True)
    tu = torch.tensor(updates, requires_grad=True)
    ty = td.scatter_reduce(1, torch.tensor(INDEX), tu, TORCH_REDUCE[reduction], include_self=True)
    (ty * torch.tensor(dy)).sum().backward()

    for proto, run, dtype, tol in ((proto64, run_numpy, np.float64, 1e-12),
                                   (grad_proto(case, np.float32)[0], run_ort, np.float32, 1e-5)):
        out = run(proto, {"in0": data.astype(dtype), "in2": updates.astype(dtype)})
        np.testing.assert_allclose(out["in0_grad"], td.grad.numpy(), rtol=tol, atol=tol, err_msg="data")
        np.testing.assert_allclose(out["in2_grad"], tu.grad.numpy(), rtol=tol, atol=tol, err_msg="updates")
