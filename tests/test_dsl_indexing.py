"""``x[...]`` with index Tensors against numpy and torch: several index Tensors pick pointwise
(broadcast together, result dims in place when adjacent, else first), mixed with ints, slices,
``None``, ``...`` and negative indices; index lists; bool masks (one index Tensor per axis they
cover); forward on the numpy and ort-cpu backends, and with torch
installed, ``gc.grad``'s gradient too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from dsl_util import rng
    from torch_grad_util import gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import rng
    from tests.torch_grad_util import gc_grads, run_both

X = rng(3).standard_normal((4, 5, 6)).astype(np.float32)
IDX = {"i": np.array([3, 0, -1]), "j": np.array([4, -3, 0]), "k": np.array([5, 1, -6]),
       "i2": np.array([[1, 2], [-1, 0]]), "jrow": np.array([4, 2]), "jcol": np.array([[0], [2]]),
       "j32": np.array([1, -2, 3], np.int32), "m0": X[:, 0, 0] > 0, "m01": X[:, :, 0] > 0, "mall": X > 0.5,
       "m2": X[0, 0] > 0}
_ = slice(None)
# templates: a str names an index Tensor of IDX
NUMPY_CASES = [
    ("i",), ("i", "j"), ("i", _, "j"), (_, "i", "j"), (Ellipsis, "i", "j"), ("i", Ellipsis, "j"), ("i", "j", "k"),
    (_, "i2", None), (None, "i", "j"), ("i", None, "j"), ("jcol", "i"), ("i2", _, "jrow"), (slice(1, None), "i", "j"),
    ("i", _, slice(1, None, 2)), (_, "i", 0), ("i", 0), ("i", 1, "j"), (-1, "i2", None), ("i", "j32"),
    (None, "i2", "jcol", None),
    ([3, 0, -1],), (_, [[1, 2], [0, 0]]), ([1, 0], _, [5, 5]), ("m0",), ("m01",), ("mall",), (_, _, "m2"),
    (Ellipsis, "m2"), (None, "m01", 2), ("m0", _, [True, False, True, True, False, False]),
]
TORCH_ONLY_CASES = [(0, _, "i"), (1, Ellipsis, "i2")]  # torch applies ints first; numpy treats them as index arrays


def _index(template, tensors):
    return tuple(tensors[t] if isinstance(t, str) else t for t in template)


def _capture(template):
    names = [t for t in template if isinstance(t, str)]
    model = gc.capture(lambda x, **idx: x[_index(template, idx)], x=gc.spec("float32", X.shape),
                       **{n: gc.spec(IDX[n].dtype, IDX[n].shape) for n in names})
    onnx.checker.check_model(model.proto, full_check=True)
    return model, {"x": X, **{n: IDX[n] for n in names}}


@pytest.mark.parametrize("template", NUMPY_CASES, ids=str)
def test_index_tensors_match_numpy(template):
    model, feeds = _capture(template)
    out = run_both(model, feeds)["output"]
    np.testing.assert_array_equal(out, X[_index(template, IDX)])


@pytest.mark.parametrize("template", NUMPY_CASES + TORCH_ONLY_CASES, ids=str)
def test_index_tensors_and_gradient_match_torch(template):
    torch = pytest.importorskip("torch")
    model, feeds = _capture(template)
    out = run_both(model, feeds)["output"]
    xt = torch.tensor(X, requires_grad=True)
    expected = xt[_index(template, {k: torch.from_numpy(v) for k, v in IDX.items()})]
    c = rng(4).standard_normal(tuple(expected.shape)).astype(np.float32)
    (expected * torch.from_numpy(c)).sum().backward()
    np.testing.assert_array_equal(out, expected.detach().numpy())
    names = [t for t in template if isinstance(t, str)]
    got = gc_grads(lambda M, x, **idx: x[_index(template, idx)], {"x": X}, {n: IDX[n] for n in names}, c)
    np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_index_tensors_that_cannot_broadcast_are_a_capture_error():
    message = r"GatherND.*int64\[3\] and int64\[2\] cannot broadcast.*test_dsl_indexing"
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(lambda x, i, j: x[i, j], x=X, i=IDX["i"], j=IDX["jrow"])


def test_a_mask_that_does_not_fit_its_axes_is_a_capture_error():
    message = r"the mask's dim 1 \(4\) does not match axis 1 of the indexed tensor \(5\).*test_dsl_indexing"
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(lambda x, m: x[m], x=X, m=np.ones((4, 4), bool))
    with pytest.raises(gc.CaptureError, match=r"index list or array must hold ints or bools, got float64"):
        gc.capture(lambda x: x[[0.5, 1.0]], x=X)


@pytest.mark.parametrize("mask", ["m01", "mall"])
def test_a_numpy_mask_gives_a_static_length_that_chunk_can_split(mask):
    """A constant (numpy) mask's positions are known at capture, so ``x[mask]`` has a static length and
    ``chunk`` splits it (grad fuzz find: a NonZero's length was unknown, and chunk refused it); the value
    and ``gc.grad``'s gradient against torch."""
    torch = pytest.importorskip("torch")
    m = IDX[mask]

    def fn(M, x):
        return M.cat(list(M.chunk(x[m if M is not torch else torch.from_numpy(m)], 2, dim=0))[::-1], dim=0)

    model = gc.capture(lambda x: fn(gc, x), x=gc.spec("float32", X.shape))
    assert model.outputs[0].shape[0] == X[m].shape[0]
    xt = torch.tensor(X, requires_grad=True)
    expected = fn(torch, xt)
    np.testing.assert_array_equal(run_both(model, {"x": X})["output"], expected.detach().numpy())
    c = rng(5).standard_normal(tuple(expected.shape)).astype(np.float32)
    (expected * torch.from_numpy(c)).sum().backward()
    np.testing.assert_allclose(gc_grads(fn, {"x": X}, {}, c)["x"], xt.grad.numpy(), rtol=1e-5, atol=1e-6)
