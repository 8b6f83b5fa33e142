"""Gradients of slices with constant bounds (``y[:, 1:]``, ``y[:, :-1]``, ``y[..., :4]``, reversed and strided) of
a value whose dims are symbolic: a Pad of dy by pads read off its shape at run time, not a scatter over all of
y's positions (a step past 1 on the last axis excepted: there the scatter is faster). One capture at two sizes,
and a static capture, against torch 2.13 float64 and float64 finite differences, on numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(3)
BACKENDS = ("numpy", "ort-cpu")

# (row, column, feature) slices of y [B, T, 6]: plain shifts, negative and missing bounds, bounds past the axis
# (clamped as Slice clamps), empty slices, steps of either sign off the last axis, and one on it
SLICES = (
    (slice(None), slice(1, None), slice(None)),
    (slice(None), slice(None, -1), slice(None)),
    (Ellipsis, slice(None, 4)),
    (slice(1, None), slice(-3, None), slice(2, -1)),
    (slice(None), slice(None, None, -1), slice(None)),
    (slice(-1, None, -2), slice(-2, 0, -1), slice(None, 4)),
    (slice(None), slice(None, None, 2), slice(1, None)),
    (slice(None, -100), slice(1, -1, 3), slice(None)),
    (slice(None), slice(20, None), slice(None)),
    (slice(-100, None), slice(3, 1), slice(-100, 100)),
    (slice(None), slice(None), slice(1, None, 3)),  # a step past 1 on the last axis: scattered back
)


class _Net(nn.Module):
    """sum_k (k + 1) * sum(y[slice_k] ** 2), y = table[:B, :T] * x of x's [B, T] (symbolic where x's are)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(RNG.standard_normal((4, 13, 6)))

    def forward(self, x):
        B, T = x.shape[0], x.shape[1]  # noqa: N806 - torch code's names
        y = self.table[:B, :T] * x
        return sum((k + 1) * (y[s] ** 2).sum() for k, s in enumerate(SLICES))


def _torch_loss(torch, table, x):
    """The same loss in torch: each slice picked by index_select (torch slices take no negative step)."""
    y = table[:x.shape[0], :x.shape[1]] * torch.from_numpy(x)
    loss = 0
    for k, s in enumerate(SLICES):
        s = (slice(None),) * (3 - len(s) + 1) + s[1:] if s[0] is Ellipsis else s
        picked = y
        for axis, part in enumerate(s):
            picked = picked.index_select(axis, torch.tensor(np.arange(picked.shape[axis])[part].copy()))
        loss = loss + (k + 1) * (picked ** 2).sum()
    return loss


@pytest.mark.parametrize("spec, sizes", [(("B", "T", 6), [(2, 5), (4, 13)]), ((3, 7, 6), [(3, 7)])],
                         ids=["symbolic", "static"])
def test_constant_bound_slices_pad_dy_back_as_torch_and_finite_differences(spec, sizes):
    torch = pytest.importorskip("torch")
    net = _Net().double()
    grads = gc.grad(gc.capture(net, x=gc.spec("float64", spec)), "output")
    ops = [n.op_type for n in grads.ir.graph]
    assert ops.count("ScatterElements") == 1 and ops.count("ScatterND") == 0  # the last axis' step of 3
    table0 = net.state_dict()["table"]
    for b, t in sizes:
        x = RNG.standard_normal((b, t, 6))
        table = torch.tensor(table0, requires_grad=True)
        loss = _torch_loss(torch, table, x)
        loss.backward()
        direction, eps = RNG.standard_normal(table0.shape), 1e-6
        for backend in BACKENDS:
            session = gc.Session(grads, backend=backend)
            got = session.run({"x": x})
            np.testing.assert_allclose(got["output"], loss.item(), rtol=1e-13, err_msg=f"{backend} {b}x{t}")
            np.testing.assert_allclose(got["table_grad"], table.grad.numpy(), rtol=1e-13, atol=1e-13,
                                       err_msg=f"{backend} {b}x{t}")
            plus, minus = (session.run({"x": x, "table": table0 + sign * eps * direction})["output"]
                           for sign in (1, -1))
            np.testing.assert_allclose((plus - minus) / (2 * eps), np.sum(got["table_grad"] * direction),
                                       rtol=1e-7, err_msg=f"{backend} {b}x{t}")
