"""``gc.vmap``'s rules for what ran as the Scan over the examples before: a Loop's per-step outputs (the
tape ``gc.func.grad`` records of a ``gc.while_loop`` or a ``gc.fori_loop`` of a run-time trip count), its
number of steps per example or the same for all, and a Scan along axes other than 0. Each against
torch (per-example autograd, double backward included, or ``torch.vmap``) on numpy and onnxruntime,
captured with the fallback's warning an error and no Scan over the examples in the graph."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl import ops
from graphc.dsl.builder import current
from graphc.dsl.control import trace_subgraph
from tests.test_dsl_vmap_control import _no_fallback

torch = pytest.importorskip("torch")

BACKENDS = ("numpy", "ort-cpu")


class _Net(gc.nn.Module):
    """``fn(x, *rest)`` of the parameter ``x`` and its ``loss``, ``sum(out * c)``."""

    def __init__(self, fn, x):
        super().__init__()
        self.fn, self.x = fn, gc.nn.Parameter(x, dtype="float64")

    def forward(self, c, **rest):
        out = self.fn(self.x, **rest)
        return {"out": out, "loss": (out * c).sum()}


def _check(fn, x, c, want, want_grad, **rest):
    """``fn``'s values and the gradient of ``sum(fn * c)`` by ``x``, rewritten (no fallback), on both
    backends."""
    model = gc.grad(_no_fallback(_Net(fn, x), c=c, **rest), "loss")
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({"c": c, "x": x, **rest})
        np.testing.assert_allclose(got["out"], want, rtol=1e-11, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x_grad"], want_grad, rtol=1e-10, atol=1e-11, err_msg=backend)


def _per_example(torch_loss, x, c, *rest):
    """Each example's gradient of ``torch_loss`` and the gradient of ``sum(that * c)`` (double
    backward), by torch.autograd on the example alone."""
    grads, second = [], []
    for xb, cb in zip(torch.from_numpy(x), torch.from_numpy(c)):
        xb.requires_grad_(True)
        g, = torch.autograd.grad(torch_loss(xb, *rest), xb, create_graph=True)
        gg, = torch.autograd.grad((g * cb).sum(), xb)
        grads.append(g.detach().numpy())
        second.append(gg.numpy())
    return np.stack(grads), np.stack(second)


# -- a Loop's per-step outputs, its number of steps per example ---------------------------------------


def _loss(x):
    y = gc.while_loop(lambda y: (y * y).sum() < 30.0, lambda y: y * 1.3 + y.sin() * 0.1, x)
    return (y * y).sum()


def _torch_loss(x):
    y, steps = x, 0
    while float((y * y).sum().detach()) < 30.0:
        y, steps = y * 1.3 + y.sin() * 0.1, steps + 1
    _STEPS.append(steps)
    return (y * y).sum()


_STEPS: list[int] = []


def test_vmap_of_grad_of_a_while_loop_with_steps_per_example():
    """The backward Loop of each example's own number of steps (0 for the first) reads its own tape:
    per-example gradients and their gradients (the tape's zero rows for steps an example did not run
    reach neither) as torch's per example, to 1e-11, and no Scan over the examples."""
    rng = np.random.default_rng(8)
    x, c = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    x[0] *= 5  # no step
    _STEPS.clear()
    want, want_grad = _per_example(_torch_loss, x, c)
    assert _STEPS[0] == 0 and len(set(_STEPS)) >= 3, _STEPS
    _check(lambda x: gc.vmap(gc.func.grad(_loss))(x), x, c, want, want_grad)


def _halving_loop(x):
    """A Loop while ``|y|^2 > 1`` halving ``y``, its per-step ``y`` as a scan output (as the tape of
    ``gc.func.grad`` is), built by hand: ``gc.while_loop`` has none."""
    def body(i, keep, y):
        y = y * 0.5
        return [(y * y).sum() > 1.0, y, y]
    graph, _, _ = trace_subgraph(current(), body, [], [("i", "int64", []), ("keep", "bool", []), ("y", x.dtype, x.shape)],
                                 "loop_body")
    return ops.emit("Loop", [None, (x * x).sum() > 1.0, x], {"body": graph}, 2)


