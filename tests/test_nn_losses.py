"""gc.nn's loss modules and gc.nn.functional's loss functions (MSELoss ... KLDivLoss) against
torch.nn (values and gradients, several shapes and arguments; float64 on the numpy backend,
float32 on ort-cpu), against float64 central finite differences and closed numpy forms, their
state_dict keys and errors, and a model whose loss is a module inside the DSL trained by
gc.training.generate against torch.optim step for step."""

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

R = np.random.default_rng(21)
W4 = R.uniform(0.2, 2.0, 4)  # class weights
W4F = W4.astype(np.float32)  # as torch.from_numpy(W4).float(): a float32 model's weights


def _pair(shape=(6, 5)):
    return R.standard_normal(shape), R.standard_normal(shape)


def _probs(shape=(6, 5)):
    """Probabilities in [0.05, 0.95]: nearer 0 or 1, log's third derivative (~2/p^3) makes the
    float64 central differences miss by more than their rtol, whichever draws the test order gives."""
    return 1 / (1 + np.exp(-R.uniform(-3, 3, shape))), R.uniform(0, 1, shape)


def _labels(shape=(6, 4), extra=(), ignored=()):
    labels = R.integers(0, shape[1], (shape[0], *extra))
    labels.reshape(-1)[list(ignored)] = -100
    return R.standard_normal((shape[0], shape[1], *extra)) * 2, labels


def _soft(shape=(6, 4), extra=()):
    p = np.exp(R.standard_normal((shape[0], shape[1], *extra)))
    return R.standard_normal(p.shape) * 2, p / p.sum(1, keepdims=True)


def _kl(log_target=False, zeros=True):
    """log-probabilities and target probabilities (one of them 0 unless log), or their logs."""
    lp, t = _soft((5, 4), (2,))
    lp = np.log(np.exp(lp) / np.exp(lp).sum(1, keepdims=True))
    if log_target:
        return lp, np.log(t)
    if zeros:
        t[0, 1, 0] = 0.0
    return lp, t


