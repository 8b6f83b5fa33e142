"""gc.nn's PoissonNLLLoss ... TripletMarginWithDistanceLoss and their functional forms against
torch (values and gradients for every reduction; float64 on the numpy backend, float32 on
ort-cpu), against float64 central finite differences, as modules (torch's state_dict keys,
symbolic batch, onnx.checker) and their errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

try:
    from torch_grad_util import assert_directional_derivatives, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_directional_derivatives, gc_grads, run_both

R = np.random.default_rng(47)
REDUCTIONS = ("none", "mean", "sum")


def _normal(*shapes):
    return [R.standard_normal(s) for s in shapes]


def _signs(shape):
    return R.choice([-1.0, 1.0], shape)


def _counts(shape=(5, 4)):
    return [R.standard_normal(shape), R.poisson(2.0, shape).astype(np.float64)]


def _multilabel_targets():
    """int64 class lists ending at their first negative (a duplicate, an empty row, a full one)."""
    return np.array([[3, 0, -1, 1, 2], [4, 4, 1, -1, -1], [-1, 0, 1, 2, 3], [0, 1, 2, 3, 4]], np.int64)


def _sq_dist(a, b):
    d = a - b
    return (d * d).sum(-1)


# (id, f(M, reduction, *xs) on the functional namespace M, make() -> xs, the inputs differentiated,
#  those checked by finite differences when not all of them)
CASES = [
    ("poisson", lambda M, r, x, t: M.poisson_nll_loss(x, t, reduction=r), _counts, (0, 1)),
    ("poisson_full", lambda M, r, x, t: M.poisson_nll_loss(x, t, full=True, reduction=r),
     lambda: [R.standard_normal((5, 4)), R.poisson(2.0, (5, 4)) + R.uniform(0.1, 0.4, (5, 4))], (0, 1)),  # none at 1
    ("poisson_rate", lambda M, r, x, t: M.poisson_nll_loss(x, t, log_input=False, eps=1e-3, full=True, reduction=r),
     lambda: [R.uniform(0.2, 3.0, (4, 3)), R.poisson(1.5, (4, 3)).astype(np.float64)], (0,)),  # t = 0: torch: nan
    ("gaussian", lambda M, r, x, t, v: M.gaussian_nll_loss(x, t, v, reduction=r),
     lambda: [*_normal((5, 3), (5, 3)), R.uniform(0.1, 2.0, (5, 3))], (0, 1, 2)),
    ("gaussian_full_homoscedastic", lambda M, r, x, t, v: M.gaussian_nll_loss(x, t, v, full=True, reduction=r),
     lambda: [*_normal((4, 2, 3), (4, 2, 3)), R.uniform(0.1, 2.0, (4, 2))], (0, 2)),
    ("gaussian_var_dim1", lambda M, r, x, t, v: M.gaussian_nll_loss(x, t, v, eps=1e-3, reduction=r),
     lambda: [*_normal((3, 4, 2), (3, 4, 2)), R.uniform(0.1, 2.0, (3, 1, 2))], (0, 1, 2)),
    ("gaussian_float_var", lambda M, r, x, t: M.gaussian_nll_loss(x, t, 0.7, reduction=r),
     lambda: _normal((6,), (6,)), (0, 1)),
    ("gaussian_clamped", lambda M, r, x, t, v: M.gaussian_nll_loss(x, t, v, eps=0.05, reduction=r),
     lambda: [*_normal((4, 3), (4, 3)), R.uniform(0.0, 0.1, (4, 3))], (0, 2), (0,)),  # var's slope: straight through
    ("cosine", lambda M, r, a, b, y: M.cosine_embedding_loss(a, b, y, reduction=r),
     lambda: [*_normal((6, 4), (6, 4)), _signs(6)], (0, 1)),
    ("cosine_margin_broadcast", lambda M, r, a, b, y: M.cosine_embedding_loss(a, b, y, margin=-0.2, reduction=r),
     lambda: [*_normal((6, 4), (1, 4)), _signs(6)], (0, 1)),
    ("cosine_unbatched", lambda M, r, a, b, y: M.cosine_embedding_loss(a, b, y, margin=0.1, reduction=r),
     lambda: [*_normal((5,), (5,)), np.array(-1.0)], (0, 1)),
    ("ranking", lambda M, r, a, b, y: M.margin_ranking_loss(a, b, y, margin=0.3, reduction=r),
     lambda: [*_normal((7,), (7,)), _signs(7)], (0, 1)),
    ("ranking_2d", lambda M, r, a, b, y: M.margin_ranking_loss(a, b, y, reduction=r),
     lambda: [*_normal((3, 4), (3, 4)), _signs((3, 4))], (0, 1, 2)),
    ("hinge", lambda M, r, x, y: M.hinge_embedding_loss(x, y, reduction=r),
     lambda: [R.standard_normal((5, 3)) * 1.5, _signs((5, 3))], (0,)),
    ("hinge_margin", lambda M, r, x, y: M.hinge_embedding_loss(x, y, margin=0.4, reduction=r),
     lambda: [R.standard_normal(8), _signs(8)], (0,)),
    ("soft_margin", lambda M, r, x, y: M.soft_margin_loss(x, y, reduction=r),
     lambda: [R.standard_normal((4, 5)) * 2, _signs((4, 5))], (0,)),
    ("multilabel_soft", lambda M, r, x, y: M.multilabel_soft_margin_loss(x, y, reduction=r),
     lambda: [R.standard_normal((5, 4)) * 2, R.integers(0, 2, (5, 4)) * 1.0], (0, 1)),
    ("multilabel_soft_weight", lambda M, r, x, y, w: M.multilabel_soft_margin_loss(x, y, w, reduction=r),
     lambda: [R.standard_normal((5, 4)) * 2, R.uniform(0, 1, (5, 4)), R.uniform(0.2, 2.0, 4)], (0, 1)),
    ("multilabel_margin", lambda M, r, x, y: M.multilabel_margin_loss(x, y, reduction=r),
     lambda: [R.standard_normal((4, 5)), _multilabel_targets()], (0,)),
    ("multilabel_margin_unbatched", lambda M, r, x, y: M.multilabel_margin_loss(x, y, reduction=r),
     lambda: [R.standard_normal(5), _multilabel_targets()[1]], (0,)),
    ("multi_margin", lambda M, r, x, y: M.multi_margin_loss(x, y, reduction=r),
     lambda: [R.standard_normal((6, 4)), R.integers(0, 4, 6)], (0,)),
    ("multi_margin_p2_weight", lambda M, r, x, y, w: M.multi_margin_loss(x, y, 2, 0.7, w, reduction=r),
     lambda: [R.standard_normal((6, 4)), R.integers(0, 4, 6), R.uniform(0.2, 2.0, 4)], (0,)),
    ("multi_margin_unbatched", lambda M, r, x, y: M.multi_margin_loss(x, y, margin=1.5, reduction=r),
     lambda: [R.standard_normal(4), np.array(2)], (0,)),
    ("triplet", lambda M, r, a, p, n: M.triplet_margin_loss(a, p, n, reduction=r),
     lambda: _normal((5, 4), (5, 4), (5, 4)), (0, 1, 2)),
    ("triplet_p1_swap", lambda M, r, a, p, n: M.triplet_margin_loss(a, p, n, 0.5, 1, swap=True, reduction=r),
     lambda: _normal((6, 3), (6, 3), (6, 3)), (0, 1, 2)),
    ("triplet_p3_unbatched", lambda M, r, a, p, n: M.triplet_margin_loss(a, p, n, 2.0, 3.0, 1e-3, reduction=r),
     lambda: _normal((4,), (4,), (4,)), (0, 1, 2)),
    ("triplet_distance", lambda M, r, a, p, n: M.triplet_margin_with_distance_loss(a, p, n, reduction=r),
     lambda: _normal((5, 4), (5, 4), (5, 4)), (0, 1, 2)),
    ("triplet_distance_fn_swap", lambda M, r, a, p, n: M.triplet_margin_with_distance_loss(
        a, p, n, distance_function=_sq_dist, margin=2.0, swap=True, reduction=r),
     lambda: _normal((6, 3), (6, 3), (6, 3)), (0, 1, 2)),
]
FULL = [(*c, r) for c in CASES for r in REDUCTIONS]
IDS = [f"{c[0]}-{c[-1]}" for c in FULL]


def _torch_run(torch, fn, reduction, xs, wrt, c):
    """torch's value of ``fn`` and the gradients of sum(fn * c) for the inputs in ``wrt``."""
    ts = [torch.tensor(x, requires_grad=i in wrt) for i, x in enumerate(xs)]
    out = fn(torch.nn.functional, reduction, *ts)
    (out * torch.from_numpy(np.asarray(c))).sum().backward()
    return {"out": out.detach().numpy(), **{f"a{i}": ts[i].grad.numpy() for i in wrt}}


