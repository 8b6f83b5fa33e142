"""The torch names the coverage sweep added to gc and gc.nn, against torch 2.13 on the numpy and
ort-cpu backends: values, gradients (torch.autograd, or central differences where torch's backward is
not its forward's derivative), errors naming the argument; sampling by statistics and, with torch's
``_random_samples``, exactly."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from tests.dsl_util import check
from tests.torch_grad_util import (
    assert_grads_match_central_differences,
    assert_matches_torch,
    assert_module_matches_torch,
    gc_grads,
    run_both,
)

torch = pytest.importorskip("torch")


def G(M):
    """The namespace a test function calls: gc for the DSL side (``M`` is ``gc.nn.functional``), else torch's."""
    return gc if M is F else M


def run(fn, **feeds):
    """``fn(**feeds)`` captured (eagerly), checked, run on numpy and ort-cpu (which must agree)."""
    model = gc.capture(fn, **feeds)
    check(model)
    return run_both(model, feeds)


def rng(seed=0):
    return np.random.default_rng(seed)


# -- the older linear algebra ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (3, 3)])
def test_svd_returns_v_and_reconstructs(shape):
    a = rng().standard_normal(shape)
    got = run(lambda a: gc.svd(a), a=a)
    u, s, v = (got[f"output_{i}"] for i in range(3))
    want = torch.svd(torch.from_numpy(a))
    np.testing.assert_allclose(s, want.S.numpy(), rtol=1e-10)
    assert u.shape == tuple(want.U.shape) and v.shape == tuple(want.V.shape)
    np.testing.assert_allclose((u * s[..., None, :]) @ np.swapaxes(v, -1, -2), a, atol=1e-10)
    # singular vectors match torch's up to sign
    np.testing.assert_allclose(np.abs(np.swapaxes(v, -1, -2) @ want.V.numpy()).sum(-2), 1, atol=1e-8)


def test_svd_without_uv_gives_torchs_zero_matrices_and_the_singular_values_gradient():
    a = rng(1).standard_normal((2, 4, 3))
    got = run(lambda a: gc.svd(a, compute_uv=False), a=a)
    want = torch.svd(torch.from_numpy(a), compute_uv=False)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[f"output_{i}"].shape, tuple(w.shape))
    assert not got["output_0"].any() and not got["output_2"].any()
    assert_matches_torch(lambda M, a: G(M).svd(a)[1], [a], {}, rng(2))


def test_square_svd_some_false_and_rectangular_refusal():
    a = rng(3).standard_normal((3, 3))
    got = run(lambda a: gc.svd(a, some=False), a=a)
    np.testing.assert_allclose(got["output_1"], torch.svd(torch.from_numpy(a), some=False).S.numpy(), rtol=1e-10)
    with pytest.raises(gc.CaptureError, match="full_matrices=True needs square"):
        gc.capture(lambda a: gc.svd(a, some=False), a=rng().standard_normal((4, 3)))


@pytest.mark.parametrize("some", [True, False])
def test_qr_matches_torch(some):
    a = rng(4).standard_normal((2, 5, 3)) if some else rng(4).standard_normal((3, 3))
    got = run(lambda a: gc.qr(a, some=some), a=a)
    q, r = torch.qr(torch.from_numpy(a), some=some)
    np.testing.assert_allclose(got["output_0"], q.numpy(), atol=1e-10)
    np.testing.assert_allclose(got["output_1"], r.numpy(), atol=1e-10)


@pytest.mark.parametrize("get_infos", [False, True])
def test_lu_matches_torch(get_infos):
    a = rng(5).standard_normal((2, 4, 4))
    got = run(lambda a: gc.lu(a, get_infos=get_infos), a=a)
    want = torch.lu(torch.from_numpy(a), get_infos=get_infos)
    assert len(got) == len(want) == (3 if get_infos else 2)
    for i, w in enumerate(want):
        assert got[f"output_{i}"].dtype == w.numpy().dtype
        np.testing.assert_allclose(got[f"output_{i}"], w.numpy(), atol=1e-10)


def test_pinverse_matches_torch_with_gradient_and_cuts_below_rcond():
    a = rng(6).standard_normal((4, 3))
    assert_matches_torch(lambda M, a: G(M).pinverse(a), [a], {}, rng(7))
    rank_one = np.outer([1.0, 2.0, 3.0], [1.0, 1e-9, 0.0]) + np.outer([0.0, 0.0, 1.0], [0.0, 1e-9, 0.0])
    for rcond in (1e-15, 1e-3):
        want = torch.pinverse(torch.from_numpy(rank_one), rcond).numpy()
        np.testing.assert_allclose(run(lambda a, rcond=rcond: gc.pinverse(a, rcond), a=rank_one)["output"], want, atol=1e-6)


