"""F.ctc_loss and nn.CTCLoss against torch's: values and gradients (through log_softmax, where
torch's gradient is the true one) on the numpy and ort-cpu backends for padded and concatenated
targets, lengths as graph inputs or Python lists, blank != 0, repeated labels, empty targets, inputs
too short (inf, and zero_infinity), unbatched inputs and symbolic sizes; the exact gradient with
respect to log_probs against float64 central differences; SGD steps of a small model against
torch.optim; and the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

try:
    from torch_grad_util import assert_grads_match_central_differences, assert_step_matches_torch, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, assert_step_matches_torch, gc_grads

# (id, T, C, blank, input_lengths, targets (one list per example), layout, lengths as, keywords, dtype)
CASES = [
    ("padded-mean", 8, 6, 0, [8, 7, 5], [[1, 2, 3, 4], [5, 1], [2, 3, 4]], "padded", "tensor", {}, "float32"),
    ("blank-last-sum", 7, 5, 4, [7, 6], [[0, 1, 2], [3, 3]], "padded", "tensor", {"reduction": "sum"}, "float64"),
    ("repeats-none", 7, 4, 0, [7, 7, 6], [[2, 2, 3, 3], [1, 1, 1], [3, 1, 3]], "padded", "tensor",
     {"reduction": "none"}, "float64"),
    ("empty-targets", 5, 4, 0, [5, 3, 0], [[], [2, 1], []], "padded", "tensor", {"reduction": "none"}, "float64"),
    ("too-short-inf", 5, 4, 0, [5, 3], [[1, 2], [1, 1, 2]], "padded", "tensor", {"reduction": "none"}, "float64"),
    ("too-short-zero", 5, 4, 0, [5, 3, 0], [[1, 2], [1, 1, 2], [3]], "padded", "tensor", {"zero_infinity": True},
     "float64"),
    ("concat-tensor", 6, 5, 0, [6, 4, 6], [[1, 2], [3], [4, 4, 1]], "concat", "tensor", {}, "float32"),
    ("concat-list", 6, 5, 2, [6, 5], [[1, 3, 4], [0]], "concat", "list", {"reduction": "sum"}, "float64"),
    ("padded-list", 6, 5, 0, [6, 5], [[1, 3, 4], [2]], "padded", "list", {}, "float32"),
    ("unbatched", 6, 5, 1, [5], [[2, 0, 2]], "unbatched", "tensor", {"reduction": "none"}, "float64"),
    ("unbatched-list-mean", 6, 5, 0, [6], [[2, 3]], "unbatched", "list", {}, "float32"),
]


def _arrays(t, c, blank, in_lens, labels, layout, seed=0):
    """(logits, targets, input_lengths, target_lengths) as numpy, torch's layouts."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, c) if layout == "unbatched" else (t, len(labels), c))
    width = max(1, max(len(lab) for lab in labels))
    if layout == "padded":  # the padding holds labels, which must be ignored
        targets = np.array([lab + [(blank + 1) % c] * (width - len(lab)) for lab in labels], np.int64)
    else:
        targets = np.array(sum(labels, []), np.int64)
    tl = np.array([len(lab) for lab in labels], np.int64)
    il = np.array(in_lens, np.int64)
    return x, targets, (il[0], tl[0]) if layout == "unbatched" else (il, tl)