# (id, f(M, w, x, y) on the functional namespace M (w converts a numpy constant for it), make() -> (x, y),
#  the inputs differentiated)
CASES = [
    ("mse", lambda M, w, x, y: M.mse_loss(x, y), _pair, "xy"),
    ("mse_sum_3d", lambda M, w, x, y: M.mse_loss(x, y, reduction="sum"), lambda: _pair((2, 3, 4)), "xy"),
    ("l1_none", lambda M, w, x, y: M.l1_loss(x, y, reduction="none"), _pair, "xy"),
    ("smooth_l1", lambda M, w, x, y: M.smooth_l1_loss(x, y), _pair, "xy"),
    ("smooth_l1_beta", lambda M, w, x, y: M.smooth_l1_loss(x, y, beta=0.4, reduction="sum"), _pair, "xy"),
    ("smooth_l1_beta0", lambda M, w, x, y: M.smooth_l1_loss(x, y, beta=0.0), _pair, "xy"),
    ("huber_delta_none", lambda M, w, x, y: M.huber_loss(x, y, reduction="none", delta=0.7), _pair, "xy"),
    ("bce", lambda M, w, x, y: M.binary_cross_entropy(x, y), _probs, "xy"),
    ("bce_weight_sum", lambda M, w, x, y: M.binary_cross_entropy(x, y, w(W4[:3]), reduction="sum"),
     lambda: _probs((2, 4, 3)), "xy"),
    ("bce_none", lambda M, w, x, y: M.binary_cross_entropy(x, y, reduction="none"), _probs, "xy"),
    ("bce_logits_pos_weight", lambda M, w, x, y: M.binary_cross_entropy_with_logits(x, y, pos_weight=w(W4)),
     lambda: (R.standard_normal((6, 4)) * 3, R.uniform(0, 1, (6, 4))), "xy"),
    ("bce_logits_both_none", lambda M, w, x, y: M.binary_cross_entropy_with_logits(
        x, y, w(W4[:, None]), reduction="none", pos_weight=w(W4[::-1].copy())),
     lambda: (R.standard_normal((4, 4)) * 3, R.uniform(0, 1, (4, 4))), "xy"),
    ("ce_weight", lambda M, w, x, y: M.cross_entropy(x, y, w(W4)), lambda: _labels(ignored=[2]), "x"),
    ("ce_weight_smooth", lambda M, w, x, y: M.cross_entropy(x, y, w(W4), label_smoothing=0.2),
     lambda: _labels(ignored=[0, 3]), "x"),
    ("ce_weight_kdim_none", lambda M, w, x, y: M.cross_entropy(x, y, w(W4), reduction="none", label_smoothing=0.1),
     lambda: _labels((3, 4), (2, 3), ignored=[4]), "x"),
    ("ce_ignore_sum", lambda M, w, x, y: M.cross_entropy(x, y, ignore_index=1, reduction="sum"), _labels, "x"),
    ("ce_probs", lambda M, w, x, y: M.cross_entropy(x, y), _soft, "xy"),
    ("ce_probs_weight_smooth_kdim", lambda M, w, x, y: M.cross_entropy(x, y, w(W4), label_smoothing=0.3),
     lambda: _soft((3, 4), (2,)), "xy"),
    ("ce_probs_none", lambda M, w, x, y: M.cross_entropy(x, y, reduction="none"), _soft, "xy"),
    ("ce_unbatched", lambda M, w, x, y: M.cross_entropy(x, y, w(W4), label_smoothing=0.1),
     lambda: (R.standard_normal(4), np.array(2)), "x"),
    ("nll", lambda M, w, x, y: M.nll_loss(x, y), lambda: _labels(ignored=[1]), "x"),
    ("nll_weight_kdim", lambda M, w, x, y: M.nll_loss(x, y, w(W4)), lambda: _labels((3, 4), (5,), ignored=[0, 7]),
     "x"),
    ("nll_weight_ignore_none", lambda M, w, x, y: M.nll_loss(x, y, w(W4), ignore_index=3, reduction="none"),
     _labels, "x"),
    ("kl", lambda M, w, x, y: M.kl_div(x, y), _kl, "x"),  # a zero target: torch's target gradient is nan there
    ("kl_batchmean", lambda M, w, x, y: M.kl_div(x, y, reduction="batchmean"), _kl, "x"),
    ("kl_none", lambda M, w, x, y: M.kl_div(x, y, reduction="none"), lambda: _kl(zeros=False), "xy"),
    ("kl_log_target_sum", lambda M, w, x, y: M.kl_div(x, y, reduction="sum", log_target=True),
     lambda: _kl(log_target=True), "xy"),
]
IDS = [c[0] for c in CASES]


def _torch_run(torch, fn, x, y, wrt, c):
    """torch's value of ``fn`` and the gradients of sum(fn * c) for the inputs in ``wrt``."""
    xt = torch.tensor(x, requires_grad="x" in wrt)
    yt = torch.tensor(y, requires_grad="y" in wrt)
    out = fn(torch.nn.functional, torch.from_numpy, xt, yt)
    (out * torch.from_numpy(np.asarray(c))).sum().backward()
    return {"out": out.detach().numpy(), **{k: t.grad.numpy() for k, t in (("x", xt), ("y", yt)) if k in wrt}}


def _ours(fn, x, y, wrt, c, backend):
    params, inputs = ({"x": x, "y": y} if "y" in wrt else {"x": x}), ({} if "y" in wrt else {"y": y})
    return gc_grads(lambda M, x, y: fn(M, lambda a: a, x, y), params, inputs, c, backend=backend)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss")  # torch's, for kl_div