def test_matrix_rank_is_removed_as_in_torch():
    with pytest.raises(RuntimeError, match="deprecated since version 1.9 and is now removed"):
        torch.matrix_rank(torch.eye(2))
    with pytest.raises(gc.CaptureError, match="deprecated since version 1.9 and is now removed.*linalg.matrix_rank"):
        gc.capture(lambda a: gc.matrix_rank(a), a=np.eye(2))


@pytest.mark.parametrize("args", [(), (True,), ((0, 2),), ((2, 0), True)])
def test_nuclear_norm_overloads_match_torch(args):
    a = rng(8).standard_normal((3, 4, 2)) if args and isinstance(args[0], tuple) else rng(8).standard_normal((4, 3))
    assert_matches_torch(lambda M, a: G(M).nuclear_norm(a, *args), [a], {}, rng(9))


@pytest.mark.parametrize("dim,keepdim", [((), False), (1, False), ((0, 2), True), ((-1,), False)])
def test_frobenius_norm_matches_torch(dim, keepdim):
    a = rng(10).standard_normal((2, 3, 4))
    assert_matches_torch(lambda M, a: G(M).frobenius_norm(a, dim, keepdim), [a], {}, rng(11))


def test_frobenius_norm_errors_name_the_argument():
    with pytest.raises(gc.CaptureError, match="dim: expected at most 2 dimensions, got 3"):
        gc.capture(lambda a: gc.frobenius_norm(a, (0, 1, 2)), a=np.ones((2, 2, 2)))
    with pytest.raises(gc.CaptureError, match="input must be floating point, got int64"):
        gc.capture(lambda a: gc.frobenius_norm(a, (0,)), a=np.ones(2, np.int64))


@pytest.mark.parametrize("p,dim", [(2, 0), (2, 1), (2, 2), (3, 1), (2, -1), (2, -2)])
def test_norm_except_dim_matches_torch(p, dim):
    v = rng(12).standard_normal((2, 3, 4))
    assert_matches_torch(lambda M, v: G(M).norm_except_dim(v, p, dim), [v], {}, rng(13))


# -- strided views and factories ------------------------------------------------------------------

STRIDED = [((3, 2), (1, 2), 0), ((2, 2, 2), (6, 1, 3), 1), ((4, 3), (2, 1), 2), ((5,), (0,), 3), ((2, 0), (1, 1), 0)]


@pytest.mark.parametrize("size,stride,offset", STRIDED)
def test_as_strided_matches_torch_with_gradient(size, stride, offset):
    x = rng(14).standard_normal((3, 4))
    assert_matches_torch(lambda M, x: G(M).as_strided(x, size, stride, offset), [x], {}, rng(15))


def test_as_strided_method_copy_and_bounds():
    x = np.arange(12.0).reshape(3, 4)
    want = torch.from_numpy(x).as_strided((2, 3), (4, 1), 1).numpy()
    np.testing.assert_array_equal(run(lambda x: x.as_strided((2, 3), (4, 1), 1), x=x)["output"], want)
    np.testing.assert_array_equal(run(lambda x: gc.as_strided_copy(x, (2, 3), (4, 1), 1), x=x)["output"], want)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.from_numpy(x).as_strided((3, 3), (4, 2), 0)
    with pytest.raises(gc.CaptureError, match=r"need a storage of 13 elements, out of bounds for the input's 12"):
        gc.capture(lambda x: gc.as_strided(x, (3, 3), (4, 2)), x=x)
    with pytest.raises(gc.CaptureError, match=r"size and stride must have the same length"):
        gc.capture(lambda x: gc.as_strided(x, (3, 3), (4,)), x=x)
    with pytest.raises(gc.CaptureError, match=r"needs a Tensor of static shape"):
        gc.capture(lambda x: gc.as_strided(x, (2,), (1,)), x=gc.spec("float64", ("N", 4)))


@pytest.mark.parametrize("size,stride,offset", [((3, 2), (1, 3), 0), ((2, 2), (6, 1), 1), ((4,), (3,), 0)])
def test_as_strided_scatter_matches_torch_with_gradient(size, stride, offset):
    x, src = rng(16).standard_normal((3, 4)), rng(17).standard_normal(size)
    assert_matches_torch(lambda M, s, x: G(M).as_strided_scatter(x, s, size, stride, offset), [src], {"x": x}, rng(18))
    # torch 2.13's gradient for ``self`` is wrong (the written places get it, the kept ones 0): central differences
    assert_grads_match_central_differences(lambda m, x: gc.as_strided_scatter(x, src, size, stride, offset), x)
    with pytest.raises(gc.CaptureError, match=r"src must be float64\[3, 2\]"):
        gc.capture(lambda x, s: gc.as_strided_scatter(x, s, (3, 2), (1, 3)), x=x, s=np.ones((2, 3)))


