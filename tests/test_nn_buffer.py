"""``gc.nn.Buffer`` (torch 2.x's ``nn.Buffer``: registers a buffer by assignment) against torch 2.13, and
``gc.nn.DataParallel``'s refusal pointing to ``gc.Trainer(..., workers=N)``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")


def _pair(nn, zeros):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Buffer(zeros(3) + 2)
            self.cache = nn.Buffer(zeros(3), persistent=False)

        def forward(self, x):
            return x * self.scale + self.cache

    return Scaled()


def test_buffer_assignment_registers_buffers_as_torch_s():
    """Persistent in state_dict, non-persistent out of it; both in named_buffers, no parameter; the forward reads them."""
    ours = _pair(gc.nn, lambda n: gc.zeros(n, dtype="float64"))
    theirs = _pair(torch.nn, lambda n: torch.zeros(n, dtype=torch.float64))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["scale"]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()] == ["scale", "cache"]
    assert not list(ours.parameters())
    x = np.arange(3.0)
    got = gc.Session(gc.capture(ours, x=gc.spec("float64", (3,))), backend="numpy").run({"x": x})
    np.testing.assert_array_equal(next(iter(got.values())), theirs(torch.from_numpy(x)).numpy())


def test_data_parallel_is_refused_with_the_way_out():
    with pytest.raises(NotImplementedError, match=r"gc.Trainer\(artifacts, workers=N\)"):
        gc.nn.DataParallel(gc.nn.Linear(2, 2))
