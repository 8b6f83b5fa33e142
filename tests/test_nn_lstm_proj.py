"""``nn.LSTM(proj_size=P)`` (torch's LSTM with projections, written out step by step) against torch 2.13 in
float64 on numpy and ort-cpu: torch's parameter names and shapes (``weight_hh [4H, P]``, ``weight_hr_l{k}{_reverse}
[P, H]``) loading torch's state_dict strictly; the output, ``h_n`` and ``c_n``, and the gradients of the input,
the initial states and every parameter; multi-layer, bidirectional, batch_first, unbatched and packed runs."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.nn.utils import rnn as gr

torch = pytest.importorskip("torch")
from torch.nn.utils import rnn as tr  # noqa: E402

RNG = np.random.default_rng(6)
IN, HID, PROJ, T, N = 3, 5, 2, 4, 3

# (id, constructor keyword arguments, initial states given, packed lengths or None)
CASES = [
    ("one-layer", {}, False, None),
    ("two-layers-bidirectional-states", {"num_layers": 2, "bidirectional": True}, True, None),
    ("batch-first-no-bias", {"batch_first": True, "bias": False}, True, None),
    ("packed-bidirectional", {"bidirectional": True, "num_layers": 2}, False, [4, 2, 3]),
    ("packed-batch-first-states", {"batch_first": True}, True, [1, 4, 2]),
]


def _pair(kwargs):
    ours = gc.nn.LSTM(IN, HID, proj_size=PROJ, dtype="float64", **kwargs).init_parameters(seed=2)
    theirs = torch.nn.LSTM(IN, HID, proj_size=PROJ, dtype=torch.float64, **kwargs)
    state = ours.state_dict()
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert list(state) == list(want) and {k: v.shape for k, v in state.items()} == want
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    return ours, theirs


class _Net(gc.nn.Module):
    """``sum(out * c) + sum(h_n * ch) + sum(c_n * cc)`` of the LSTM on the Parameters ``x`` (and h0, c0)."""

    def __init__(self, lstm, x, states, lengths):
        super().__init__()
        self.m, self.x, self.lengths = lstm, gc.nn.Parameter(x, dtype="float64"), lengths
        if states is not None:
            self.h0, self.c0 = (gc.nn.Parameter(s, dtype="float64") for s in states)
        self.given = states is not None

    def forward(self, c, ch, cc):
        x = self.x if self.lengths is None else gr.pack_padded_sequence(self.x, self.lengths, self.m.batch_first,
                                                                       enforce_sorted=False)
        out, (h, cn) = self.m(x, (self.h0, self.c0) if self.given else None)
        if self.lengths is not None:
            out, _ = gr.pad_packed_sequence(out, batch_first=self.m.batch_first)
        return {"out": out, "h_n": h, "c_n": cn, "loss": gc.sum(out * c) + gc.sum(h * ch) + gc.sum(cn * cc)}


@pytest.mark.parametrize("name,kwargs,given,lengths", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, kwargs, given, lengths):
    ours, theirs = _pair(kwargs)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    first = kwargs.get("batch_first", False)
    x = RNG.standard_normal((N, T, IN) if first else (T, N, IN))
    states = (RNG.standard_normal((layers, N, PROJ)), RNG.standard_normal((layers, N, HID))) if given else None
    tx = torch.tensor(x, requires_grad=True)
    ts = None if states is None else tuple(torch.tensor(s, requires_grad=True) for s in states)
    run_in = tx if lengths is None else tr.pack_padded_sequence(tx, lengths, first, enforce_sorted=False)
    out, (h, cn) = theirs(run_in, ts)
    if lengths is not None:
        out, _ = tr.pad_packed_sequence(out, batch_first=first)
    c, ch, cc = (RNG.standard_normal(tuple(t.shape)) for t in (out, h, cn))
    sum((t * torch.from_numpy(w)).sum() for t, w in ((out, c), (h, ch), (cn, cc))).backward()
    grads = gc.grad(gc.capture(_Net(ours, x, states, lengths), c=c, ch=ch, cc=cc), "loss")
    want = {"out": out, "h_n": h, "c_n": cn, "x_grad": tx.grad,
            **({} if ts is None else {"h0_grad": ts[0].grad, "c0_grad": ts[1].grad}),
            **{f"m.{k}_grad": p.grad for k, p in theirs.named_parameters()}}
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"c": c, "ch": ch, "cc": cc})
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value.detach().numpy(), rtol=1e-10, atol=1e-13,
                                       err_msg=f"{backend} {key}")


def test_an_unbatched_input_runs_as_torchs():
    ours, theirs = _pair({"num_layers": 2})
    x = RNG.standard_normal((T, IN))
    out, (h, cn) = theirs(torch.from_numpy(x))
    model = gc.capture(lambda x: (lambda r: {"out": r[0], "h": r[1][0], "c": r[1][1]})(ours(x)), x=x)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})
        for key, value in (("out", out), ("h", h), ("c", cn)):
            np.testing.assert_allclose(got[key], value.detach().numpy(), rtol=1e-12, atol=1e-15, err_msg=backend)


def test_repr_and_refusals():
    for kwargs in ({}, {"num_layers": 2, "bidirectional": True, "batch_first": True}):
        assert repr(gc.nn.LSTM(IN, HID, proj_size=PROJ, **kwargs)) == repr(torch.nn.LSTM(IN, HID, proj_size=PROJ,
                                                                                           **kwargs))
    for bad in (HID, -1, 1.5):
        with pytest.raises(gc.GraphError, match=rf"LSTM proj_size={bad!r} must be an int in \[0, hidden_size=5\)"):
            gc.nn.LSTM(IN, HID, proj_size=bad)
    layer = gc.nn.LSTM(IN, HID, proj_size=PROJ)
    with pytest.raises(gc.GraphError, match=r"LSTM.*proj_size=2 writes each step out and needs a static sequence"):
        gc.capture(lambda x: layer(x)[0], x=gc.spec("float32", ("T", 2, IN)))