def _ours(fn, reduction, xs, wrt, c, backend):
    names = [f"a{i}" for i in range(len(xs))]
    params = {n: x for i, (n, x) in enumerate(zip(names, xs)) if i in wrt}
    inputs = {n: x for i, (n, x) in enumerate(zip(names, xs)) if i not in wrt}

    def call(M, *ps, **ins):
        given = {**dict(zip(params, ps)), **ins}
        return fn(M, reduction, *(given[n] for n in names))

    return gc_grads(call, params, inputs, c, backend=backend)


@pytest.mark.parametrize("case", FULL, ids=IDS)
def test_functional_loss_and_gradients_match_torch(case):
    torch = pytest.importorskip("torch")
    name, fn, make, wrt, *_, reduction = case
    xs = make()
    shape = np.shape(fn(torch.nn.functional, reduction, *map(torch.from_numpy, xs)))
    c = np.asarray(R.standard_normal(shape))
    want = _torch_run(torch, fn, reduction, xs, wrt, c)
    got = _ours(fn, reduction, xs, wrt, c, "numpy")
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-12, err_msg=k)
    floats = [x.astype(np.float32) if x.dtype == np.float64 else x for x in xs]
    got = _ours(fn, reduction, floats, wrt, c.astype(np.float32), "ort-cpu")
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=2e-5, err_msg=f"float32 ort-cpu {k}")


