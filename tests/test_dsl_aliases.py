"""torch's top-level aliases, in-place ``_`` forms, ``*_copy`` functions and simple Tensor methods
(graphc/dsl/ops_aliases.py) against torch: values on the numpy and ort-cpu backends (models through
the full ONNX checker), gradients against torch.autograd, float64 central differences for the
multi-op lowerings, writes reaching the base as torch's, and the errors for what torch refuses."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(7)


def _r(*shape):
    return R.standard_normal(shape)


X3, Y3, Z3 = _r(2, 4, 5), _r(2, 4, 5), _r(2, 4, 5)
A2, B2 = _r(4, 3), _r(4, 3)
LOGP = np.log(np.random.default_rng(1).dirichlet(np.ones(5), size=(2, 4)))
SIGNS = np.where(_r(4) > 0, 1.0, -1.0)
RM, RV = _r(4), np.abs(_r(4)) + 0.5
GRID = np.random.default_rng(3).uniform(-1.2, 1.2, (2, 3, 4, 2))
THETA = _r(2, 2, 3)
CTC_LP = np.log(np.random.default_rng(4).dirichlet(np.ones(4), size=(6, 2)))
CTC_T = np.array([[1, 2, 1], [3, 1, 0]])

# (id, fn(M, *params, **inputs) with M gc or torch, params (differentiated), inputs): values, then gradients
CASES = [
    ("group_norm", lambda M, x, w, b: M.group_norm(x, 2, w, b, 1e-5, True), [X3, _r(4), _r(4)], {}),
    ("instance_norm_own_stats", lambda M, x, w, b: M.instance_norm(x, w, b, None, None, True, 0.1, 1e-5, False),
     [X3, _r(4), _r(4)], {}),
    ("instance_norm_running", lambda M, x, w, b, rm, rv: M.instance_norm(x, w, b, rm, rv, False, 0.1, 1e-5, False),
     [X3, _r(4), _r(4)], {"rm": RM, "rv": RV}),
    ("kl_div_mean", lambda M, x, t: M.kl_div(x, t, 1), [LOGP, np.exp(LOGP[::-1].copy())], {}),
    ("kl_div_sum_log_target", lambda M, x, t: M.kl_div(x, t, 2, log_target=True), [LOGP, LOGP[::-1].copy()], {}),
    ("kl_div_none", lambda M, x, t: M.kl_div(x, t, 0), [LOGP, np.exp(LOGP)], {}),
    ("bce_with_logits", lambda M, x, y, w, pw: M.binary_cross_entropy_with_logits(x, y, w, pw, 2),
     [A2], {"y": (A2 > 0).astype(np.float64), "w": np.abs(_r(3)), "pw": np.abs(_r(3)) + 0.5}),
    ("cosine_embedding_loss", lambda M, a, b, t: M.cosine_embedding_loss(a, b, t, 0.1, 0), [A2, B2], {"t": SIGNS}),
    ("hinge_embedding_loss", lambda M, a, t: M.hinge_embedding_loss(a, t, 1.0, 2), [A2], {"t": SIGNS[:, None]}),
    ("margin_ranking_loss", lambda M, a, b, t: M.margin_ranking_loss(a, b, t, 0.2, 1), [A2[:, 0], B2[:, 0]],
     {"t": SIGNS}),
    ("triplet_margin_loss", lambda M, a, p, n: M.triplet_margin_loss(a, p, n, 1.0, 2.0, 1e-6, True, 0),
     [A2, B2, _r(4, 3)], {}),
    ("poisson_nll_loss", lambda M, x, t: M.poisson_nll_loss(x, t, True, True, 1e-8, 1), [A2],
     {"t": np.abs(_r(4, 3)) * 3}),
    ("ctc_loss", lambda M, lp, t: M.ctc_loss(lp.log_softmax(-1), t, [6, 5], [3, 2], 0, 1, False), [CTC_LP],
     {"t": CTC_T}),
    ("adaptive_max_pool1d_values", lambda M, x: M.adaptive_max_pool1d(x, 3)[0], [_r(2, 4, 6)], {}),
    ("adaptive_max_pool1d_indices", lambda M, x: M.adaptive_max_pool1d(x, 3)[1], [_r(2, 4, 6)], {}),
    ("constant_pad_nd", lambda M, x: M.constant_pad_nd(x, [1, 2, 0, 1], 0.5), [X3], {}),
    ("grid_sampler_bilinear_border", lambda M, x, g: M.grid_sampler(x, g, 0, 1, False), [_r(2, 2, 4, 5), GRID], {}),
    ("grid_sampler_nearest_zeros", lambda M, x, g: M.grid_sampler(x, g, 1, 0, True), [_r(2, 2, 4, 5)], {"g": GRID}),
    ("grid_sampler_bicubic_reflection", lambda M, x, g: M.grid_sampler(x, g, 2, 2, False), [_r(2, 2, 4, 5), GRID],
     {}),
    ("affine_grid_generator", lambda M, t: M.affine_grid_generator(t, [2, 3, 4, 5], False), [THETA], {}),
    ("rsub_tensor_alpha", lambda M, x, y: M.rsub(x, y, alpha=2), [X3, Y3], {}),
    ("rsub_scalar", lambda M, x: M.rsub(x, 2.5), [X3], {}),
    ("rrelu_eval", lambda M, x: M.rrelu(x, 0.1, 0.3, False), [X3], {}),
    ("alpha_dropout_eval", lambda M, x: M.alpha_dropout(x, 0.3, False), [X3], {}),
    ("feature_alpha_dropout_eval", lambda M, x: M.feature_alpha_dropout(x, 0.3, train=False), [X3], {}),
    ("feature_dropout_eval", lambda M, x: M.feature_dropout(x, 0.5, False), [X3], {}),
    ("native_channel_shuffle", lambda M, x: M.native_channel_shuffle(x, 2), [X3], {}),
    ("conv1d", lambda M, x, w, b: M.conv1d(x, w, b, 2, 1), [X3, _r(3, 4, 2), _r(3)], {}),
    ("max_pool1d", lambda M, x: M.max_pool1d(x, 3, 2, 1, 1, True), [X3], {}),
    ("threshold", lambda M, x: M.threshold(x, 0.1, -2.0), [X3], {}),
    ("prelu", lambda M, x, w: M.prelu(x, w), [X3, _r(4)], {}),
    ("hardshrink", lambda M, x: M.hardshrink(x, 0.4), [X3], {}),
    ("fill", lambda M, x: M.fill(x, 1.5), [X3], {}),
    ("conj_physical", lambda M, x: M.conj_physical(x) * 2, [X3], {}),
    ("adjoint", lambda M, x: M.adjoint(x), [X3], {}),
    ("msort", lambda M, x: M.msort(x), [X3], {}),
    ("narrow_copy", lambda M, x: M.narrow_copy(x, 2, 1, 3), [X3], {}),
    ("ger", lambda M, u, v: M.ger(u, v), [_r(3), _r(4)], {}),
    # Tensor methods
    ("tile_method", lambda M, x: x.tile(2, 1), [X3], {}),
    ("tile_method_tuple", lambda M, x: x.tile((2,)), [X3], {}),
    ("clip_method", lambda M, x: x.clip(-0.5, 0.5), [X3], {}),
    ("mH", lambda M, x: x.mH, [X3], {}),
    ("H", lambda M, x: x.H, [A2], {}),
    ("adjoint_method", lambda M, x: x.adjoint(), [X3], {}),
    ("sum_to_size", lambda M, x: x.sum_to_size(4, 1), [X3], {}),
    ("sum_to_size_tuple", lambda M, x: x.sum_to_size((1, 4, 5)), [X3], {}),
    ("narrow_copy_method", lambda M, x: x.narrow_copy(1, 1, 2), [X3], {}),
    ("msort_method", lambda M, x: x.msort(), [X3], {}),
    ("prelu_method", lambda M, x, w: x.prelu(w), [X3, _r(1)], {}),
    ("real_method", lambda M, x: x.real * 2, [X3], {}),
    ("cpu_method", lambda M, x: x.cpu() * 2, [X3], {}),
]
# the *_copy functions: the view op's values, copied
COPIES = [
    ("alias_copy", lambda M, x: M.alias_copy(x)), ("detach_copy", lambda M, x: M.detach_copy(x)),
    ("diagonal_copy", lambda M, x: M.diagonal_copy(x, 1, 1, 2)), ("expand_copy", lambda M, x: M.expand_copy(
        x[:, :1], [2, 3, 5])), ("permute_copy", lambda M, x: M.permute_copy(x, [2, 0, 1])),
    ("select_copy", lambda M, x: M.select_copy(x, 1, -1)), ("slice_copy", lambda M, x: M.slice_copy(x, 2, 1, 5, 2)),
    ("split_copy", lambda M, x: M.split_copy(x, 3, 2)[1]),
    ("split_with_sizes_copy", lambda M, x: M.split_with_sizes_copy(x, [1, 3], 1)[1]),
    ("squeeze_copy", lambda M, x: M.squeeze_copy(x[:, :1], 1)), ("t_copy", lambda M, x: M.t_copy(x[0])),
    ("transpose_copy", lambda M, x: M.transpose_copy(x, 0, 2)), ("unbind_copy", lambda M, x: M.unbind_copy(x, 1)[2]),
    ("unsqueeze_copy", lambda M, x: M.unsqueeze_copy(x, 1)), ("view_copy", lambda M, x: M.view_copy(x, [8, 5])),
]
CASES += [(name, fn, [X3], {}) for name, fn in COPIES]


NO_TORCH_GRAD = {"native_channel_shuffle", "detach_copy"}  # torch has no derivative for these


def _torch_out(fn, params, inputs, c=None):
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    out = fn(torch, *ts, **{k: torch.tensor(v) for k, v in inputs.items()})
    if c is not None:
        (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), [None if t.grad is None else t.grad.numpy() for t in ts]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, fn, params, inputs", CASES, ids=[c[0] for c in CASES])
def test_values_match_torch(name, fn, params, inputs, dtype):
    params = [p.astype(dtype) for p in params]
    inputs = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    want = _torch_out(fn, params, inputs)[0]
    names = [f"p{i}" for i in range(len(params))]
    feeds = {**dict(zip(names, params)), **inputs}
    model = gc.capture(lambda **kw: fn(gc, *(kw.pop(n) for n in names), **kw), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, feeds)["output"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


GRAD_CASES = [c for c in CASES if not c[0].endswith("indices") and c[0] not in NO_TORCH_GRAD]


@pytest.mark.parametrize("name, fn, params, inputs", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_match_torch(name, fn, params, inputs):
    want, dparams = _torch_out(fn, params, inputs, c := R.standard_normal(_torch_out(fn, params, inputs)[0].shape))
    names = [f"p{i}" for i in range(len(params))]
    got = gc_grads(lambda M, *args, **kw: fn(gc, *args, **kw), dict(zip(names, params)), inputs, c)
    np.testing.assert_allclose(got["out"], want, rtol=1e-6, atol=1e-8)
    for n, dp in zip(names, dparams):
        np.testing.assert_allclose(got[n], 0 if dp is None else dp, rtol=1e-5, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("fn, x", [
    (lambda M, x: x.sum_to_size(4, 1) * x[0, :, :1], X3),
    (lambda M, x: gc.instance_norm(x, None, None, gc.ones(4, dtype="float64"), x[0, :, 0].abs() + 1, False, 0.1,
                                   1e-5, False), X3),
    (lambda M, x: gc.rsub(x, x * x, alpha=0.5), X3),
    (lambda M, x: gc.grid_sampler(x, x[:, :2, :, 3:].permute(0, 2, 3, 1).tanh(), 0, 2, True), _r(2, 4, 5, 5)),
], ids=["sum_to_size", "instance_norm_running", "rsub", "grid_sampler"])
def test_gradients_match_central_differences(fn, x):
    assert_grads_match_central_differences(fn, x)


# an alias is the function it names: the same object, or the same graph
SAME = ["conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cosine_similarity",
        "pixel_shuffle", "pixel_unshuffle", "prelu", "selu", "celu", "threshold", "rms_norm", "pairwise_distance",
        "pdist", "bilinear", "channel_shuffle", "native_channel_shuffle", "adaptive_avg_pool1d", "avg_pool1d",
        "max_pool1d", "max_pool1d_with_indices", "max_pool3d", "hardshrink"]


@pytest.mark.parametrize("name", SAME)
def test_alias_is_the_functional_function(name):
    assert getattr(gc, name) is getattr(F, name)


def _ops(fn, **feeds):
    return [n.op_type for n in gc.capture(fn, **feeds).proto.graph.node]


@pytest.mark.parametrize("alias, original", [
    (lambda x: gc.kl_div(x, x.exp(), 2), lambda x: F.kl_div(x, x.exp(), reduction="sum")),
    (lambda x: gc.group_norm(x, 2, None, None, 1e-3, False), lambda x: F.group_norm(x, 2, eps=1e-3)),
    (lambda x: gc.constant_pad_nd(x, [1, 1], 2.0), lambda x: F.pad(x, [1, 1], value=2.0)),
    (lambda x: gc.rsub(x, 3.0), lambda x: 3.0 - x),
    (lambda x: x.clip(0, 1), lambda x: x.clamp(0, 1)),
    (lambda x: x.mH, lambda x: x.mT),
    (lambda x: gc.view_copy(x, [20, 2]), lambda x: x.view(20, 2)),
    (lambda x: gc.msort(x), lambda x: x.sort(0)[0]),
    (lambda x: x.tile(2, 1), lambda x: gc.tile(x, [2, 1])),
], ids=["kl_div", "group_norm", "constant_pad_nd", "rsub", "clip", "mH", "view_copy", "msort", "tile"])
def test_alias_is_the_same_graph(alias, original):
    x = X3.astype(np.float32)
    assert _ops(alias, x=x) == _ops(original, x=x)


def test_symbolic_batch():
    def fn(x, y):
        return {"a": gc.rsub(x, y, alpha=2), "b": x.sum_to_size(4, 1), "c": gc.group_norm(x, 2),
                "d": gc.slice_copy(x, 2, 1, 4), "e": x.mH}
    model = gc.capture(fn, x=gc.spec("float32", ("N", 4, 5)), y=gc.spec("float32", ("N", 4, 5)))
    for n in (1, 3):
        x, y = _r(n, 4, 5).astype(np.float32), _r(n, 4, 5).astype(np.float32)
        got = run_both(model, {"x": x, "y": y})
        tx, ty = torch.tensor(x), torch.tensor(y)
        want = {"a": torch.rsub(tx, ty, alpha=2), "b": tx.sum_to_size(4, 1), "c": torch.group_norm(tx, 2),
                "d": torch.slice_copy(tx, 2, 1, 4), "e": tx.mH}
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


# (id, call(L, v, y, index) with L gc or torch, view): the in-place call on ``v``, which is ``t[1]`` (a view,
# so the write must reach ``t``) or ``t`` itself; ``t`` is returned and must equal torch's
INPLACE = [
    ("absolute_", lambda L, v, y, i: v.absolute_(), True),
    ("arccos_", lambda L, v, y, i: v.tanh_().arccos_(), True),
    ("arcsin_", lambda L, v, y, i: v.tanh_().arcsin_(), True),
    ("arctanh_", lambda L, v, y, i: v.tanh_().arctanh_(), True),
    ("arccosh_", lambda L, v, y, i: v.abs_().add_(1).arccosh_(), True),
    ("arcsinh_arctan_", lambda L, v, y, i: v.arcsinh_().arctan_(), True),
    ("arctan2_", lambda L, v, y, i: v.arctan2_(y[1]), True),
    ("negative_", lambda L, v, y, i: v.negative_(), True),
    ("multiply_", lambda L, v, y, i: v.multiply_(y[1]), True),
    ("subtract_", lambda L, v, y, i: v.subtract_(y[1], alpha=2), True),
    ("divide_", lambda L, v, y, i: v.divide_(y[1].abs() + 1), True),
    ("clip_", lambda L, v, y, i: v.clip_(-0.3, 0.3), True),
    ("addmm_", lambda L, v, y, i: v.addmm_(y[0, :, :3], y[1, :3, :]), True),
    ("addmv_", lambda L, v, y, i: (v[0].addmv_(y.flatten()[:20].view(5, 4), y[1, :, 0]), v)[1], True),  # view of a view
    ("addr_", lambda L, v, y, i: v.addr_(y[0, :, 0], y[0, 0, :]), True),
    ("addbmm_", lambda L, v, y, i: v.addbmm_(y[:, :, :3], y[:, :3, :]), True),
    ("baddbmm_", lambda L, v, y, i: v.baddbmm_(y[:, :, :4], y[:, :4, :]), False),
    ("index_put_", lambda L, v, y, i: v.index_put_((i,), y[1, 0]), True),
    ("conj_physical_", lambda L, v, y, i: v.conj_physical_(), True),
    ("eq_", lambda L, v, y, i: v.round_().eq_(y[1].round()), True),
    ("ne_not_equal_", lambda L, v, y, i: v.round_().ne_(0).not_equal_(y[1].round()), True),
    ("lt_less_", lambda L, v, y, i: v.lt_(y[1]).less_(0.5), True),
    ("le_less_equal_", lambda L, v, y, i: v.le_(y[1]).less_equal_(0), True),
    ("gt_greater_", lambda L, v, y, i: v.gt_(y[1]).greater_(0.5), True),
    ("ge_greater_equal_", lambda L, v, y, i: v.ge_(y[1]).greater_equal_(1), True),
    ("logical_", lambda L, v, y, i: v.logical_and_(y[1] > 0).logical_or_(y[0] > 1).logical_xor_(y[1]), True),
    ("logical_not_", lambda L, v, y, i: v.relu_().logical_not_(), True),
    ("transpose_", lambda L, v, y, i: v.transpose_(0, 2), False),
    ("swapaxes_swapdims_", lambda L, v, y, i: v.swapaxes_(0, 1).swapdims_(1, 2), False),
    ("detach_", lambda L, v, y, i: v.detach_(), False),
    # torch's top-level in-place functions
    ("torch.abs_", lambda L, v, y, i: L.abs_(v), True),
    ("torch.clamp_clip_", lambda L, v, y, i: L.clip_(L.clamp_(v, -0.5, 0.5), min=-0.2), True),
    ("torch.fill_", lambda L, v, y, i: L.fill_(v, 2.0), True),
    ("torch.zero_", lambda L, v, y, i: L.zero_(v), True),
    ("torch.xlogy_", lambda L, v, y, i: L.xlogy_(v, y[1].abs() + 0.5), True),
    ("torch.sigmoid_exp_", lambda L, v, y, i: L.exp_(L.sigmoid_(v)), True),
    ("torch.index_put_", lambda L, v, y, i: L.index_put_(v, (i,), y[1, 0], True), True),
    ("torch.conj_physical_", lambda L, v, y, i: L.conj_physical_(v), True),
    ("torch.relu_", lambda L, v, y, i: L.relu_(v), True),
    ("torch.selu_", lambda L, v, y, i: L.selu_(v), True),
    ("torch.celu_", lambda L, v, y, i: L.celu_(v, 0.5), True),
    ("torch.threshold_", lambda L, v, y, i: L.threshold_(v, 0.1, -1.0), True),
    ("torch.rrelu_", lambda L, v, y, i: L.rrelu_(v, 0.1, 0.3, False), True),
    ("torch.dropout_", lambda L, v, y, i: L.dropout_(v, 0.3, False), True),
    ("torch.alpha_dropout_", lambda L, v, y, i: L.alpha_dropout_(v, 0.3, False), True),
    ("torch.feature_dropout_", lambda L, v, y, i: L.feature_alpha_dropout_(L.feature_dropout_(v, 0.3, False), 0.2,
                                                                          False), False),
    ("torch.detach_", lambda L, v, y, i: L.detach_(v), False),
    ("torch.negative_neg_", lambda L, v, y, i: L.neg_(L.negative_(v)), True),
]


@pytest.mark.parametrize("call, view", [c[1:] for c in INPLACE], ids=[c[0] for c in INPLACE])
def test_in_place_writes_match_torch(call, view):
    def fn(L, x, y, index):
        t = x * 1
        v = t[1] if view else t
        result = call(L, v, y, index)
        assert result is v
        return t
    feeds = {"x": X3.astype(np.float32), "y": Y3.astype(np.float32), "index": np.array([0, 2])}
    want = fn(torch, *(torch.tensor(v) for v in feeds.values())).numpy()
    model = gc.capture(lambda x, y, index: fn(gc, x, y, index), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, feeds)["output"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call", [
    lambda L, v, y: v.gcd_(y[1]).lcm_(y[0]),
    lambda L, v, y: L.lcm_(L.gcd_(v, y[1]), y[0]),
    lambda L, v, y: v.bitwise_and_(y[1]).bitwise_or_(y[0]).bitwise_xor_(5).bitwise_not_(),
    lambda L, v, y: v.bitwise_left_shift_(2).bitwise_right_shift_(1),
    lambda L, v, y: v.eq_(y[1]),
], ids=["gcd_lcm_", "torch.gcd_lcm_", "bitwise_", "shifts_", "eq_int"])
def test_integer_in_place_writes_match_torch(call):
    def fn(L, x, y):
        t = x * 1
        v = t[1]
        assert call(L, v, y) is v
        return t
    rng = np.random.default_rng(5)
    feeds = {"x": rng.integers(-20, 20, (2, 4, 5)), "y": rng.integers(0, 20, (2, 4, 5))}
    want = fn(torch, *(torch.tensor(v) for v in feeds.values())).numpy()
    got = run_both(gc.capture(lambda x, y: fn(gc, x, y), **feeds), feeds)["output"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_float_power_in_place_on_float64_matches_torch():
    def fn(L, x):
        t = x * 1
        t[1].float_power_(2)
        return t
    x = X3.astype(np.float64)
    got = run_both(gc.capture(lambda x: fn(gc, x), x=x), {"x": x})["output"]
    np.testing.assert_allclose(got, fn(torch, torch.tensor(x)).numpy(), rtol=1e-12)


def test_copies_are_not_views():
    """A write into a ``*_copy``'s result leaves the input as it was, as torch's; into the view it reaches it."""
    def fn(L, x):
        t = x * 1
        L.select_copy(t, 0, 1).fill_(5.0)
        L.unbind_copy(t, 1)[0].zero_()
        t.narrow_copy(2, 0, 2).mul_(3)
        L.select(t, 2, 4).fill_(-1.0)
        return t
    x = X3.astype(np.float32)
    got = run_both(gc.capture(lambda x: fn(gc, x), x=x), {"x": x})["output"]
    np.testing.assert_array_equal(got, fn(torch, torch.tensor(x)).numpy())


def test_predicates_match_torch():
    """Python values at capture, each as torch's on the same Tensors."""
    def preds(L, x, y, i, b):
        return [L.is_same_size(x, y), x.is_same_size(x[0]), L.is_signed(x), i.is_signed(), b.is_signed(),
                L.is_conj(x), x.is_neg(), L.is_complex(x), L.conj(x) is x, L.resolve_conj(x) is x,
                L.resolve_neg(x) is x, x.real is x, x.is_contiguous(), x.transpose(0, 1).is_contiguous()]
    feeds = {"x": X3.astype(np.float32), "y": Y3.astype(np.float32), "i": np.ones(2, np.int8),
             "b": np.ones(2, np.uint8)}
    want = preds(torch, *(torch.tensor(v) for v in feeds.values()))
    got = []
    gc.capture(lambda x, y, i, b: got.extend(preds(gc, x, y, i, b)) or x, **feeds)
    assert got == want