def test_empty_strided_and_permuted_have_torchs_shape_and_dtype():
    got = run(lambda x: (x + gc.empty_strided((2, 3), (1, 2), dtype="float64").sum(),
                         gc.empty_permuted((2, 3, 4), (2, 0, 1), dtype="int32")), x=np.zeros(1))
    assert got["output_1"].shape == tuple(torch.empty_permuted((2, 3, 4), (2, 0, 1)).shape)
    assert got["output_1"].dtype == np.int32
    with pytest.raises(gc.CaptureError, match=r"physical_layout must be a permutation of 0..2, got \[0, 0, 1\]"):
        gc.capture(lambda x: gc.empty_permuted((2, 3, 4), (0, 0, 1)) + x, x=np.zeros(1, np.float32))
    with pytest.raises(gc.CaptureError, match=r"stride must hold one int >= 0 per dim"):
        gc.capture(lambda x: gc.empty_strided((2, 3), (1,)) + x, x=np.zeros(1, np.float32))


# -- nonzero_static, the unsafe splits, angle -----------------------------------------------------

@pytest.mark.parametrize("size,fill", [(2, -1), (6, -1), (9, 7), (0, -1)])
def test_nonzero_static_matches_torch(size, fill):
    x = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0], [0.0, 0.0, 3.0]])
    want = torch.nonzero_static(torch.from_numpy(x), size=size, fill_value=fill).numpy()
    got = run(lambda x: gc.nonzero_static(x, size=size, fill_value=fill), x=x)["output"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    with pytest.raises(gc.CaptureError, match="size must be an int >= 0, got -1"):
        gc.capture(lambda x: gc.nonzero_static(x, size=-1), x=x)


def test_unsafe_splits_match_torch():
    x = rng(19).standard_normal((7, 2))
    for name, arg in (("unsafe_chunk", 3), ("unsafe_split", 3), ("unsafe_split_with_sizes", [2, 4, 1])):
        want = getattr(torch, name)(torch.from_numpy(x), arg)
        got = run(lambda x, name=name, arg=arg: getattr(gc, name)(x, arg), x=x)
        assert len(got) == len(want)
        for i, w in enumerate(want):
            np.testing.assert_array_equal(got[f"output_{i}"], w.numpy())
    got = run(lambda x: x.unsafe_split(1, 1), x=x)
    np.testing.assert_array_equal(got["output_1"], x[:, 1:])


def test_angle_of_reals_matches_torch_nan_kept_and_integers_to_float32():
    x = np.array([-1.0, 0.0, -0.0, 2.0, np.nan, -np.inf, np.inf])
    assert_matches_torch(lambda M, x: G(M).angle(x), [x], {}, rng(20))
    ints = np.array([-3, 0, 4], np.int64)
    got = run(lambda x: x.angle(), x=ints)["output"]
    want = torch.angle(torch.from_numpy(ints)).numpy()
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# -- segment_reduce ---------------------------------------------------------------------------------

REDUCTIONS = ["sum", "mean", "max", "min", "prod", "amax", "amin"]


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce_lengths_and_offsets_match_torch(reduce, initial):
    data = rng(21).permutation(12).astype(np.float64).reshape(6, 2) / 3 + 0.5  # distinct, no zeros
    lengths, offsets = np.array([2, 0, 3, 1]), np.array([0, 2, 2, 5, 6])
    for key, value in (("lengths", lengths), ("offsets", offsets)):
        assert_matches_torch(lambda M, d, _k=key, _v=value: G(M).segment_reduce(
            d, reduce, **{_k: torch.from_numpy(_v) if M is not F else _v}, initial=initial), [data], {}, rng(22))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "prod"])
def test_segment_reduce_along_axis_1_with_run_time_lengths(reduce):
    data = rng(23).standard_normal((2, 6, 3))
    lengths = np.array([[2, 4, 0], [3, 3, 0]])
    want = torch.segment_reduce(torch.from_numpy(data), reduce, lengths=torch.from_numpy(lengths), axis=1).numpy()
    model = gc.capture(lambda d, n: gc.segment_reduce(d, reduce, lengths=n, axis=1),
                       d=gc.spec("float64", (2, 6, 3)), n=gc.spec("int64", (2, 3)))
    check(model)
    np.testing.assert_allclose(run_both(model, {"d": data, "n": lengths})["output"], want, rtol=1e-12)
    other = np.array([[6, 0, 0], [1, 1, 4]])
    want = torch.segment_reduce(torch.from_numpy(data), reduce, lengths=torch.from_numpy(other), axis=1).numpy()
    np.testing.assert_allclose(run_both(model, {"d": data, "n": other})["output"], want, rtol=1e-12)