@pytest.mark.parametrize("case", FULL, ids=IDS)
def test_gradients_match_float64_finite_differences(case):
    """d sum(loss * c) along random directions of the differentiated inputs, from ``gc.grad``
    against central differences of the forward on the numpy backend (torch not needed); the
    captured forward passes onnx.checker's full check."""
    name, fn, make, wrt, *fd, reduction = case
    xs = make()
    feeds = {f"a{i}": x for i, x in enumerate(xs)}
    model = gc.capture(lambda **kw: fn(F, reduction, *(kw[f"a{i}"] for i in range(len(xs)))), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    sess = gc.Session(model, backend="numpy")
    rng = np.random.default_rng(len(name))
    c = np.asarray(rng.standard_normal(model.outputs[0].shape))
    grads = _ours(fn, reduction, xs, wrt, c, "numpy")
    assert_directional_derivatives(sess, feeds, grads, [f"a{i}" for i in (fd[0] if fd else wrt)], c, rng)


W4 = R.uniform(0.2, 2.0, 4)
W4F = W4.astype(np.float32)  # as torch.from_numpy(W4).float(): a float32 model's weights
# (module factory, torch.nn constructor, make() -> inputs, torch's state_dict keys)
MODULES = [
    (lambda: nn.PoissonNLLLoss(full=True, reduction="sum"), "PoissonNLLLoss(full=True, reduction='sum')", _counts, []),
    (lambda: nn.PoissonNLLLoss(False, eps=0.01), "PoissonNLLLoss(False, eps=0.01)",
     lambda: [R.uniform(0.2, 3.0, (4, 3)), R.poisson(1.5, (4, 3)) * 1.0], []),
    (lambda: nn.GaussianNLLLoss(full=True, eps=1e-3), "GaussianNLLLoss(full=True, eps=1e-3)",
     lambda: [*_normal((5, 3), (5, 3)), R.uniform(0.1, 2.0, (5, 1))], []),
    (lambda: nn.CosineEmbeddingLoss(0.25, reduction="none"), "CosineEmbeddingLoss(0.25, reduction='none')",
     lambda: [*_normal((6, 4), (6, 4)), _signs(6)], []),
    (lambda: nn.MarginRankingLoss(0.5), "MarginRankingLoss(0.5)", lambda: [*_normal((7,), (7,)), _signs(7)], []),
    (lambda: nn.HingeEmbeddingLoss(0.5, reduction="sum"), "HingeEmbeddingLoss(0.5, reduction='sum')",
     lambda: [R.standard_normal((5, 3)), _signs((5, 3))], []),
    (lambda: nn.SoftMarginLoss(), "SoftMarginLoss()", lambda: [R.standard_normal((5, 3)), _signs((5, 3))], []),
    (lambda: nn.MultiLabelSoftMarginLoss(W4F), "MultiLabelSoftMarginLoss(w(W4))",
     lambda: [R.standard_normal((5, 4)), R.integers(0, 2, (5, 4)) * 1.0], ["weight"]),
    (lambda: nn.MultiLabelMarginLoss(reduction="none"), "MultiLabelMarginLoss(reduction='none')",
     lambda: [R.standard_normal((4, 5)), _multilabel_targets()], []),
    (lambda: nn.MultiMarginLoss(2, 0.5, W4F), "MultiMarginLoss(2, 0.5, w(W4))",
     lambda: [R.standard_normal((6, 4)), R.integers(0, 4, 6)], ["weight"]),
    (lambda: nn.TripletMarginLoss(0.5, 1.5, swap=True), "TripletMarginLoss(0.5, 1.5, swap=True)",
     lambda: _normal((5, 4), (5, 4), (5, 4)), []),
    (lambda: nn.TripletMarginWithDistanceLoss(distance_function=_sq_dist, margin=3.0, reduction="sum"),
     "TripletMarginWithDistanceLoss(distance_function=_sq_dist, margin=3.0, reduction='sum')",
     lambda: _normal((5, 4), (5, 4), (5, 4)), []),
    (lambda: nn.SoftMarginLoss(False), "SoftMarginLoss(False)",  # size_average=False: "sum"
     lambda: [R.standard_normal((5, 3)), _signs((5, 3))], []),
]


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
@pytest.mark.parametrize("factory,ctor,make,keys", MODULES, ids=[m[1] for m in MODULES])
def test_module_matches_torch_with_its_state_dict_keys(factory, ctor, make, keys):
    torch = pytest.importorskip("torch")
    loss = factory()
    xs = [x.astype(np.float32) if x.dtype == np.float64 else x for x in make()]
    theirs = eval(f"torch.nn.{ctor}", {"torch": torch, "W4": W4, "_sq_dist": _sq_dist,  # noqa: S307 - listed above
                                         "w": lambda a: torch.from_numpy(a.astype(np.float32))})
    assert list(loss.state_dict()) == list(theirs.state_dict()) == keys
    for k, v in theirs.state_dict().items():
        assert loss.state_dict()[k].dtype == v.numpy().dtype, k
        np.testing.assert_array_equal(loss.state_dict()[k], v.numpy())
    names = list(loss.forward.__code__.co_varnames[1:1 + len(xs)])
    model = gc.capture(loss, **{n: gc.spec(x.dtype, ("N", *x.shape[1:])) for n, x in zip(names, xs)})
    onnx.checker.check_model(model.proto, full_check=True)
    assert sorted(model.params) == sorted(keys)
    want = theirs(*map(torch.from_numpy, xs)).numpy()
    np.testing.assert_allclose(run_both(model, dict(zip(names, xs)))["output"], want, rtol=1e-5, atol=1e-6)


def test_multilabel_soft_margin_averages_over_a_symbolic_class_dim():
    """The mean over the last (class) dim reads that dim's size at run time when it is symbolic (dim -1 was read
    as an empty shape slice: [N] / [0] failed), as torch's at C = 3 and 6."""
    torch = pytest.importorskip("torch")
    model = gc.capture(lambda x, y: F.multilabel_soft_margin_loss(x, y, reduction="none"),
                       x=gc.spec("float64", ("N", "C")), y=gc.spec("float64", ("N", "C")))
    for c in (3, 6):
        x, y = R.standard_normal((4, c)), R.integers(0, 2, (4, c)).astype(np.float64)
        want = torch.nn.functional.multilabel_soft_margin_loss(torch.from_numpy(x), torch.from_numpy(y),
                                                               reduction="none").numpy()
        np.testing.assert_allclose(run_both(model, {"x": x, "y": y})["output"], want, rtol=1e-12, err_msg=f"C={c}")


def test_bad_arguments_are_refused_by_name():
    x, y = R.standard_normal((4, 3)), _signs(4)
    labels = R.integers(0, 3, 4)
    cases = [
        (lambda: F.poisson_nll_loss(x, x, reduction="avg"), r"poisson_nll: reduction must be 'mean', 'sum', 'none'"),
        (lambda: F.gaussian_nll_loss(x, x, np.ones((4, 2))), r"var must have the input's shape, that without"),
        (lambda: F.gaussian_nll_loss(x, x, -1.0), r"gaussian_nll: var must be >= 0, got -1.0"),
        (lambda: F.cosine_embedding_loss(x, x, y[:, None]), r"target must be \[N\] or 0-d, got rank 2"),
        (lambda: F.cosine_embedding_loss(x, x, y[0]), r"a rank-0 target takes inputs of rank 1, got rank 2"),
        (lambda: F.cosine_embedding_loss(x, x[:, :2], y), r"cosine_embedding|Mul"),
        (lambda: F.margin_ranking_loss(x, x, y), r"input1, input2 and target must have the same rank, got ranks "
                                                 r"\[2, 2, 1\]"),
        (lambda: F.multi_margin_loss(x, labels, p=3), r"multi_margin: p must be 1 or 2, got 3"),
        (lambda: F.multi_margin_loss(x, labels.astype(np.int32)), r"target must hold int64 class indices, got int32"),
        (lambda: F.multi_margin_loss(x, labels[:3]), r"input and target batch sizes differ \(4 vs 3\)"),
        (lambda: F.multi_margin_loss(x, labels, weight=np.ones(4)), r"classes and weights differ \(3 vs 4\)"),
        (lambda: F.multi_margin_loss(x, labels[:, None]), r"target must be \[N\] for an input \[N, C\]"),
        (lambda: F.multi_margin_loss(x[None], labels), r"input must be \[N, C\] or \[C\], got rank 3"),
        (lambda: F.multilabel_margin_loss(x, labels), r"target must have the input's shape, got rank 1 for rank 2"),
        (lambda: F.multilabel_margin_loss(x, np.zeros((4, 2), np.int64)), r"input and target dims differ \(3 vs 2\)"),
        (lambda: F.triplet_margin_loss(x, x, x[0]), r"anchor, positive and negative must have the same rank"),
        (lambda: F.triplet_margin_loss(x, x, x, margin=0.0), r"triplet_margin: margin must be > 0, got 0.0"),
        (lambda: F.triplet_margin_with_distance_loss(x, x, x, margin=-1.0), r"margin must be > 0, got -1.0"),
    ]
    for call, match in cases:
        with pytest.raises(gc.GraphError, match=match):
            gc.capture(lambda unused: {"output": call()}, unused=np.zeros(1))
    with pytest.raises(gc.GraphError, match=r"MultiMarginLoss: p must be 1 or 2, got 0"):
        nn.MultiMarginLoss(p=0)
    with pytest.raises(gc.GraphError, match=r"MultiMarginLoss: weight must be one value per class \[C\]"):
        nn.MultiMarginLoss(weight=np.ones((2, 2)))
    with pytest.raises(gc.GraphError, match=r"TripletMarginWithDistanceLoss: margin must be > 0, got 0"):
        nn.TripletMarginWithDistanceLoss(margin=0)
    with pytest.raises(gc.GraphError, match=r"SoftMarginLoss: reduction must be"):
        nn.SoftMarginLoss(reduction="batchmean")