def test_a_loops_per_step_outputs_read_by_an_op_without_a_rule_run_as_the_scan():
    """The rows past an example's own steps are zeros: a mean over the steps would count them, so an op
    other than Shape and Gather that reads them sends the body to the Scan (correct), with the warning
    naming it."""
    x = np.random.default_rng(2).standard_normal((4, 3))
    x *= np.asarray([[1.5], [4.0], [9.0], [3.0]]) / np.linalg.norm(x, axis=1, keepdims=True)  # 1, 2, 4, 2 steps
    want = []
    for y in x:
        ys = []
        while (y * y).sum() > 1.0:
            y = y * 0.5
            ys.append(y)
        want.append(np.mean(ys, 0))
    with pytest.warns(gc.PerformanceWarning, match=r"ReduceMean at .*reads a Loop's per-step outputs"):
        model = gc.capture(lambda x: gc.vmap(lambda a: _halving_loop(a)[1].mean(0))(x), x=gc.spec("float64", ("N", 3)))
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], np.stack(want),
                                   rtol=1e-14, err_msg=backend)


# -- a Loop's per-step outputs, one number of steps for all ------------------------------------------


def test_vmap_of_grad_of_a_fori_loop_of_a_run_time_trip_count():
    """A trip count the same for all examples but known only at run time: the tape Loop rewritten
    with its per-step outputs stacked ``(T, B, ...)``, then moved to ``(B, T, ...)``."""
    rng = np.random.default_rng(3)
    x, c, w = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal((3, 3)) * 0.5
    n = np.asarray(4, np.int64)

    def loss(x, n):
        return gc.fori_loop(0, n, lambda i, y: gc.tanh(y @ w) + x * 0.5, x).sum()

    def torch_loss(x, n):
        y = x
        for _ in range(int(n)):
            y = torch.tanh(y @ torch.from_numpy(w)) + x * 0.5
        return y.sum()

    want, want_grad = _per_example(torch_loss, x, c, n)
    _check(lambda x, n: gc.vmap(gc.func.grad(loss), in_dims=(0, None))(x, n), x, c, want, want_grad, n=n)


# -- Scan along axes other than 0 --------------------------------------------------------------------


def _scan_along(xs, h0, w, in_axis: int, out_axis: int):
    """A tanh cell over ``xs`` along ``in_axis``, its per-step outputs stacked along ``out_axis``: an
    ONNX Scan with those ``scan_input_axes``/``scan_output_axes`` (``gc.scan`` scans axis 0)."""
    def step(h, x):
        h = gc.tanh(h @ w + x)
        return [h, h * 2.0]
    h0, w, x_step = ops.constant(h0), ops.constant(w), [d for i, d in enumerate(xs.shape) if i != in_axis % xs.ndim]
    body, _, _ = trace_subgraph(current(), step, [], [("h", h0.dtype, h0.shape), ("x", xs.dtype, x_step)], "scan_body")
    return ops.emit("Scan", [h0, xs], {"body": body, "num_scan_inputs": 1, "scan_input_axes": [in_axis],
                                       "scan_output_axes": [out_axis]}, 2)


@pytest.mark.parametrize("in_axis,out_axis", [(1, 0), (0, 1), (-1, -1)])
def test_scan_along_other_axes(in_axis, out_axis):
    """Transposes move the scanned axis first and the stacked steps to their axis: values and
    gradients as torch.vmap of the loop along those axes."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 5, 3) if in_axis == 0 else (4, 3, 5))  # per example 5 steps of 3
    w, h0 = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal(3)

    def one(xs):
        h, hs = torch.from_numpy(h0), []
        for x_t in (xs if in_axis == 0 else xs.T):
            h = torch.tanh(h @ torch.from_numpy(w) + x_t)
            hs.append(h * 2.0)
        return torch.stack(hs, dim=out_axis)

    xt = torch.from_numpy(x).requires_grad_(True)
    ys = torch.vmap(one)(xt)
    c = rng.standard_normal(ys.shape)
    grad, = torch.autograd.grad((ys * torch.from_numpy(c)).sum(), xt)
    _check(lambda x: gc.vmap(lambda xs: _scan_along(xs, h0, w, in_axis, out_axis)[1])(x), x, c, ys.detach().numpy(),
           grad.numpy())
