"""Joins and contractions of Tensors of several dtypes as torch 2.13's: ``cat`` and the functions built on it
(``concat``, ``concatenate``, ``stack``, ``hstack``, ``vstack``, ``row_stack``, ``dstack``, ``column_stack``)
promote every Tensor to ``torch.promote_types`` of all; ``block_diag`` to their ``result_type`` as passed (a
0-D Tensor counts below the others); ``einsum`` promotes the pairs torch's CPU kernel multiplies and refuses a
``bmm`` pair of two dtypes, as torch; ``tensordot`` refuses two dtypes, as torch. Dtypes and values against
torch on the numpy and ort-cpu backends, gradients in float64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)

# name -> fn(M, a, b) of a [2, 3] and b [2, 3], each already cast to its dtype; M is torch or graphc
JOINS = {
    "cat": lambda M, a, b: M.cat([a, b]), "cat dim 1": lambda M, a, b: M.cat([a, b, a], 1),
    "concat": lambda M, a, b: M.concat([a, b]), "concatenate": lambda M, a, b: M.concatenate([b, a], 1),
    "stack": lambda M, a, b: M.stack([a, b], 1), "hstack": lambda M, a, b: M.hstack([a, b]),
    "vstack": lambda M, a, b: M.vstack([a, b]), "row_stack": lambda M, a, b: M.row_stack([a, b]),
    "dstack": lambda M, a, b: M.dstack([a, b]), "column_stack": lambda M, a, b: M.column_stack([a[:, 0], b]),
    "stack of 0-D": lambda M, a, b: M.stack([a[0, 0], b[1, 2]]),
    "hstack of 0-D": lambda M, a, b: M.hstack([a[0, 0], b[0]]),
    "block_diag": lambda M, a, b: M.block_diag(a, b[0], b),
    "block_diag, 0-D below": lambda M, a, b: M.block_diag(b[1, 1], a),
    "einsum ij,ij->ij": lambda M, a, b: M.einsum("ij,ij->ij", a, b),
    "einsum i,j->ij": lambda M, a, b: M.einsum("i,j->ij", a[0], b[1]),
    "einsum ...,...": lambda M, a, b: M.einsum("...,...->...", a, b[0, 1]),
    "einsum ij,ij,ij->j": lambda M, a, b: M.einsum("ij,ij,ij->j", a, b, b),
}
PAIRS = [("float32", "float64"), ("int64", "float32"), ("bool", "int8"), ("uint8", "int8"), ("int32", "float16"),
         ("float16", "bfloat16"), ("float64", "int32")]


def _draw(dtype):
    values = RNG.integers(0, 5, (2, 3)) + (0.5 if dtype.startswith(("float", "bfloat")) else 0)
    return values.astype(np.float64)


def _torch_or_none(name, a, b):
    try:
        return JOINS[name](torch, a, b)
    except RuntimeError:  # a bmm pair of two dtypes (float32 by bfloat16), or of bool Tensors
        return None


@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_joins_promote_as_torch(pair, tmp_path):
    """Where torch computes, the dtypes and values are its; where it refuses, graphc refuses too."""
    da, db = pair
    feeds = {"a": _draw(da), "b": _draw(db)}
    ta, tb = (torch.from_numpy(feeds[k]).to(getattr(torch, d)) for k, d in (("a", da), ("b", db)))
    want = {n: _torch_or_none(n, ta, tb) for n in JOINS}
    names = [n for n, w in want.items() if w is not None]

    def cast(a, b):
        return a.to(getattr(gc, da)), b.to(getattr(gc, db))

    def fn(a, b):
        a, b = cast(a, b)
        return {n: JOINS[n](gc, a, b).to(gc.float64) for n in names} | {f"{n} dtype": JOINS[n](gc, a, b) for n in names}

    for n in set(JOINS) - set(names):
        with pytest.raises(gc.CaptureError, match="one dtype"):
            gc.capture(lambda a, b, n=n: JOINS[n](gc, *cast(a, b)), a=gc.spec("float64", (2, 3)),
                       b=gc.spec("float64", (2, 3)))
    model = gc.capture(fn, a=gc.spec("float64", (2, 3)), b=gc.spec("float64", (2, 3)))
    model.save(tmp_path / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)
        for n in names:
            assert str(got[f"{n} dtype"].dtype) == str(want[n].dtype).removeprefix("torch."), (n, backend)
            np.testing.assert_allclose(got[n], want[n].double().numpy(), rtol=1e-3, err_msg=f"{n} on {backend}")


# name -> fn(M, x) of a float64 x [2, 3]: gradients to x through a join that promotes
GRADIENTS = {
    "cat f32, f64": lambda M, x: M.cat([x.float() * 2, x]),
    "stack i64, f64": lambda M, x: M.stack([x, M.ones_like(x).long()]),
    "block_diag 0-D f64, f32": lambda M, x: M.block_diag(x[0, 1], x.float()).double() * x[1, 2],
    "einsum f32 * f64": lambda M, x: M.einsum("ij,ij->ij", x.float(), x * x),
    "einsum ij,ij,ij->j": lambda M, x: M.einsum("ij,ij,ij->j", x.float() * 0 + 2, x, x.sin()),
}


@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_gradients_through_promoting_joins_are_torchs(case):
    x = RNG.uniform(0.5, 2.0, (2, 3))
    tx = torch.tensor(x, requires_grad=True)
    want = GRADIENTS[case](torch, tx)
    c = RNG.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()

    def fn(x, c):
        out = GRADIENTS[case](gc, x)
        return {"out": out, "loss": gc.sum(out * c)}

    model = gc.grad(gc.capture(fn, x=gc.spec("float64", (2, 3)), c=gc.spec("float64", c.shape)), "loss", wrt=["x"])
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "c": c})
        assert got["out"].dtype == want.detach().numpy().dtype, (case, backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(got["x_grad"], tx.grad.numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("fn, message", [
    (lambda a, b: gc.einsum("ij,kj->ik", a, b), r"Einsum\(float32\[2,3\], float64\[2,3\]\): torch's CPU einsum "
                                                r"contracts these two by bmm, which takes one dtype, got float32 and "
                                                r"float64; cast one with \.astype\(\) at .*test_dsl_promotion_joins"),
    (lambda a, b: gc.einsum("ij,j->i", b.long(), a[0]), "bmm, which takes one dtype, got int64 and float32"),
    (lambda a, b: gc.tensordot(a, b, dims=([1], [1])), r"tensordot takes two Tensors of one dtype \(torch's does not "
                                                       r"promote\), got float32 and float64"),
    (lambda a, b: gc.meshgrid(a[0], b[0]), "dtype mismatch float32 vs float64"),
])
def test_where_torch_refuses_two_dtypes_the_error_names_them(fn, message):
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(fn, a=gc.spec("float32", (2, 3)), b=gc.spec("float64", (2, 3)))