def _torch_loss(torch, x, targets, il, tl, blank, kw):
    xt = torch.tensor(x, requires_grad=True)
    loss = torch.nn.functional.ctc_loss(torch.log_softmax(xt, -1), torch.tensor(targets), torch.tensor(il),
                                        torch.tensor(tl), blank=blank, **kw)
    return xt, loss


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(case):
    """The loss and its gradient with respect to the logits (``sum(loss * c)`` through
    log_softmax) against torch's, on both backends; where torch's gradient is NaN (an infinite
    loss without zero_infinity) only the other examples' gradients are compared."""
    torch = pytest.importorskip("torch")
    _, t, c, blank, in_lens, labels, layout, lengths_as, kw, dtype = case
    x, targets, (il, tl) = _arrays(t, c, blank, in_lens, labels, layout)
    x = x.astype(dtype)
    xt, want = _torch_loss(torch, x, targets, il, tl, blank, kw)
    weights = np.random.default_rng(1).standard_normal(tuple(want.shape)).astype(dtype)
    (want * torch.tensor(weights)).sum().backward()
    if lengths_as == "tensor":
        inputs = {"tg": targets, "il": np.asarray(il), "tl": np.asarray(tl)}

        def fn(m, x, tg, il, tl):
            return m.ctc_loss(m.log_softmax(x, -1), tg, il, tl, blank, **kw)
    else:
        inputs = {"tg": targets}

        def fn(m, x, tg):
            return m.ctc_loss(m.log_softmax(x, -1), tg, np.asarray(il).tolist(), np.asarray(tl).tolist(), blank, **kw)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-9, "atol": 1e-10}
    grad = xt.grad.numpy()
    compared = np.isfinite(grad)
    assert compared.any()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, {"x": x}, inputs, weights, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), err_msg=backend, **tol)
        np.testing.assert_allclose(got["x"][compared], grad[compared], err_msg=f"{backend} grad", **tol)
    model = gc.capture(lambda x, **feeds: fn(F, x, **feeds), x=x, **inputs)
    onnx.checker.check_model(model.proto, full_check=True)


def test_module_with_symbolic_sizes_matches_torch():
    """nn.CTCLoss captured with T, N and S symbolic (its Scan's length known only at run time, so
    the gradient runs in reverse mode), run at two sizes against torch on both backends."""
    torch = pytest.importorskip("torch")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.loss = nn.CTCLoss(blank=0, reduction="sum")

        def forward(self, x, tg, il, tl):
            return self.loss(F.log_softmax(x, 2), tg, il, tl)

    specs = {"x": gc.spec("float64", ("T", "N", 5)), "tg": gc.spec("int64", ("N", "S")),
             "il": gc.spec("int64", ("N",)), "tl": gc.spec("int64", ("N",))}
    model = gc.capture(Net(), **specs)
    onnx.checker.check_model(model.proto, full_check=True)
    for seed, (t, in_lens, labels) in enumerate([(6, [6, 4], [[1, 2], [3, 3, 1]]), (9, [9, 7, 8], [[1], [2, 4], []])]):
        x, targets, (il, tl) = _arrays(t, 5, 0, in_lens, labels, "padded", seed)
        xt, want = _torch_loss(torch, x, targets, il, tl, 0, {"reduction": "sum"})
        want.backward()
        feeds = {"x": x, "tg": targets, "il": il, "tl": tl}
        for backend in ("numpy", "ort-cpu"):
            np.testing.assert_allclose(gc.Session(model, backend=backend).run(feeds)["output"], want.item(), 1e-10)
        np.testing.assert_allclose(_symbolic_grad(Net, specs, feeds), xt.grad.numpy(), 1e-9, 1e-10)


def _symbolic_grad(net_cls, specs, feeds):
    """d loss / d x of ``net_cls()`` captured with ``specs``, x a parameter, on both backends."""

    class WithParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.x = nn.Parameter(feeds["x"], dtype="float64")
            self.net = net_cls()

        def forward(self, tg, il, tl):
            return self.net(self.x, tg, il, tl)

    model = gc.capture(WithParam(), **{k: v for k, v in specs.items() if k != "x"})
    grads = gc.grad(model, "output")
    got = [gc.Session(grads, backend=b).run({k: v for k, v in feeds.items() if k != "x"})["x_grad"]
           for b in ("numpy", "ort-cpu")]
    np.testing.assert_allclose(got[1], got[0], 1e-9, 1e-10)
    return got[0]


def test_gradient_wrt_log_probs_matches_central_differences():
    """The exact gradient with respect to log_probs themselves (torch's adds exp(log_probs), which
    cancels through log_softmax) against float64 central differences, on both backends."""
    targets = np.array([[1, 1], [2, 0]])

    def fn(m, x):
        return m.ctc_loss(x, targets, [4, 3], [2, 1], blank=0, reduction="none")

    x = np.random.default_rng(5).standard_normal((4, 2, 3)) - 1.0
    assert_grads_match_central_differences(fn, x)