@pytest.mark.parametrize("name,fn,make,wrt", CASES, ids=IDS)
def test_functional_loss_and_gradients_match_torch(name, fn, make, wrt):
    torch = pytest.importorskip("torch")
    x, y = make()
    c = np.asarray(R.standard_normal(np.shape(fn(torch.nn.functional, torch.from_numpy, torch.from_numpy(x),
                                                 torch.from_numpy(y)))))
    want = _torch_run(torch, fn, x, y, wrt, c)
    got = _ours(fn, x, y, wrt, c, "numpy")
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-12, err_msg=k)
    floats = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in (("x", x), ("y", y))}
    got = _ours(fn, floats["x"], floats["y"], wrt, c.astype(np.float32), "ort-cpu")
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=2e-4, atol=1e-5, err_msg=f"float32 ort-cpu {k}")


def _loss_model(fn, x, y):
    return gc.capture(lambda x, y: fn(F, lambda a: a, x, y), x=x, y=y)


@pytest.mark.parametrize("name,fn,make,wrt", CASES, ids=IDS)
def test_gradients_match_float64_finite_differences(name, fn, make, wrt):
    """d sum(loss * c) along random directions of the differentiated inputs, from ``gc.grad``
    against central differences of the forward on the numpy backend (torch not needed)."""
    x, y = make()
    model = _loss_model(fn, x, y)
    sess = gc.Session(model, backend="numpy")
    rng = np.random.default_rng(len(name))
    c = np.asarray(rng.standard_normal(model.outputs[0].shape))
    grads = _ours(fn, x, y, wrt, c, "numpy")
    assert_directional_derivatives(sess, {"x": x, "y": y}, grads, [k for k in "xy" if k in wrt], c, rng)


def test_weighted_mean_divides_by_the_picked_weights():
    """Closed form (no torch): sum_i -w[y_i] logp[i, y_i] / sum_i w[y_i] over the labels not ignored."""
    x, y = _labels(ignored=[1, 4])
    lsm = x - np.log(np.exp(x).sum(1, keepdims=True))
    keep = y != -100
    picked = np.where(keep, y, 0)
    w = W4[picked] * keep
    want = -(w * lsm[np.arange(len(y)), picked]).sum() / w.sum()
    for fn in (lambda x, y: F.cross_entropy(x, y, W4), lambda x, y: F.nll_loss(F.log_softmax(x, 1), y, W4),
               lambda x, y: nn.CrossEntropyLoss(W4)(x, y)):
        got = gc.Session(gc.capture(fn, x=x, y=y), backend="numpy").run({"x": x, "y": y})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12)  # the module's weight buffer stays float64


def test_binary_cross_entropy_clamps_its_logs_as_torch():
    """At p = 0 and 1 the loss is finite (each log clamped at -100, as torch) and so is the
    gradient (torch divides by 1e-12 there; the clamped log's slope is 0); elsewhere it is
    (p - y) / (p (1 - p))."""
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.25, 0.9])
    y = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.2])
    got = gc_grads(lambda M, p, y: M.binary_cross_entropy(p, y, reduction="none"), {"p": p}, {"y": y}, np.ones(6))
    np.testing.assert_array_equal(got["out"][:4], [100.0, 100.0, 0.0, 0.0])
    assert np.isfinite(got["p"]).all()
    p, y = p[4:], y[4:]
    np.testing.assert_allclose(got["out"][4:], -(y * np.log(p) + (1 - y) * np.log1p(-p)), rtol=1e-12)
    np.testing.assert_allclose(got["p"][4:], (p - y) / (p * (1 - p)), rtol=1e-12)


def test_kl_div_at_a_zero_target_adds_nothing_and_stays_finite():
    """xlogy(0, 0) = 0, as torch; the target's gradient there is -logp (torch's is nan)."""
    lp, t = np.log(np.array([[0.5, 0.25, 0.25]])), np.array([[0.0, 0.5, 0.5]])
    got = gc_grads(lambda M, lp, t: M.kl_div(lp, t, reduction="sum"), {"lp": lp, "t": t}, {}, np.asarray(1.0))
    np.testing.assert_allclose(got["out"], (t[:, 1:] * (np.log(t[:, 1:]) - lp[:, 1:])).sum(), rtol=1e-12)
    np.testing.assert_allclose(got["t"], [[-lp[0, 0], *(np.log(t[0, 1:]) + 1 - lp[0, 1:])]], rtol=1e-12)
    np.testing.assert_allclose(got["lp"], -t, rtol=1e-12)


