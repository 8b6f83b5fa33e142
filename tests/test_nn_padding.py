"""``F.pad`` in every mode: outputs on the numpy and ort-cpu backends against torch (several ranks,
odd sizes, crops), float64 gradients against central differences, and torch's limits as clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

try:
    from torch_grad_util import TorchNS, assert_grads_match_central_differences, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, assert_grads_match_central_differences, run_both

R = np.random.default_rng(21)
NCW, CW = R.standard_normal((2, 3, 7)).astype(np.float32), R.standard_normal((3, 6)).astype(np.float32)
NCHW, CHW = R.standard_normal((2, 3, 5, 6)).astype(np.float32), R.standard_normal((2, 4, 5)).astype(np.float32)
NCDHW, CDHW = R.standard_normal((1, 2, 3, 4, 5)).astype(np.float32), R.standard_normal((2, 3, 3, 4)).astype(np.float32)

# (mode, pad, input): F.pad, the pads of up to three dims, crops included
FUNCTIONAL = [
    ("reflect", (2, 1), NCW), ("reflect", (2, -1, 1, 3), NCHW), ("reflect", (5, -4), NCW),
    ("reflect", (1, 2, 2, 1, 2, 1), NCDHW), ("replicate", (2, 1, -1, 3, 0, 2), CDHW), ("replicate", (-2, 3), CW),
    ("circular", (1, 2, -1, 3), NCHW), ("circular", (5, 6), NCW), ("circular", (1, 2, 2, 1, 3, 1), NCDHW),
    ("constant", (1, -2, 2, 1), NCHW),
]


@pytest.mark.parametrize("mode,pad,x", FUNCTIONAL, ids=[f"{m}{p}" for m, p, _ in FUNCTIONAL])
def test_functional_pad_gradients_match_central_differences(mode, pad, x):
    """Pad's reflect, edge and wrap gradient rules, float64, on both backends."""
    assert_grads_match_central_differences(lambda M, x: M.pad(x, pad, mode=mode), x)


@pytest.mark.parametrize("mode,pad,x", FUNCTIONAL, ids=[f"{m}{p}" for m, p, _ in FUNCTIONAL])
def test_functional_pad_matches_torch(mode, pad, x):
    torch = pytest.importorskip("torch")
    want = TorchNS(torch).pad(torch.from_numpy(x), pad, mode=mode).numpy()
    got = run_both(gc.capture(lambda x: gc.nn.functional.pad(x, pad, mode=mode), x=x), {"x": x})["output"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.pad(x, (7, 0), mode="reflect"), r"pad \(7, 0\) reflect pads must be smaller than dim 2's size 7"),
    (lambda x: gc.pad(x, (8, 0), mode="circular"), r"circular pads wrap around dim 2 more than once"),
    (lambda x: gc.pad(x, (3, -5), mode="circular"), r"the crops leave 2 of its 7"),
    (lambda x: gc.pad(x, (-4, -4)), r"pad \(-4, -4\) crops more than dim 2's size 7"),
    (lambda x: gc.pad(x, (1, 1), mode="replicate", value=2.0), r"pad mode='replicate' takes no value"),
])
def test_bad_pads_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=NCW)
    assert "test_nn_padding.py" in str(err.value)