def test_sgd_steps_match_torch():
    """Linear + log_softmax -> CTCLoss (mean), trained by gc.training.generate's SGD for three
    steps against torch.optim.SGD: the loss and the Linear's parameters step for step."""
    torch = pytest.importorskip("torch")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 5, dtype="float64")
            self.ctc = nn.CTCLoss()

        def forward(self, x, tg, il, tl):
            return self.ctc(F.log_softmax(self.fc(x), 2), tg, il, tl)

    net = Net()
    net.init_parameters(seed=3)
    specs = {"x": gc.spec("float64", (7, "N", 3)), "tg": gc.spec("int64", ("N", 3)), "il": gc.spec("int64", ("N",)),
             "tl": gc.spec("int64", ("N",))}
    trainer = gc.Trainer(gc.training.generate(gc.capture(net, **specs), "output", gc.optim.SGD(0.5)), backend="ort-cpu")
    twin = torch.nn.ModuleDict({"fc": torch.nn.Linear(3, 5, dtype=torch.float64)})
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    rng = np.random.default_rng(6)
    for step in range(3):
        x = rng.standard_normal((7, 4, 3))
        tg, il, tl = rng.integers(1, 5, (4, 3)), np.array([7, 6, 7, 5]), np.array([3, 2, 1, 3])

        def torch_loss(x=x, tg=tg, il=il, tl=tl):
            lp = torch.log_softmax(twin.fc(torch.from_numpy(x)), 2)
            return torch.nn.functional.ctc_loss(lp, torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl))

        assert_step_matches_torch(trainer, {"x": x, "tg": tg, "il": il, "tl": tl}, opt, torch_loss, twin, step)


def test_module_repr_and_defaults():
    loss = nn.CTCLoss(blank=3, reduction="sum", zero_infinity=True)
    assert (loss.blank, loss.reduction, loss.zero_infinity) == (3, "sum", True)
    assert repr(loss) == "CTCLoss()"  # torch's: its losses print no arguments


LP = np.zeros((5, 2, 4), np.float32)


@pytest.mark.parametrize("args, kw, match", [
    ((LP.astype(np.int64), np.ones((2, 2), np.int64), [5, 5], [2, 2]), {}, "log_probs must be float32 or float64"),
    ((LP[0, 0], np.ones(2, np.int64), [5], [2]), {}, r"\(T, N, C\) or unbatched \(T, C\), got rank 1"),
    ((LP, np.ones((2, 2), np.int64), [5, 5], [2, 2]), {"reduction": "avg"}, "reduction must be"),
    ((LP, np.ones((2, 2), np.int64), [6, 5], [2, 2]), {}, r"input_lengths \[6, 5\] must be at most T = 5"),
    ((LP, np.ones((2, 2), np.int64), [5], [2, 2]), {}, "input_lengths must be N = 2"),
    ((LP, np.ones((2, 2), np.int64), [5, 5], [3, 2]), {}, r"must be at most S = 2"),
    ((LP, np.ones(3, np.int64), [5, 5], [2, 2]), {}, r"sum\(target_lengths\) = 4 labels, got 3"),
    ((LP, np.ones((2, 2), np.float32), [5, 5], [2, 2]), {}, "targets must be int64 or int32"),
    ((LP, np.ones((2, 2), np.int64), [5, 5], [2, 2]), {"blank": 4}, r"blank must be in \[0, C = 4\), got 4"),
    ((LP, np.ones((2, 2), np.int64), [5, 5], [2, 2]), {"blank": -1}, r"blank must be in \[0, C = 4\), got -1"),
])
def test_refusals_name_the_argument(args, kw, match):
    with pytest.raises(gc.GraphError, match=match):
        gc.capture(lambda lp: F.ctc_loss(lp, *args[1:], **kw), lp=args[0])


def test_length_tensors_must_be_integers():
    with pytest.raises(gc.GraphError, match="input_lengths must be an int64 or int32 \\(N,\\) Tensor, got float32"):
        gc.capture(lambda il: F.ctc_loss(LP, np.ones((2, 2), np.int64), il, [2, 2]), il=np.ones(2, np.float32))