# (id, fn(L, x), pattern naming what is wrong, whether torch refuses it too)
ERRORS = [
    ("kl_div_string_reduction", lambda L, x: L.kl_div(x, x, "mean"), r"kl_div reduction='mean': expected an int code",
     True),
    ("grid_sampler_mode", lambda L, x: L.grid_sampler(x[None], x[None, :, :, :2], 3, 0, False),
     r"grid_sampler interpolation_mode=3", False),
    ("imag", lambda L, x: L.imag(x), r"imag is not implemented for tensors with non-complex dtypes", True),
    ("H_3d", lambda L, x: x.H, r"tensor.H is only supported on matrices .* got a 3-D", True),
    ("adjoint_1d", lambda L, x: L.adjoint(x[0, 0]), r"only supported on matrices or batches of matrices, got a 1-D",
     True),
    ("sum_to_size", lambda L, x: x.sum_to_size(2, 4, 6), r"size \[2, 4, 6\] is not expandable", True),
    ("sum_to_size_none", lambda L, x: x.sum_to_size(), r"sum_to_size: expected a size .* got none", True),
    ("float_power_float32", lambda L, x: (x * 1).float_power_(2), r"dtype float64 is not the written tensor's float32",
     True),
    ("detach_view", lambda L, x: (x * 1)[0].detach_(), r"detach_ of .*a view", True),
    ("transpose_view", lambda L, x: (x * 1)[0].transpose_(0, 1), r"shape-changing in-place method", False),
    ("torch_level_non_tensor", lambda L, x: L.abs_(np.ones(3, np.float32)), r"abs_ takes a Tensor input, got ndarray",
     True),
    ("rsub_non_tensor", lambda L, x: L.rsub(2.0, x), r"rsub takes a Tensor input, got float", True),
    ("requires_grad_false", lambda L, x: x.requires_grad_(False),
     r"requires_grad_\(False\) on .*no autograd flags.*gc.grad", False),
    ("rrelu_generator", lambda L, x: L.rrelu(x, 0.1, 0.3, True, L.Generator() if L is torch else object()),
     r"rrelu generator=.*pass None", False),
    ("instance_norm_running_update", lambda L, x: L.instance_norm(x, None, None, x[0, :, 0], x[0, :, 0], True, 0.1,
                                                                 1e-5, False), r"running_mean/running_var", False),
]


@pytest.mark.parametrize("fn, pattern, torch_refuses", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(fn, pattern, torch_refuses):
    x = X3.astype(np.float32)
    if torch_refuses:
        with pytest.raises((RuntimeError, TypeError, ValueError, NotImplementedError)):
            fn(torch, torch.tensor(x))
    with pytest.raises(gc.CaptureError, match=pattern) as info:
        gc.capture(lambda x: fn(gc, x), x=x)
    assert "test_dsl_aliases.py:" in str(info.value)
