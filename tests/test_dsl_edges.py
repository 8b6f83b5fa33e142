"""Edge cases where graphc followed torch only partly: functions given a dim on 0-d Tensors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from torch_grad_util import TorchNS, assert_matches_torch

R = np.random.default_rng(0)
S = np.array(1.7)  # a 0-d float64 Tensor
IDX = np.array(0)  # a 0-d int64 index

# fn(M, x) on a 0-d x with dim 0 or -1: torch accepts each (values, shape, gradient)
ZERO_D = {
    "cumsum": lambda M, x, d: M.cumsum(x, d),
    "cumprod": lambda M, x, d: M.cumprod(x, d),
    "sort_values": lambda M, x, d: M.sort(x, d).values,
    "sort_indices": lambda M, x, d: M.sort(x, d).indices,
    "sort_descending": lambda M, x, d: M.sort(x, d, descending=True).values,
    "argsort": lambda M, x, d: M.argsort(x, d),
    "topk_values": lambda M, x, d: M.topk(x, 1, d)[0],
    "topk_indices": lambda M, x, d: M.topk(x, 1, d)[1],
    "kthvalue_values": lambda M, x, d: M.kthvalue(x, 1, d).values,
    "kthvalue_indices": lambda M, x, d: M.kthvalue(x, 1, d).indices,
    "softmax": lambda M, x, d: M.softmax(x, d),
    "log_softmax": lambda M, x, d: M.log_softmax(x, d),
    "logsumexp": lambda M, x, d: M.logsumexp(x, d),
    "logsumexp_keepdim": lambda M, x, d: M.logsumexp(x, d, keepdim=True),
    "sum": lambda M, x, d: M.sum(x, d),
    "sum_keepdim": lambda M, x, d: M.sum(x, d, keepdim=True),
    "sum_dims": lambda M, x, d: M.sum(x, [d]),
    "mean": lambda M, x, d: M.mean(x, d),
    "prod": lambda M, x, d: M.prod(x, d),
    "amax": lambda M, x, d: M.amax(x, d),
    "amin": lambda M, x, d: M.amin(x, d),
    "max_values": lambda M, x, d: M.max(x, d).values,
    "max_indices": lambda M, x, d: M.max(x, d).indices,
    "min_values": lambda M, x, d: M.min(x, d).values,
    "argmax": lambda M, x, d: M.argmax(x, d),
    "argmin": lambda M, x, d: M.argmin(x, d),
    "argmax_keepdim": lambda M, x, d: M.argmax(x, d, keepdim=True),
    "var": lambda M, x, d: M.var(x, d, correction=0),
    "std": lambda M, x, d: M.std(x, d, correction=0),
    "norm": lambda M, x, d: M.norm(x, dim=d),
    "cummax_values": lambda M, x, d: M.cummax(x, d).values,
    "cummin_indices": lambda M, x, d: M.cummin(x, d).indices,
    "logcumsumexp": lambda M, x, d: M.logcumsumexp(x, d),
    "gather": lambda M, x, d: M.gather(x, d, M.zeros_like(x).long()),
    "scatter_add": lambda M, x, d: M.scatter_add(x, d, M.zeros_like(x).long(), x * 2),
    "scatter": lambda M, x, d: M.scatter(x, d, M.zeros_like(x).long(), x * 3),
    "index_select": lambda M, x, d: M.index_select(x, d, M.zeros([1]).long()),
    "any": lambda M, x, d: M.any(x > 1, d),
    "all": lambda M, x, d: M.all(x > 1, d),
    "count_nonzero": lambda M, x, d: M.count_nonzero(x, d),
    "flip": lambda M, x, d: M.flip(x, [d]),
    "squeeze": lambda M, x, d: M.squeeze(x, d),
    "unsqueeze": lambda M, x, d: M.unsqueeze(x, d),
    "median": lambda M, x, d: M.median(x, d).values,
    "nanmedian": lambda M, x, d: M.nanmedian(x, d).values,
    "mode": lambda M, x, d: M.mode(x, d).values,
}


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("name", ZERO_D)
def test_functions_given_a_dim_on_a_0d_tensor_are_torch(name, dim):
    fn = ZERO_D[name]
    assert_matches_torch(lambda M, x: fn(M, x, dim), [S], {}, R)


def test_std_of_equal_values_has_torch_s_zero_gradient():
    """std is 0 there and torch's gradient 0 (sqrt's slope is infinite at 0); 0-d, [1] and equal values."""
    for x in (S, np.array([2.5]), np.full((2, 3), 0.5)):
        assert_matches_torch(lambda M, x: M.std(x, -1, correction=0), [x], {}, R)


def test_var_of_a_0d_tensor_reads_a_bool_second_argument_as_unbiased():
    assert_matches_torch(lambda M, x: M.var(x, False), [S], {}, R)


REFUSED_0D = {  # torch refuses these on a 0-d Tensor
    "cumsum_dim_1": lambda F, x: F.cumsum(x, 1),
    "softmax_dim_-2": lambda F, x: F.softmax(x, -2),
    "sum_dim_1": lambda F, x: F.sum(x, 1),
    "sort_dim_1": lambda F, x: F.sort(x, 1),
    "gather_dim_2": lambda F, x: F.gather(x, 2, x.long()),
    "roll": lambda F, x: F.roll(x, 1, 0),
    "narrow": lambda F, x: F.narrow(x, 0, 0, 1),
    "select": lambda F, x: F.select(x, 0, 0),
    "unbind": lambda F, x: F.unbind(x, 0),
    "diff": lambda F, x: F.diff(x, dim=0),
}


@pytest.mark.parametrize("name", REFUSED_0D)
def test_dims_torch_refuses_on_a_0d_tensor_are_capture_errors(name):
    torch = pytest.importorskip("torch")
    fn = REFUSED_0D[name]
    with pytest.raises((IndexError, RuntimeError)):
        fn(TorchNS(torch), torch.tensor(S))
    with pytest.raises(gc.CaptureError, match=r"test_dsl_edges.py"):
        gc.capture(lambda x: fn(F, x), x=S)


A = np.linspace(-1, 1, 24).reshape(2, 3, 4).astype(np.float32)
INPLACE = ["relu", "leaky_relu", "elu", "silu", "mish", "hardswish", "hardsigmoid", "hardtanh", "relu6", "selu", "celu",
           "rrelu", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]
UNDERSCORED = ["relu_", "elu_", "leaky_relu_", "hardtanh_", "selu_", "celu_", "rrelu_"]


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_true_on_a_numpy_array_is_refused_as_torch(name):
    """torch writes only into a Tensor; graphc lifted the array to a constant and wrote into that, silently."""
    torch = pytest.importorskip("torch")
    a = A[None] if name == "dropout3d" else A
    with pytest.raises((TypeError, AttributeError)):
        getattr(torch.nn.functional, name)(a, inplace=True)
    with pytest.raises(gc.CaptureError, match=rf"{name}\(inplace=True\) writes its result into its argument "
                                              r"'(x|input)', which must be a Tensor .*got ndarray.*test_dsl_edges.py"):
        gc.capture(lambda x: x + getattr(F, name)(a, inplace=True), x=a)


@pytest.mark.parametrize("name", UNDERSCORED)
def test_underscore_functions_on_a_numpy_array_are_refused_as_torch(name):
    torch = pytest.importorskip("torch")
    with pytest.raises((TypeError, AttributeError)):
        getattr(torch.nn.functional, name)(A)
    with pytest.raises(gc.CaptureError, match=rf"{name} writes its result into its first argument, which must be a "
                                              r"Tensor .*got ndarray.*test_dsl_edges.py"):
        gc.capture(lambda x: x + getattr(F, name)(A), x=A)


VIEWS = {  # x: [2, 3, 4]
    "transposed_flat": lambda x: x.transpose(0, 1).view(-1),
    "transposed_split_last": lambda x: x.transpose(0, 1).view(3, 2, 2, 2),
    "transposed_kept": lambda x: x.transpose(0, 1).view(3, 2, 4),
    "permuted_merge": lambda x: x.permute(2, 0, 1).view(4, 6),
    "permuted_flat": lambda x: x.permute(2, 0, 1).view(24),
    "strided_flat": lambda x: x[:, :, ::2].view(-1),
    "strided_rows": lambda x: x[:, ::2].view(-1),
    "sliced_rows": lambda x: x[:, 1:].view(2, 8),
    "sliced_cols": lambda x: x[:, :, 1:].view(6, 3),
    "sliced_cols_flat": lambda x: x[:, :, 1:].view(-1),
    "contiguous": lambda x: x.view(6, 4),
    "mT_view_as": lambda x: x.mT.view_as(x.mT.contiguous()),
    "mT_view_as_other": lambda x: x.transpose(1, 2).view_as(x),
    "contiguous_after": lambda x: x.transpose(0, 1).contiguous().view(-1),
    "unsqueezed": lambda x: x.transpose(0, 1).unsqueeze(1).view(3, 1, 2, 4),
}


@pytest.mark.parametrize("name", VIEWS)
def test_view_refuses_what_torch_refuses_and_views_the_rest(name):
    """torch's view raises where the strides of a transposed or strided view cannot be viewed as the new
    shape; graphc copied silently (reshape's semantics). Where torch views, values and gradients match."""
    torch = pytest.importorskip("torch")
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    fn = VIEWS[name]
    try:
        fn(torch.from_numpy(x))
    except RuntimeError as exc:
        assert "view size is not compatible" in str(exc)
        with pytest.raises(gc.CaptureError, match=r"view size .* is not compatible with the input's size .* and "
                                                  r"strides .*as torch's; use .reshape.*test_dsl_edges.py"):
            gc.capture(fn, x=x)
        return
    assert_matches_torch(lambda M, x: fn(x) * 1.0, [x], {}, R)


@pytest.mark.parametrize("cuts", [[2, 5], [7, -2, 20], [5, 2, 5], [0], [10, 10]])
def test_tensor_split_by_a_tensor_of_indices_is_torch(cuts):
    """Each piece x[a:b] between consecutive cuts, read at run time; weighted so the values and gradients
    show which piece each element went to."""
    x = R.standard_normal((10, 3))
    assert_matches_torch(lambda M, x, i: M.cat([p * (k + 1.0) for k, p in enumerate(M.tensor_split(x, i))]),
                         [x], {"i": np.array(cuts)}, R)
    model = gc.capture(lambda x, i: gc.tensor_split(x, i, 1), x=x.T, i=np.array(cuts))
    assert len(model.outputs) == len(cuts) + 1


def test_tensor_split_by_a_0d_constant_is_its_sections():
    torch = pytest.importorskip("torch")
    x = np.arange(10.0)
    model = gc.capture(lambda x: gc.tensor_split(x, gc.full((), 3, dtype="int64")), x=x)
    got = gc.Session(model, backend="ort-cpu").run({"x": x})
    want = torch.tensor_split(torch.from_numpy(x), torch.tensor(3))
    assert len(got) == len(want)
    for g, w in zip(got.values(), want):
        np.testing.assert_array_equal(g, w.numpy())


@pytest.mark.parametrize("index,match", [
    (np.array([2, 5], np.int32), "int64 Tensor of rank 0 or 1"),
    (np.array([2.0, 5.0]), "int64 Tensor of rank 0 or 1"),
    (np.array([[2, 5]]), "int64 Tensor of rank 0 or 1"),
    (np.array(3), "0-d Tensor of sections only as a constant"),
])
def test_tensor_split_refuses_index_tensors_as_torch_or_of_unknown_count(index, match):
    torch = pytest.importorskip("torch")
    if index.ndim:  # torch refuses these; a 0-d graph input it takes, but the piece count is the graph's
        with pytest.raises(RuntimeError):
            torch.tensor_split(torch.arange(10), torch.from_numpy(index))
    with pytest.raises(gc.CaptureError, match=match + ".*test_dsl_edges.py"):
        gc.capture(lambda x, i: gc.tensor_split(x, i), x=np.arange(10.0), i=index)


def test_index_put_with_none_in_the_indices_is_refused_as_torch():
    torch = pytest.importorskip("torch")
    x, i = np.zeros((2, 3)), np.array([0, 2])
    with pytest.raises(TypeError, match="got NoneType"):
        torch.from_numpy(x).index_put((None, torch.from_numpy(i)), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(gc.CaptureError, match=r"index_put indices\[0\] is None.*x\[:, idx\] = values.*test_dsl_edges"):
        gc.capture(lambda x, i: x.index_put((None, i), gc.full((), 1.0, dtype="float64")), x=x, i=i)
