"""Two Tensors of different categories promote as torch's: the bool or integer one takes the other's dtype
(``x + gc.arange(3)`` is float for a float ``x``), in the elementwise binary ops, comparisons and ``gc.where``;
values and gradients against torch 2.13 in float64 on the numpy and ort-cpu backends (two widths of one
category: tests/test_dsl_promotion_table.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)

# name -> fn(M, x, i) of a float64 x [3, 4] and an int64 i [4]; M is torch or graphc
CASES = {
    "float + arange": lambda M, x, i: x + M.arange(4),
    "int - float": lambda M, x, i: i - x,
    "float * bool": lambda M, x, i: x * (i > 0),
    "float % int": lambda M, x, i: x % (i + 5),
    "int32 + bool, times float": lambda M, x, i: x * (i.int() + (i > 0)),
    "float < int": lambda M, x, i: M.where(x < i, x, 2 * x),
    "where(float, int)": lambda M, x, i: M.where(x > 0, x, i),
    "float max int": lambda M, x, i: M.maximum(x, i),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_and_gradient_are_torchs(case, tmp_path):
    x = RNG.standard_normal((3, 4))
    i = np.array([-2, 0, 1, 3])
    c = RNG.standard_normal((3, 4))
    tx = torch.tensor(x, requires_grad=True)
    want = CASES[case](torch, tx, torch.from_numpy(i))
    (want * torch.from_numpy(c)).sum().backward()

    def fn(x, i, c):
        out = CASES[case](gc, x, i)
        return {"out": out, "loss": gc.sum(out * c)}

    model = gc.grad(gc.capture(fn, x=gc.spec("float64", (3, 4)), i=gc.spec("int64", (4,)),
                               c=gc.spec("float64", (3, 4))), "loss", wrt=["x"])
    model.save(tmp_path / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "i": i, "c": c})
        assert got["out"].dtype == np.float64, (case, backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-15, atol=1e-15)
        np.testing.assert_allclose(got["x_grad"], tx.grad.numpy(), rtol=1e-15, atol=1e-15)
