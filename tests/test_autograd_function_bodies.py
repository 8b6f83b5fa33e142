"""``gc.autograd.Function`` applied inside ``gc.cond`` branches, ``gc.scan`` / ``gc.fori_loop`` / ``gc.while_loop``
bodies and ``gc.vmap``: autodiff copies the user's backward into the bodies' gradients (unrolled steps, reverse
mode, the backward If's branches); checked against torch 2.13 running the same Functions in Python control flow
(float64, numpy and ort-cpu)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _functions(lib, base):
    class GradReverse(base):  # a ctx attribute, no saved Tensor
        @staticmethod
        def forward(ctx, x, lambd):
            ctx.lambd = lambd
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return -ctx.lambd * g, None

    class ClippedSTE(base):  # round, the gradient passed where |x| < 1.5 (a saved input)
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return lib.round(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (lib.abs(x) < 1.5).to(g.dtype)

    class HalfTanh(base):  # a saved output, half tanh's gradient
        @staticmethod
        def forward(ctx, x):
            y = lib.tanh(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * (1 - y * y) * 0.5

    return GradReverse, ClippedSTE, HalfTanh


GC_FNS = _functions(gc, gc.autograd.Function)
TORCH_FNS = _functions(torch, torch.autograd.Function)


def _cell(fns, h, xt, w):
    """One RNN step with a straight-through quantiser in it."""
    reverse, ste, half = fns
    return half.apply(ste.apply(reverse.apply(h, 0.5) @ w * 2.0 + xt) * 0.5)


# each case: (graphc forward on x [T, N, 3] and w [3, 3], torch's, x's shape spec)
def _scan(lib, fns, x, w):
    if lib is gc:
        _, ys = gc.scan(lambda h, xt: (lambda n: (n, n))(_cell(fns, h, xt, w)), x[0] * 0, x)
        return (ys * ys).sum()
    h, total = x[0] * 0, 0
    for t in range(x.shape[0]):
        h = _cell(fns, h, x[t], w)
        total = total + (h * h).sum()
    return total


def _fori(lib, fns, x, w):
    if lib is gc:
        return gc.fori_loop(0, 3, lambda i, h: _cell(fns, h, x[0], w), x[1]).sum()
    h = x[1]
    for _ in range(3):
        h = _cell(fns, h, x[0], w)
    return h.sum()


def _while(lib, fns, x, w):  # a run-time trip count: reverse mode
    if lib is gc:
        steps = (x[0, 0, 0] * 0 + 3).to(gc.int64)
        return gc.while_loop(lambda i, h: i < steps, lambda i, h: (i + 1, _cell(fns, h, x[0], w)),
                             (gc.tensor(0), x[1]))[1].sum()
    return _fori(lib, fns, x, w)


def _cond(lib, fns, x, w):  # gradient reversal in one branch, the quantiser in the other
    reverse, ste, half = fns
    if lib is gc:
        branch = gc.cond(x.sum() > 0, lambda v: reverse.apply(v @ w, 2.0), lambda v: half.apply(ste.apply(v) @ w), x)
    else:
        branch = reverse.apply(x @ w, 2.0) if x.sum() > 0 else half.apply(ste.apply(x) @ w)
    return (branch * lib.sin(x)).sum()


def _vmap(lib, fns, x, w):
    if lib is gc:
        per = gc.vmap(lambda xi: _cell(fns, xi[0], xi[1], w).sum(), in_dims=1, fallback="scan")(x)
    else:
        per = torch.stack([_cell(fns, x[0, n], x[1, n], w).sum() for n in range(x.shape[1])])
    return (per * per).sum()


CASES = {"scan": (_scan, (5, "N", 3)), "scan_symbolic": (_scan, ("T", "N", 3)), "fori_loop": (_fori, (2, "N", 3)),
         "while_loop": (_while, (2, "N", 3)), "cond": (_cond, (2, "N", 3)), "vmap": (_vmap, (2, "N", 3))}


class _Net(gc.nn.Module):
    def __init__(self, case):
        super().__init__()
        self.w = gc.nn.Parameter(RNG.normal(size=(3, 3)) * 0.7)
        self.case = case

    def forward(self, x):
        return {"total": CASES[self.case][0](gc, GC_FNS, x, self.w)}


def _torch_gradients(case, x, w):
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    loss = CASES[case][0](torch, TORCH_FNS, xt, wt)
    loss.backward()
    return loss.item(), xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_a_bodys_function_takes_its_backward_as_torch(case):
    model = gc.capture(_Net(case).double(), x=gc.spec("float64", CASES[case][1]))
    grads = gc.grad(model, "total", wrt=["x", "w"])
    length = 5 if case.startswith("scan") else 2
    for sign in (1.0, -1.0):  # the cond case: both branches
        x = np.abs(RNG.normal(size=(length, 4, 3))) * sign
        loss, dx, dw = _torch_gradients(case, x, model.params["w"])
        for backend in BACKENDS:
            out = gc.Session(grads, backend=backend).run({"x": x})
            np.testing.assert_allclose(out["total"], loss, rtol=1e-12, err_msg=backend)
            np.testing.assert_allclose(out["x_grad"], dx, rtol=1e-10, atol=1e-12, err_msg=backend)
            np.testing.assert_allclose(out["w_grad"], dw, rtol=1e-10, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_steps_through_a_scan_cell_equal_torchs(backend):
    model = gc.capture(_Net("scan").double(), x=gc.spec("float64", (5, "N", 3)))
    artifacts = gc.training.generate(model, "total", gc.optim.SGD(0.05, momentum=0.9))
    trainer = gc.Trainer(artifacts, backend=backend)
    w = torch.tensor(model.params["w"], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.05, momentum=0.9)
    for _ in range(3):
        x = RNG.normal(size=(5, 4, 3))
        got = trainer.step({"x": x})
        opt.zero_grad()
        loss = _scan(torch, TORCH_FNS, torch.tensor(x), w)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-10)
    np.testing.assert_allclose(trainer.params["w"], w.detach().numpy(), rtol=1e-10, atol=1e-13)


class _Nested(gc.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return GC_FNS[1].apply(g)


def test_a_function_inside_a_backward_is_refused_naming_both():
    with pytest.raises(gc.CaptureError, match=r"Function ClippedSTE \(applied at .*\) is inside the backward of "
                                              r"gc.autograd.Function _Nested \(applied at .*test_autograd_function_"
                                              r"bodies.py:\d+\)"):
        gc.capture(lambda x: _Nested.apply(x), x=gc.spec("float64", (2, 3)))