def test_bce_with_logits_is_stable_far_out():
    """Finite loss and gradient (1 - y) - (1 + (pw - 1) y) sigmoid(-x) at |x| = 100 and at 0; at 30
    log(1 + exp(-30)) is 0 in float32 (no Log1p), the gradient keeps its 9e-14."""
    x = np.array([[100.0, -100.0, 0.0, 30.0]], np.float32)
    y = np.array([[0.0, 1.0, 1.0, 1.0]], np.float32)
    pw = np.array([2.0, 3.0, 0.5, 4.0], np.float32)
    got = gc_grads(lambda M, x, y: M.binary_cross_entropy_with_logits(x, y, pos_weight=pw, reduction="none"), {"x": x},
                   {"y": y}, np.ones_like(x), backend="ort-cpu")
    np.testing.assert_allclose(got["out"], [[100.0, 300.0, 0.5 * np.log(2), 4 * 9.357623e-14]], rtol=1e-6, atol=1e-12)
    sigmoid_of_minus_x = 1 / (1 + np.exp(x.astype(np.float64)))  # the slope (1 - y) - coef sigmoid(-x), no cancelling
    np.testing.assert_allclose(got["x"], (1 - y) - (1 + (pw - 1) * y) * sigmoid_of_minus_x, rtol=1e-5, atol=1e-30)


