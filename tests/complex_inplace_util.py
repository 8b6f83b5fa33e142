"""The model and torch twin both complex in-place test files run: a clone of a complex Parameter written in
place by ``fn``, its loss the (real, imag) pair weighed by ``r``, returned with ``parts`` of the written clone."""

from __future__ import annotations

import graphc as gc


class Written(gc.nn.Module):
    """A clone of a complex Parameter written in place by ``fn``; outputs the loss, then ``parts(w)``."""

    def __init__(self, fn, z, parts):
        super().__init__()
        self.fn, self.parts, self.z = fn, parts, gc.nn.Parameter(z, dtype=gc.complex128)

    def forward(self, r):
        w = self.z * 1
        self.fn(gc, w)
        return ((gc.view_as_real(w) * r).sum(), *self.parts(w))


def torch_written(torch, fn, z, r, parts) -> list:
    """torch's ``Written``: the loss, ``parts`` of the written clone, the gradient of ``z`` as (real, imag) pairs."""
    zt = torch.tensor(z, requires_grad=True)
    w = zt * 1
    fn(torch, w)
    loss = (torch.view_as_real(w) * torch.from_numpy(r)).sum()
    loss.backward()
    return [loss.item(), *(t.detach().numpy() for t in parts(w)), torch.view_as_real(zt.grad).numpy()]