def test_segment_reduce_gradient_of_zero_product_and_unsafe_lengths():
    data = np.array([1.0, 0.0, 3.0, 2.0, 4.0])
    assert_matches_torch(lambda M, d: G(M).segment_reduce(
        d, "prod", lengths=np.array([3, 2]) if M is F else torch.tensor([3, 2])), [data], {}, rng(24))
    short = lambda M, d: G(M).segment_reduce(
        d, "sum", lengths=np.array([2, 2]) if M is F else torch.tensor([2, 2]), unsafe=True)
    assert_matches_torch(short, [data], {}, rng(25))


def test_segment_reduce_errors_name_the_argument():
    d = np.ones(6)
    cases = [({"lengths": np.array([2, 2])}, "each row of lengths must add up to data.shape\\[0\\] = 6"),
             ({"lengths": np.array([7, -1])}, "lengths contains a negative value"),
             ({}, "give one of lengths or offsets"),
             ({"indices": np.array([0, 1])}, "indices based reduction is not supported"),
             ({"lengths": np.array([2.0, 4.0])}, "lengths must be int32/int64 of rank axis \\+ 1 = 1")]
    for kw, match in cases:
        with pytest.raises(gc.CaptureError, match=match):
            gc.capture(lambda d, kw=kw: gc.segment_reduce(d, "sum", **kw), d=d)
    with pytest.raises(gc.CaptureError, match="reduce must be one of sum, prod, mean"):
        gc.capture(lambda d: gc.segment_reduce(d, "any", lengths=np.array([6])), d=d)


# -- binomial -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_binomial_draws_have_the_binomial_moments_and_support(backend):
    count = np.array([0.0, 1.0, 5.0, 20.0], np.float32)
    prob = np.array([0.3, 0.5, 0.9, 0.25], np.float32)
    model = gc.capture(lambda p: gc.binomial(gc.tensor(count), p), p=prob, seed=3)
    session = gc.Session(model, backend=backend)
    draws = np.stack([session.run({"p": prob})["output"] for _ in range(4000)])
    assert draws.dtype == np.float32 and np.all(draws == np.round(draws))
    assert np.all(draws >= 0) and np.all(draws <= count)
    mean, var = count * prob, count * prob * (1 - prob)
    within = 5 * np.sqrt(var / len(draws)) + 1e-9  # 5 standard errors of the mean
    assert np.all(np.abs(draws.mean(0) - mean) <= within), (draws.mean(0), mean)
    np.testing.assert_allclose(draws.var(0), var, rtol=0.1, atol=1e-9)
    # torch's draws, for the same moments
    t = torch.binomial(torch.from_numpy(count).expand(4000, 4), torch.from_numpy(prob).expand(4000, 4)).numpy()
    assert np.all(np.abs(t.mean(0) - mean) <= within), (t.mean(0), mean)


def test_binomial_errors_name_the_arguments():
    with pytest.raises(gc.CaptureError, match="count and prob must be floating point of one dtype, got float64 and"
                                              " float32"):
        gc.capture(lambda p: gc.binomial(gc.tensor(np.ones(2)), p), p=np.ones(2, np.float32))


# -- functional recurrent cells and convolutions ------------------------------------------------------