# (module factory, torch.nn constructor, make() -> (x, y), torch's state_dict keys)
MODULES = [
    (lambda: nn.MSELoss(reduction="sum"), "MSELoss(reduction='sum')", _pair, []),
    (lambda: nn.L1Loss(), "L1Loss()", _pair, []),
    (lambda: nn.SmoothL1Loss(beta=0.5), "SmoothL1Loss(beta=0.5)", _pair, []),
    (lambda: nn.HuberLoss("none", 0.5), "HuberLoss('none', 0.5)", _pair, []),
    (lambda: nn.BCELoss(W4F[:3]), "BCELoss(w(W4[:3]))", lambda: _probs((5, 3)), ["weight"]),
    (lambda: nn.BCEWithLogitsLoss(W4F, pos_weight=W4F[::-1].copy()),
     "BCEWithLogitsLoss(w(W4), pos_weight=w(W4[::-1].copy()))", lambda: _probs((5, 4)), ["weight", "pos_weight"]),
    (lambda: nn.BCEWithLogitsLoss(pos_weight=W4F), "BCEWithLogitsLoss(pos_weight=w(W4))", lambda: _probs((5, 4)),
     ["pos_weight"]),
    (lambda: nn.CrossEntropyLoss(W4F, label_smoothing=0.1, ignore_index=0),
     "CrossEntropyLoss(w(W4), label_smoothing=0.1, ignore_index=0)", _labels, ["weight"]),
    (lambda: nn.CrossEntropyLoss(reduction="none"), "CrossEntropyLoss(reduction='none')", _soft, []),
    (lambda: nn.NLLLoss(W4F, reduction="sum"), "NLLLoss(w(W4), reduction='sum')", _labels, ["weight"]),
    (lambda: nn.KLDivLoss(reduction="batchmean", log_target=True), "KLDivLoss(reduction='batchmean', log_target=True)",
     lambda: _kl(log_target=True), []),
    (lambda: nn.MSELoss(False), "MSELoss(False)", _pair, []),  # size_average=False: "sum"
    (lambda: nn.NLLLoss(None, None, -100, False), "NLLLoss(None, None, -100, False)", _labels, []),  # reduce: "none"
]


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
@pytest.mark.parametrize("factory,ctor,make,keys", MODULES, ids=[m[1] for m in MODULES])
def test_module_matches_torch_with_its_state_dict_keys(factory, ctor, make, keys):
    torch = pytest.importorskip("torch")
    loss = factory()
    x, y = (a.astype(np.float32) if a.dtype == np.float64 else a for a in make())
    theirs = eval(f"torch.nn.{ctor}", {"torch": torch, "W4": W4,  # noqa: S307 - the constructors listed above
                                         "w": lambda a: torch.from_numpy(a.astype(np.float32))})
    assert list(loss.state_dict()) == list(theirs.state_dict()) == keys
    for k, v in theirs.state_dict().items():
        assert loss.state_dict()[k].dtype == v.numpy().dtype, k
        np.testing.assert_array_equal(loss.state_dict()[k], v.numpy())
    model = gc.capture(loss, input=gc.spec(x.dtype, ("N", *x.shape[1:])),
                       target=gc.spec(y.dtype, ("N", *y.shape[1:])))
    onnx.checker.check_model(model.proto, full_check=True)
    assert sorted(model.params) == sorted(keys)
    want = theirs(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(run_both(model, {"input": x, "target": y})["output"], want, rtol=1e-5, atol=1e-6)


class _Classifier(nn.Module):
    """A Linear classifier whose forward ends in one of gc.nn's loss modules: the loss is a scalar
    output of the model (float64)."""

    def __init__(self, loss: nn.Module, outputs: int):
        super().__init__()
        self.fc = nn.Linear(5, outputs, dtype="float64")
        self.loss_fn = loss

    def forward(self, x, y):
        return {"loss": self.loss_fn(self.fc(x), y)}


TRAINING = [
    ("cross_entropy_adam", lambda: nn.CrossEntropyLoss(W4, label_smoothing=0.125),
     lambda t, w: t.nn.CrossEntropyLoss(w, label_smoothing=0.125), 4, "adam",
     lambda rng: rng.integers(0, 4, 8)),
    ("bce_with_logits_sgd", lambda: nn.BCEWithLogitsLoss(pos_weight=W4),
     lambda t, w: t.nn.BCEWithLogitsLoss(pos_weight=w), 4, "sgd", lambda rng: rng.integers(0, 2, (8, 4)) * 1.0),
    ("smooth_l1_sgd", lambda: nn.SmoothL1Loss(beta=0.5), lambda t, w: t.nn.SmoothL1Loss(beta=0.5), 3, "sgd",
     lambda rng: rng.standard_normal((8, 3))),
]


@pytest.mark.parametrize("name,ours,theirs,outputs,optim,target", TRAINING, ids=[t[0] for t in TRAINING])
def test_model_with_a_loss_module_trains_like_torch(name, ours, theirs, outputs, optim, target):
    """gc.training.generate on the model's own scalar ``loss`` output against torch.optim on the
    same model: losses and parameters step for step; the loss's class weights (a buffer) stay
    as they are, listed among the manifest's constants."""
    torch = pytest.importorskip("torch")
    net = _Classifier(ours(), outputs)
    rng = np.random.default_rng(3)
    y0 = target(rng)
    model = gc.capture(net, x=gc.spec("float64", ("N", 5)), y=gc.spec(y0.dtype, ("N", *y0.shape[1:])))
    spec = gc.optim.Adam(0.0625, weight_decay=0.25) if optim == "adam" else gc.optim.SGD(0.25, momentum=0.5)
    arts = gc.training.generate(model, "loss", spec)
    assert arts.manifest.trainable == ["fc.weight", "fc.bias"]
    assert set(arts.manifest.constants) == {k for k in net.state_dict() if k.startswith("loss_fn.")}
    trainer = gc.Trainer(arts, backend="numpy")
    fc = torch.nn.Linear(5, outputs, dtype=torch.float64)
    fc.load_state_dict({k.removeprefix("fc."): torch.from_numpy(v) for k, v in model.params.items()
                        if k.startswith("fc.")})
    loss_fn = theirs(torch, torch.from_numpy(W4))  # the float64 weights as given, as ours keeps them
    opt = torch.optim.Adam(fc.parameters(), 0.0625, weight_decay=0.25) if optim == "adam" else \
        torch.optim.SGD(fc.parameters(), 0.25, momentum=0.5)
    for step in range(4):
        x, y = rng.standard_normal((8, 5)), target(rng)
        got = trainer.step({"x": x, "y": y})
        opt.zero_grad()
        want = loss_fn(fc(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        opt.step()
        np.testing.assert_allclose(got, want.item(), rtol=1e-9, err_msg=f"step {step}")
        for k, p in fc.named_parameters():
            np.testing.assert_allclose(trainer.params["fc." + k], p.detach().numpy(), rtol=1e-8, atol=1e-12,
                                       err_msg=f"step {step} {k}")
    assert all(k not in trainer.params for k in arts.manifest.constants)


def test_bad_arguments_are_refused_by_name():
    x, y = _labels()
    p, t = _probs((6, 4))
    cases = [
        (lambda: F.mse_loss(p, t, reduction="avg"), r"mse: reduction must be 'mean', 'sum', 'none', got 'avg'"),
        (lambda: F.kl_div(p, t, reduction="batch"), r"kl_div: reduction must be .*'batchmean', got 'batch'"),
        (lambda: F.cross_entropy(x, y, reduction="batchmean"), r"cross_entropy: reduction must be"),
        (lambda: F.huber_loss(p, t, delta=0.0), r"huber: delta must be > 0, got 0.0"),
        (lambda: F.smooth_l1_loss(p, t, beta=-1.0), r"smooth_l1: beta must be >= 0, got -1.0"),
        (lambda: F.cross_entropy(x, y, label_smoothing=1.5), r"label_smoothing must be at most 1 .*got 1.5"),
        (lambda: F.smooth_l1_loss(p, t, beta=float("nan")), r"smooth_l1: beta must be >= 0, got nan"),
        (lambda: F.cross_entropy(x, _soft()[1], ignore_index=0), r"ignore_index=0 is for class labels"),
        (lambda: F.cross_entropy(x, y, np.ones(3)), r"classes and weights differ \(4 vs 3\)"),
        (lambda: F.cross_entropy(x, y, np.ones((4, 1))), r"weight must be one value per class \[C\]"),
        (lambda: F.nll_loss(x, y[:, None]), r"the target must have the input's dims without C \(rank 1\), got rank 2"),
        (lambda: F.nll_loss(x, y[:5]), r"input and target dims differ \(6 vs 5\)"),
        (lambda: F.nll_loss(x, y.astype(np.float64)), r"class labels must be int64 or int32, got float32"),
        (lambda: F.binary_cross_entropy(p, t[:, :3]), r"bce.*input and target dims differ \(4 vs 3\)"),
        (lambda: F.binary_cross_entropy_with_logits(p, t[0]), r"target must have the input's shape, got rank 1"),
        (lambda: F.nll_loss(x[0, 0], y[0]), r"expects a \(C\), \(N, C\) or \(N, C, d...\) input, got rank 0"),
        (lambda: F.cross_entropy(x[0, 0], y[0]), r"expects a \(C\), \(N, C\) or \(N, C, d...\) input, got rank 0"),
    ]
    for call, match in cases:
        with pytest.raises(gc.GraphError, match=match):
            gc.capture(lambda unused: {"output": call()}, unused=np.zeros(1))
    with pytest.raises(gc.GraphError, match=r"KLDivLoss: reduction must be .*'batchmean', got 'avg'"):
        nn.KLDivLoss(reduction="avg")
    with pytest.raises(gc.GraphError, match=r"MSELoss: reduction must be 'mean', 'sum', 'none', got 'batchmean'"):
        nn.MSELoss(reduction="batchmean")
