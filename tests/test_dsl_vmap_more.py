"""``gc.vmap``'s rules for what used to fall back to the Scan over the examples: ``gc.func.hessian`` and
``jacfwd`` (a vmap of a vmap's gradient, whose broadcast gradients reduce over computed axes); a Loop of
a per-example trip count or condition. Values
against torch.func on numpy and onnxruntime, gradients against torch.autograd (``_check``); each capture
with the fallback's warning an error (``_no_fallback``)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl import ops
from graphc.dsl.builder import current
from graphc.dsl.control import run_loop, trace_subgraph
from tests.test_dsl_vmap_control import _no_fallback
from tests.test_dsl_vmap_rules import _check, _data
from tests.torch_grad_util import TorchNS

torch = pytest.importorskip("torch")

# -- hessian, jacfwd ---------------------------------------------------------------------------------

_W = _data((3, 4), seed=7)[0]

def _c(M, a: np.ndarray):
    """A constant of the DSL's (``M`` is gc) or torch's."""
    return a if M is gc else torch.from_numpy(a)


FUNCS = {  # name -> scalar f(M, x) of x (3,)
    "elementwise": lambda M, x: (M.sin(x) * x).sum(),
    "matmul": lambda M, x: M.tanh(x @ _c(M, _W)).sum(),
    "softmax": lambda M, x: (M.softmax(M.tanh(x @ _c(M, _W)) * 2.0, -1) * _c(M, np.arange(4.0))).sum(),
}


def _transformed(name: str, transform: str):
    """``transform`` (hessian or jacfwd) of ``FUNCS[name]`` as a ``_check`` function of ``x``."""
    def fn(M, x):
        if isinstance(M, TorchNS):
            return getattr(torch.func, transform)(lambda a: FUNCS[name](torch, a))(x)
        return getattr(gc.func, transform)(lambda a: FUNCS[name](gc, a))(x)
    return fn


@pytest.mark.parametrize("transform", ["hessian", "jacfwd"])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_hessian_and_jacfwd_batch_without_the_scan(name, transform):
    """No fallback (hessian fell back "at an Expand of unknown rank": the rank of a gradient's ReduceSum
    over computed axes with keepdims was not inferred); values and their gradients against torch. On
    onnxruntime CPU, hessian of x (16,) float64: 0.031-0.036 ms batched vs 0.15-0.18 ms as the Scan."""
    x = _data((3,), seed=8)[0]
    fn = _transformed(name, transform)
    for feeds in ({"x": x}, {"x": gc.spec("float64", (3,))}):
        model = _no_fallback(lambda x: fn(gc, x), **feeds)
        want = fn(TorchNS(torch), torch.from_numpy(x)).numpy()
        for backend in ["numpy", "ort-cpu"]:
            got = gc.Session(model, backend=backend).run({"x": x})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=backend)
    _check(fn, [x])


# -- Loop of a per-example trip count or condition -----------------------------------------------------

_TRIPS = np.array([0, 1, 3, 2, 5])


def _fori(M, x):
    """Each example's own number of steps ``_TRIPS``: torch as a Python loop over the examples."""
    if isinstance(M, TorchNS):
        rows = []
        for a, n in zip(x, _TRIPS):
            c = a
            for i in range(n):
                c = torch.tanh(c) * 1.5 + a * i
            rows.append(c)
        return torch.stack(rows)
    def one(a, n):
        return gc.fori_loop(0, n, lambda i, c: gc.tanh(c) * 1.5 + a * i.to("float64"), a)
    return gc.vmap(one, fallback="error")(x, gc.tensor(_TRIPS))


def _while(cond_fn, body_fn, init):
    """``while cond_fn(c): c = body_fn(c)`` as a Loop whose body computes its condition (no trip count)."""
    builder = current()
    graph, _, _ = trace_subgraph(builder, lambda i, go, c: [cond_fn(body_fn(c)), body_fn(c)], [],
                                 [("iter", "int64", []), ("cond", "bool", []), ("c", init.dtype, init.shape)],
                                 "loop_body")
    return ops.emit("Loop", [None, cond_fn(init), init], {"body": graph}, 1, out_types=[(init.dtype, init.shape)],
                    evaluator=lambda arrays: run_loop(builder, graph, arrays))


def _doubling(M, x, w):
    """Per example, ``c = c * w + x`` while ``c``'s sum is under 8 (0 to 5 steps here)."""
    if isinstance(M, TorchNS):
        rows = []
        for a in x:
            c = a
            while c.sum() < 8.0:
                c = c * w + a
            rows.append(c)
        return torch.stack(rows)
    return gc.vmap(lambda a: _while(lambda c: c.sum() < 8.0, lambda c: c * w + a, a), fallback="error")(x)


def test_loop_of_a_per_example_trip_count():
    """Runs to the largest trip count, each example's carry frozen after its own (one of none)."""
    x, = _data((5, 3), seed=9)
    _check(_fori, [x])
    _no_fallback(lambda x: _fori(gc, x), x=gc.spec("float64", (5, 3)))


def test_loop_of_a_per_example_condition():
    """A while loop whose body computes its condition: until every example's fails, each frozen once
    its own does (the steps differ per example)."""
    x = np.abs(_data((5, 2), seed=10)[0]) + np.array([[0.1], [4.5], [1.0], [0.3], [2.0]])
    w = np.array([1.5, 2.0])
    steps = []
    for a in x:
        c, k = a, 0
        while c.sum() < 8.0:
            c, k = c * w + a, k + 1
        steps.append(k)
    assert len(set(steps)) > 2, steps
    _check(_doubling, [x, w])
    _no_fallback(lambda x: _doubling(gc, x, w), x=gc.spec("float64", ("N", 2)))


def test_a_fallback_scan_the_outer_vmap_hoists_is_evaluated_eagerly():
    """An inner vmap's fallback Scan (Det has no rule) over values the outer vmap does not map is
    hoisted and, in an eager capture, evaluated: the numpy kernel was handed its body as a raw graph
    ("'Graph' object has no attribute 'output_names'"), as gc.func.hessian without rules hit."""
    rng = np.random.default_rng(7)
    mats, x = rng.standard_normal((3, 2, 2)), rng.standard_normal((4, 3))
    model = gc.capture(lambda x: gc.vmap(lambda r: r * gc.vmap(gc.linalg.det, fallback="scan")(gc.asarray(mats)))(x),
                       x=x)
    assert "Scan" in {n.op_type for n in model.proto.graph.node}
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"], x * np.linalg.det(mats),
                               rtol=1e-12)
