"""``nn.LSTM(proj_size=P)`` (torch's LSTM with projections: written out step by step up to 4 steps, longer a Scan
per layer and direction whose backward is a Scan too) against torch 2.13 in float64 on numpy and ort-cpu: torch's
parameter names and shapes (``weight_hh [4H, P]``, ``weight_hr_l{k}{_reverse} [P, H]``) loading torch's state_dict
strictly; the output, ``h_n`` and ``c_n``, and the gradients of the input, the initial states and every parameter;
multi-layer, bidirectional, batch_first, unbatched and packed runs at T=4 and 8; a symbolic length (a Scan per layer
and direction) at two lengths from one capture."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.nn.rnn_projected import MAX_WRITTEN_OUT_STEPS
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


def _torch_run(theirs, x, states, lengths, first):
    """torch's ``out``, ``h_n``, ``c_n`` and the gradients of the loss ``_Net`` takes (``x_grad``, ``h0_grad``,
    ``c0_grad``, ``m.<param>_grad``), and the cotangents ``c, ch, cc`` it drew."""
    tx = torch.tensor(x, requires_grad=True)
    ts = None if states is None else tuple(torch.tensor(s, requires_grad=True) for s in states)
    run_in = tx if lengths is None else tr.pack_padded_sequence(tx, lengths, first, enforce_sorted=False)
    out, (h, cn) = theirs(run_in, ts)
    if lengths is not None:
        out, _ = tr.pad_packed_sequence(out, batch_first=first)
    c, ch, cc = (RNG.standard_normal(tuple(t.shape)) for t in (out, h, cn))
    theirs.zero_grad()
    sum((t * torch.from_numpy(w)).sum() for t, w in ((out, c), (h, ch), (cn, cc))).backward()
    want = {"out": out, "h_n": h, "c_n": cn, "x_grad": tx.grad,
            **({} if ts is None else {"h0_grad": ts[0].grad, "c0_grad": ts[1].grad}),
            **{f"m.{k}_grad": p.grad for k, p in theirs.named_parameters()}}
    return {k: v.detach().numpy() for k, v in want.items()}, {"c": c, "ch": ch, "cc": cc}


def _layers(kwargs):
    """The number of layers times directions of the LSTM ``kwargs`` builds."""
    return kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)


def _inputs(kwargs, steps):
    """A random input of ``steps`` steps and initial states (or None) for the LSTM ``kwargs`` builds."""
    layers = _layers(kwargs)
    x = RNG.standard_normal((N, steps, IN) if kwargs.get("batch_first", False) else (steps, N, IN))
    return x, (RNG.standard_normal((layers, N, PROJ)), RNG.standard_normal((layers, N, HID)))


def _check(grads, feeds, want):
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run(feeds)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-10, atol=1e-13, err_msg=f"{backend} {key}")


@pytest.mark.parametrize("steps", [T, 8], ids=["written-out", "scan"])
@pytest.mark.parametrize("name,kwargs,given,lengths", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, kwargs, given, lengths, steps):
    """A static length: written out up to ``MAX_WRITTEN_OUT_STEPS`` (4), past it a Scan per layer and direction
    whose backward is a Scan too (reverse mode, not unrolled)."""
    ours, theirs = _pair(kwargs)
    x, states = _inputs(kwargs, steps)
    states = states if given else None
    if lengths is not None:
        lengths = [min(n, steps) if n < T else steps for n in lengths]  # the longest fills the steps
    want, feeds = _torch_run(theirs, x, states, lengths, kwargs.get("batch_first", False))
    grads = gc.grad(gc.capture(_Net(ours, x, states, lengths), **feeds), "loss")
    scans = [n.op_type for n in grads.ir.graph].count("Scan")
    assert scans == (0 if steps <= MAX_WRITTEN_OUT_STEPS else 2 * _layers(kwargs))  # a forward and a backward
    _check(grads, feeds, want)


class _SymbolicNet(_Net):
    """``_Net`` over the first T steps of ``x``, T read off the cotangent ``c`` at run time (a symbolic length);
    packed by the lengths fed."""

    def forward(self, c, ch, cc, lengths=None):
        first = self.m.batch_first
        steps = c.shape[1 if first else 0]
        x = self.x[:, :steps] if first else self.x[:steps]
        if lengths is not None:
            x = gr.pack_padded_sequence(x, lengths, first, enforce_sorted=False)
        out, (h, cn) = self.m(x, (self.h0, self.c0) if self.given else None)
        if lengths is not None:
            out, _ = gr.pad_packed_sequence(out, batch_first=first)
        return {"out": out, "h_n": h, "c_n": cn, "loss": gc.sum(out * c) + gc.sum(h * ch) + gc.sum(cn * cc)}


@pytest.mark.parametrize("name,kwargs,given,lengths", CASES, ids=[c[0] for c in CASES])
def test_a_symbolic_length_runs_as_torch_at_two_lengths(name, kwargs, given, lengths):
    """One capture of ``[T, N, in]`` (a Scan per layer and direction), run at T=3 and T=6: values and gradients
    as torch's at each length (x's rows past T get zeros)."""
    ours, theirs = _pair(kwargs)
    first, longest = kwargs.get("batch_first", False), 6
    x, drawn = _inputs(kwargs, longest)
    states = drawn if given else None
    width = PROJ * (2 if kwargs.get("bidirectional") else 1)
    specs = {"c": gc.spec("float64", (N, "T", width) if first else ("T", N, width)),
             "ch": gc.spec("float64", drawn[0].shape), "cc": gc.spec("float64", drawn[1].shape)}
    if lengths is not None:
        specs["lengths"] = gc.spec("int64", (N,))
    model = gc.capture(_SymbolicNet(ours, x, states, lengths), **specs)
    assert [n.op_type for n in model.ir.graph].count("Scan") == drawn[0].shape[0]  # one per layer and direction
    grads = gc.grad(model, "loss")
    for steps in (3, longest):
        part = x[:, :steps] if first else x[:steps]
        packed = None if lengths is None else np.minimum(lengths, steps)
        if packed is not None:
            packed[np.argmax(lengths)] = steps  # the longest sequence fills the T steps, as torch pads to it
        want, feeds = _torch_run(theirs, part, states, None if packed is None else packed.tolist(), first)
        grad = np.zeros_like(x)
        (grad[:, :steps] if first else grad[:steps])[...] = want["x_grad"]
        want["x_grad"] = grad
        _check(grads, {**feeds, **({} if packed is None else {"lengths": packed})}, want)


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
