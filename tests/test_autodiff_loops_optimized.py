"""gc.grad of a model gc.optimize rewrote (levels 1 and 2), whose gc.scan / gc.fori_loop / gc.while_loop bodies
hold constants: optimize folds them into body initializers, which the gradient's copies of the body read as
Constants of the graph they land in; checked against torch 2.13 (float64, numpy and ort-cpu)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def _loss(lib, x, w):
    """A scan (reverse mode over its steps), a fori_loop (unrolled) and a while_loop (a run-time trip count),
    each body with constants in it."""
    def cell(c, xt):
        return lib.tanh(c @ w * 0.5 + xt + 1.5)

    def step(h):
        return lib.sin(h * 0.7 + 0.25) @ w

    if lib is gc:
        ys = gc.scan(lambda c, xt: (lambda n: (n, n))(cell(c, xt)), x[0] * 0, x)[1]
        fori = gc.fori_loop(0, 3, lambda i, h: step(h), x[1])
        steps = (x[0, 0, 0] * 0 + 2).to(gc.int64)
        looped = gc.while_loop(lambda i, h: i < steps, lambda i, h: (i + 1, step(h) * 2.0), (gc.tensor(0), x[2]))[1]
    else:
        c, ys = x[0] * 0, []
        for t in range(x.shape[0]):
            c = cell(c, x[t])
            ys.append(c)
        ys, fori, looped = torch.stack(ys), x[1], x[2]
        for _ in range(3):
            fori = step(fori)
        for _ in range(2):
            looped = step(looped) * 2.0
    return (ys * ys).sum() + fori.sum() + (looped * looped).sum()


@pytest.mark.parametrize("level", [1, 2])
def test_gradients_of_optimized_loops_with_body_constants_are_torchs(level):
    model = gc.capture(lambda x, w: {"loss": _loss(gc, x, w)}, x=gc.spec("float64", (3, 4, 3)),
                       w=gc.spec("float64", (3, 3)))
    optimized = gc.optimize(model, level=level)
    bodies = [a.g for n in optimized.proto.graph.node for a in n.attribute if a.g.node]
    assert any(body.initializer for body in bodies)  # what the gradient has to read
    grads = gc.grad(optimized, "loss", wrt=["x", "w"])
    x, w = RNG.normal(size=(3, 4, 3)), RNG.normal(size=(3, 3)) * 0.6
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    _loss(torch, tx, tw).backward()
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(grads, backend=backend).run({"x": x, "w": w})
        np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(out["w_grad"], tw.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