@pytest.mark.parametrize("name,gates", [("rnn_tanh_cell", 1), ("rnn_relu_cell", 1), ("gru_cell", 3), ("lstm_cell", 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_functional_cells_match_torch(name, gates, bias):
    r = rng(26)
    x, h, c = r.standard_normal((3, 4)), r.standard_normal((3, 5)), r.standard_normal((3, 5))
    w_ih, w_hh = r.standard_normal((gates * 5, 4)) * 0.5, r.standard_normal((gates * 5, 5)) * 0.5
    b_ih, b_hh = r.standard_normal(gates * 5), r.standard_normal(gates * 5)
    params = [x, h, w_ih, w_hh] + ([b_ih, b_hh] if bias else []) + ([c] if name == "lstm_cell" else [])

    def fn(M, x, h, w_ih, w_hh, *rest):
        cell, biases = getattr(G(M), name), rest[:2] if bias else ()
        if name == "lstm_cell":
            h2, c2 = cell(x, (h, rest[-1]), w_ih, w_hh, *biases)
            return h2 * 2 + c2
        return cell(x, h, w_ih, w_hh, *biases)

    assert_matches_torch(fn, params, {}, r)


def test_functional_cells_errors_name_the_weight():
    with pytest.raises(gc.CaptureError, match=r"w_ih must be \[4 \* hidden, 3\]"):
        gc.capture(lambda x, h, w: gc.lstm_cell(x, (h, h), w, np.ones((20, 5))), x=np.ones((2, 3)), h=np.ones((2, 5)),
                   w=np.ones((20, 4)))
    with pytest.raises(gc.CaptureError, match="hx must be a pair"):
        gc.capture(lambda x, h: gc.lstm_cell(x, h, np.ones((20, 3)), np.ones((20, 5))), x=np.ones((2, 3)),
                   h=np.ones((2, 5)))


CONVS = [((2, 4, 9), (6, 2, 3), {"stride": [2], "padding": [1], "dilation": [1], "transposed": False, "output_padding": [0],
                                     "groups": 2}),
         ((1, 2, 6, 5), (4, 2, 3, 2), {"stride": [1, 2], "padding": [1, 0], "dilation": [2, 1], "transposed": False,
                                           "output_padding": [0, 0], "groups": 1}),
         ((1, 2, 4, 3, 3), (2, 2, 2, 2, 2), {"stride": [1, 1, 1], "padding": [0, 1, 0], "dilation": [1, 1, 1],
                                                 "transposed": False, "output_padding": [0, 0, 0], "groups": 1}),
         ((2, 4, 5), (4, 3, 3), {"stride": [2], "padding": [1], "dilation": [1], "transposed": True, "output_padding": [1],
                                     "groups": 1}),
         ((1, 4, 3, 4), (4, 1, 2, 3), {"stride": [2, 1], "padding": [0, 1], "dilation": [1, 1], "transposed": True,
                                           "output_padding": [1, 0], "groups": 2})]


@pytest.mark.parametrize("xs,ws,kw", CONVS)
def test_convolution_matches_torch(xs, ws, kw):
    r = rng(27)
    x, w = r.standard_normal(xs).astype(np.float32), r.standard_normal(ws).astype(np.float32)
    out_channels = ws[0] if not kw["transposed"] else ws[1] * kw["groups"]
    b = r.standard_normal(out_channels).astype(np.float32)
    assert_matches_torch(lambda M, x, w, b: G(M).convolution(x, w, b, **kw), [x, w, b], {}, r)
    assert_matches_torch(lambda M, x, w: G(M).convolution(x, w, None, **kw), [x, w], {}, r)


def test_convolution_errors():
    with pytest.raises(gc.CaptureError, match=r"input must be batched \(N, C, \*spatial\) with 1 to 3 spatial dims"):
        gc.capture(lambda x: gc.convolution(x, np.ones((1, 1)), None, [1], [0], [1], False, [0], 1), x=np.ones((2, 3)))
    with pytest.raises(gc.CaptureError, match="output_padding is for transposed convolutions only"):
        gc.capture(lambda x: gc.convolution(x, np.ones((1, 1, 1)), None, [1], [0], [1], False, [1], 1),
                   x=np.ones((1, 1, 3)))


@pytest.mark.parametrize("pad", [0, 1, 2])
def test_conv_tbc_matches_torch(pad):
    r = rng(28)
    x, w, b = (r.standard_normal(s).astype(np.float32) for s in ((7, 2, 3), (3, 3, 4), (4,)))
    assert_matches_torch(lambda M, x, w, b: G(M).conv_tbc(x, w, b, pad), [x, w, b], {}, r)


# -- grad mode ----------------------------------------------------------------------------------------

def _grad_of(fn):
    """d sum(fn(w, x)) / d w for ``w`` a parameter (gc.grad) and the same in torch (w = x = 1.5)."""
    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(np.array([1.5]), dtype="float64")

        def forward(self, x):
            return gc.sum(fn(gc, self.w, x))

    model = gc.grad(gc.capture(Net(), x=np.array([1.5])), "output")
    got = {b: gc.Session(model, backend=b).run({"x": np.array([1.5])})["w_grad"][0] for b in ("numpy", "ort-cpu")}
    w = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
    out = fn(torch, w, torch.tensor([1.5], dtype=torch.float64))
    out.sum().backward() if out.requires_grad else None
    want = 0.0 if w.grad is None else w.grad.item()
    assert got["numpy"] == got["ort-cpu"]
    return got["numpy"], want


def _switches(M, w, x):
    with M.set_grad_enabled(False):
        a = w * x  # no gradient
        with M.enable_grad():
            b = w * w  # gradient 2w
        c = a * w  # none
    d = w * 3.0  # 3
    return a + b + c + d


def _function_form(M, w, x):
    M.set_grad_enabled(False)
    a = w * w
    M.set_grad_enabled(True)
    return a + w * x


def _inference(M, w, x):
    with M.inference_mode():
        a = w * w
    with M.inference_mode(False):
        b = w * x
    return a + b


@pytest.mark.parametrize("fn,expected", [(_switches, 2 * 1.5 + 3.0), (_function_form, 1.5), (_inference, 1.5)])
def test_grad_mode_switches_match_torch(fn, expected):
    got, want = _grad_of(fn)
    assert got == pytest.approx(want) and want == pytest.approx(expected)


def test_is_grad_enabled_follows_the_blocks_in_and_out_of_a_capture():
    seen = []

    def fn(x):
        seen.append(gc.is_grad_enabled())
        with gc.no_grad():
            seen.append(gc.is_grad_enabled())
            with gc.enable_grad():
                seen.append(gc.is_grad_enabled())
        with gc.set_grad_enabled(False):
            seen.append(gc.is_grad_enabled())
        with gc.inference_mode():
            seen.append(gc.is_grad_enabled())
        seen.append(gc.is_grad_enabled())
        return x

    gc.capture(fn, x=np.zeros(1))
    assert seen == [True, False, True, False, False, True]
    with gc.no_grad():
        assert not gc.is_grad_enabled()
    assert gc.is_grad_enabled()
    gc.set_grad_enabled(False)
    assert not gc.is_grad_enabled()
    gc.set_grad_enabled(True)
    assert gc.is_grad_enabled()
    with pytest.raises(gc.CaptureError, match="set_grad_enabled: mode must be a bool, got int 1"):
        gc.set_grad_enabled(1)


# -- fractional max pooling -------------------------------------------------------------------------

FRACTIONAL = [(2, (2, 3, 9, 8), (2, 3), {"output_size": (4, 3)}),
              (2, (3, 7, 7), 2, {"output_size": 5}),
              (2, (2, 2, 10, 6), 3, {"output_ratio": (0.5, 0.6)}),
              (2, (1, 1, 5, 5), 2, {"output_size": (1, 4)}),
              (3, (1, 2, 6, 7, 5), 2, {"output_size": (3, 4, 2)}),
              (3, (2, 5, 6, 4), (2, 1, 2), {"output_ratio": 0.5})]


@pytest.mark.parametrize("nd,shape,kernel,kw", FRACTIONAL)
def test_fractional_max_pool_with_torchs_samples_matches_torch(nd, shape, kernel, kw):
    r = rng(29)
    x = r.standard_normal(shape)
    batch = shape[0] if len(shape) == nd + 2 else 1
    u = r.random((batch, shape[-nd - 1], nd))
    name = f"fractional_max_pool{nd}d"
    assert_matches_torch(lambda M, x, u: getattr(M, name)(x, kernel, **kw, _random_samples=u), [x], {"u": u}, r)
    want = getattr(torch.nn.functional, name)(torch.from_numpy(x), kernel, **kw, return_indices=True,
                                              _random_samples=torch.from_numpy(u))[1].numpy()
    got = run(lambda x, u: getattr(F, f"{name}_with_indices")(x, kernel, **kw, _random_samples=u), x=x, u=u)
    assert got["output_1"].dtype == want.dtype
    np.testing.assert_array_equal(got["output_1"], want)


def test_fractional_max_pool_picks_a_nan_and_the_first_of_ties_as_torch():
    x = np.zeros((1, 1, 6, 6), np.float32)
    x[0, 0, 1, 1] = x[0, 0, 3, 4] = np.nan
    u = np.array([[[0.3, 0.7]]], np.float32)
    kw = {"output_size": (3, 3), "return_indices": True}
    out, idx = torch.nn.functional.fractional_max_pool2d(torch.from_numpy(x), 2, **kw,
                                                         _random_samples=torch.from_numpy(u))
    got = run(lambda x, u: F.fractional_max_pool2d(x, 2, **kw, _random_samples=u), x=x, u=u)
    np.testing.assert_array_equal(got["output_0"], out.numpy())
    np.testing.assert_array_equal(got["output_1"], idx.numpy())


def test_fractional_max_pool_module_matches_torch_with_fixed_samples():
    x = rng(30).standard_normal((2, 3, 8, 8)).astype(np.float32)
    u = rng(31).random((2, 3, 2)).astype(np.float32)
    layer = gc.nn.FractionalMaxPool2d(3, output_size=(4, 5), _random_samples=u)
    twin = torch.nn.FractionalMaxPool2d(3, output_size=(4, 5), _random_samples=torch.from_numpy(u))
    assert_module_matches_torch(layer, twin, x, batched=False)
    x3 = rng(32).standard_normal((1, 2, 5, 6, 4)).astype(np.float32)
    u3 = rng(33).random((1, 2, 3)).astype(np.float32)
    layer = gc.nn.FractionalMaxPool3d(2, output_ratio=0.5, return_indices=True, _random_samples=u3)
    want = torch.nn.FractionalMaxPool3d(2, output_ratio=0.5, return_indices=True,
                                        _random_samples=torch.from_numpy(u3))(torch.from_numpy(x3))
    got = run(layer, x=x3)
    np.testing.assert_array_equal(got["output_0"], want[0].numpy())
    np.testing.assert_array_equal(got["output_1"], want[1].numpy())


def _torch_starts(u: float, size: int, out: int, k: int) -> list[int]:
    """torch's window starts for one sample ``u`` (float32 arithmetic, as its CPU kernel for float)."""
    alpha = np.float32(size - k) / np.float32(out - 1)
    u = np.float32(u)
    return [int(np.float32((np.float32(i) + u) * alpha)) - int(np.float32(u * alpha)) for i in range(out - 1)] + [
        size - k]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_fractional_max_pool_random_regions_follow_torchs_distribution(backend):
    """With ``x`` increasing along W, each output is its window's last column: the starts. Over many runs
    their patterns must be torch's for some uniform sample, with the frequencies those samples give."""
    size, out, k, runs = 11, 4, 2, 3000
    x = np.tile(np.arange(size, dtype=np.float32), (1, 1, 1, 1))
    model = gc.capture(gc.nn.FractionalMaxPool2d((1, k), output_size=(1, out)), x=x, seed=5)
    session = gc.Session(model, backend=backend)
    seen = [tuple(int(v) - (k - 1) for v in session.run({"x": x})["output"].ravel()) for _ in range(runs)]
    grid = np.linspace(0, 1, 20001)[:-1] + 0.5 / 20000
    expected: dict[tuple, float] = {}
    for u in grid:
        key = tuple(_torch_starts(u, size, out, k))
        expected[key] = expected.get(key, 0) + 1 / len(grid)
    counts = {key: seen.count(key) for key in set(seen)}
    assert set(counts) <= set(expected), set(counts) - set(expected)
    for key, p in expected.items():  # each pattern's frequency within 5 binomial standard deviations
        assert abs(counts.get(key, 0) / runs - p) <= 5 * np.sqrt(p * (1 - p) / runs) + 1e-3, (key, p)


@pytest.mark.parametrize("output_size", [(1, 3), (3, 1)])
def test_fractional_max_pool_random_regions_on_a_symbolic_batch(output_size):
    x = rng(38).standard_normal((3, 2, 7, 6)).astype(np.float32)
    model = gc.capture(gc.nn.FractionalMaxPool2d(2, output_size=output_size), x=gc.spec("float32", ("N", 2, 7, 6)))
    check(model)
    windows = np.lib.stride_tricks.sliding_window_view(x, (2, 2), axis=(2, 3)).max((-1, -2))  # every 2x2 max
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": x})["output"]
        assert out.shape == (3, 2, *output_size)
        for n, c in np.ndindex(3, 2):
            assert np.isin(out[n, c], windows[n, c]).all()


def test_fractional_max_pool_errors_name_the_argument():
    x = np.ones((1, 1, 5, 5), np.float32)
    with pytest.raises(gc.CaptureError, match="requires exactly one of output_size and output_ratio"):
        gc.nn.FractionalMaxPool2d(2)
    with pytest.raises(gc.CaptureError, match="output_ratio must be between 0 and 1"):
        gc.nn.FractionalMaxPool2d(2, output_ratio=1.5)
    with pytest.raises(gc.CaptureError, match=r"too large for input size \[5, 5\]"):
        gc.capture(lambda x: F.fractional_max_pool2d(x, 3, output_size=4), x=x)
    with pytest.raises(gc.CaptureError, match=r"_random_samples must be float32 \(N, 1, 2\)"):
        gc.capture(lambda x: F.fractional_max_pool2d(x, 2, output_size=3, _random_samples=np.ones((1, 1, 3),
                                                                                                 np.float32)), x=x)


# -- gc.nn's remaining names ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 2), (2, 3, 2, 2, 2)])
def test_sync_batch_norm_is_batch_norm_over_the_batch(shape):
    import torch.nn as tnn

    from tests.torch_grad_util import torch_twin

    layer, twin = torch_twin("SyncBatchNorm(3, momentum=0.2)")
    assert isinstance(twin, tnn.SyncBatchNorm)
    x = rng(34).standard_normal(shape).astype(np.float32)
    assert_module_matches_torch(layer.train(), twin.train(), x, batched=False)
    with pytest.raises(gc.CaptureError, match=r"expects a \(N, C, \*\) \(at least 2-D\) input, got rank 1"):
        gc.capture(gc.nn.SyncBatchNorm(3), x=np.ones(3, np.float32))


def test_convert_sync_batchnorm_replaces_every_batchnorm_as_torchs():
    def build(nn):
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Sequential(nn.Flatten(), nn.BatchNorm1d(16, affine=False, momentum=None)))

    net = build(gc.nn).train()
    net.init_parameters(seed=3)
    bn = net[1]
    converted = gc.nn.SyncBatchNorm.convert_sync_batchnorm(net)
    twin = torch.nn.SyncBatchNorm.convert_sync_batchnorm(build(torch.nn).train())
    assert converted is net  # a container keeps its identity, its children are replaced
    got_types = [(name, type(m).__name__, m.training) for name, m in converted.named_modules()]
    want_types = [(name, type(m).__name__, m.training) for name, m in twin.named_modules()]
    assert got_types == want_types
    assert converted[1]._parameters["weight"] is bn._parameters["weight"]  # the same objects, as torch's
    assert converted[1]._parameters["running_var"] is bn._parameters["running_var"]
    assert list(converted.state_dict()) == list(twin.state_dict())
    assert converted[3][1].weight is None and converted[3][1].momentum is None
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in converted.state_dict().items()})
    x = rng(38).standard_normal((6, 3, 4, 4)).astype(np.float32)
    assert_module_matches_torch(converted, twin, x, batched=False, rtol=1e-4)  # float32 through two batch norms
    lone = gc.nn.SyncBatchNorm.convert_sync_batchnorm(gc.nn.BatchNorm1d(5, eps=1e-3).eval())
    assert type(lone) is gc.nn.SyncBatchNorm and lone.eps == 1e-3 and not lone.training


