"""``gc.linalg.vander`` and ``gc.nn.utils.rnn.invert_permutation`` (absent before, found by
``scripts/reach_sweep.py``) against torch: float64 values and ``gc.grad`` gradients to 1e-10 on the numpy and
ort-cpu backends, integer inputs, and torch's refusals as clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.nn.utils.rnn import invert_permutation

try:
    from torch_grad_util import gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(13)


@pytest.mark.parametrize("shape,N", [((4,), None), ((2, 3), 5), ((2, 1, 3), 2)])
def test_linalg_vander_values_and_gradients_match_torch(shape, N):
    """Gradients at 0 too (torch's cumprod: d x^j = j x^(j - 1), 1 for j = 1)."""
    x = R.standard_normal(shape)
    x.reshape(-1)[0] = 0.0
    xt = torch.tensor(x, requires_grad=True)
    want = torch.linalg.vander(xt, N=N)
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda _, x: gc.linalg.vander(x, N=N), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


def test_linalg_vander_of_integers_is_int64_as_torchs():
    x = np.array([[2, -3, 0], [1, 4, 5]], np.int32)
    model = gc.capture(lambda x: gc.linalg.vander(x, N=4), x=gc.spec("int32", ("B", 3)))
    got = run_both(model, {"x": x})["output"]
    want = torch.linalg.vander(torch.from_numpy(x), N=4)
    assert got.dtype == np.int64 and want.dtype == torch.int64
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.linalg.vander(x, N=1), r"linalg.vander: N must be greater than 1, got 1"),
    (lambda x: gc.linalg.vander(x[0, 0]), r"linalg.vander: N must be greater than 1, got 1"),
    (lambda x: gc.linalg.vander(x > 0), r"linalg.vander takes float or integer tensors, got bool"),
    (lambda x: invert_permutation(x), r"invert_permutation takes a 1-D integer permutation, got float64 of rank 2"),
])
def test_refusals_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=R.standard_normal((2, 3)))
    assert "test_linalg_vander_invert_permutation.py" in str(err.value)


def test_invert_permutation_matches_torch_with_a_symbolic_length():
    model = gc.capture(invert_permutation, permutation=gc.spec("int64", ("N",)))
    for p in (np.array([3, 0, 4, 1, 2]), np.array([0]), R.permutation(9)):
        want = torch.nn.utils.rnn.invert_permutation(torch.from_numpy(p)).numpy()
        np.testing.assert_array_equal(run_both(model, {"permutation": p})["output"], want)
    assert invert_permutation(None) is None and torch.nn.utils.rnn.invert_permutation(None) is None