@pytest.mark.parametrize("size", [1, 2, 3, 5, 9])
def test_cross_map_lrn2d_matches_torch_forward_and_its_derivative(size):
    x = rng(35).standard_normal((2, 7, 3, 4))
    want = torch.nn.CrossMapLRN2d(size, 0.5, 0.75, 1.5)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(gc.nn.CrossMapLRN2d(size, 0.5, 0.75, 1.5), x=x)["output"], want, rtol=1e-12)
    # torch's legacy backward is not its forward's derivative (its channel-0 quirk): central differences
    assert_grads_match_central_differences(lambda m, x: m(x), x, module=gc.nn.CrossMapLRN2d(size, 0.5, 0.75, 1.5))
    with pytest.raises(gc.CaptureError, match=r"expects a 4-D input \(N, C, H, W\)"):
        gc.capture(gc.nn.CrossMapLRN2d(3), x=np.ones((2, 3, 4)))


def test_nll_loss_2d_matches_torch():
    x = rng(36).standard_normal((2, 4, 3, 3))
    t = rng(37).integers(0, 4, (2, 3, 3))
    want = torch.nn.NLLLoss2d()(torch.from_numpy(x), torch.from_numpy(t)).numpy()
    np.testing.assert_allclose(run(lambda x, t: gc.nn.NLLLoss2d()(x, t), x=x, t=t)["output"], want, rtol=1e-12)
    got = gc_grads(lambda m, x, t: m(x, t), {"x": x}, {"t": t}, np.array(1.0), module=gc.nn.NLLLoss2d())
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.NLLLoss2d()(xt, torch.from_numpy(t)).backward()
    np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-12)


def test_recurrent_base_classes_hold_for_isinstance_as_torchs():
    for layer, base in ((gc.nn.LSTM(2, 3), "RNNBase"), (gc.nn.GRU(2, 3), "RNNBase"), (gc.nn.RNN(2, 3), "RNNBase"),
                        (gc.nn.LSTMCell(2, 3), "RNNCellBase"), (gc.nn.GRUCell(2, 3), "RNNCellBase"),
                        (gc.nn.RNNCell(2, 3), "RNNCellBase")):
        twin = getattr(torch.nn, type(layer).__name__)(2, 3)
        assert isinstance(layer, getattr(gc.nn, base)) and isinstance(twin, getattr(torch.nn, base))
    assert not isinstance(gc.nn.LSTM(2, 3), gc.nn.RNNCellBase) and not isinstance(torch.nn.LSTM(2, 3),
                                                                                   torch.nn.RNNCellBase)
