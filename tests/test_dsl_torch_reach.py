"""The torch names the reach sweep added (torch.lstm/gru/rnn_tanh/rnn_relu, the native_* tuples, aliases, the
Householder methods, post-accumulate hooks), against torch 2.13 in float64 on the numpy and ort-cpu backends:
values and the gradients of ``sum(out * c)``; and the refusals naming what to use instead."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from tests.torch_grad_util import TorchNS, gc_grads, run_both

torch = pytest.importorskip("torch")


def rng(seed=0):
    return np.random.default_rng(seed)


def matches_torch(fn, params, inputs=None, seed=0, rtol=1e-10, atol=1e-12):
    """``fn(M, *params, **inputs)`` with ``M`` gc (``F`` passed, as ``torch_grad_util``'s) and torch: the value on
    numpy and ort-cpu, and ``gc.grad`` of ``sum(out * c)`` with respect to every param on both backends, against
    torch's value and torch.autograd's gradients (float64, to ``rtol``)."""
    inputs = inputs or {}
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    want = fn(TorchNS(torch), *ts, **{k: torch.from_numpy(v) for k, v in inputs.items()})
    c = rng(seed).standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    names = [f"p{i}" for i in range(len(params))]
    feeds = {**dict(zip(names, params)), **inputs}
    got = run_both(gc.capture(lambda **kw: fn(F, *(kw.pop(n) for n in names), **kw), **feeds), feeds)["output"]
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=rtol, atol=atol)
    for backend in ("numpy", "ort-cpu"):
        grads = gc_grads(fn, dict(zip(names, params)), inputs, c, backend=backend)
        for n, t in zip(names, ts):
            np.testing.assert_allclose(grads[n], 0 if t.grad is None else t.grad.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"{backend} {n}")


def joined(M, outs):
    """The outputs of a tuple-returning op flattened into one vector (``M``: the namespace, gc's or torch's)."""
    G = gc if M is F else M.torch
    return G.cat([o.reshape(-1) for o in outs])


# -- torch.lstm / gru / rnn_tanh / rnn_relu -------------------------------------------------------------

RNN_CASES = [  # (op, layers, bidirectional, has_biases, batch_first, proj_size)
    ("lstm", 2, True, True, False, 0), ("lstm", 1, False, False, True, 0), ("lstm", 2, True, True, True, 2),
    ("gru", 2, True, True, False, 0), ("gru", 1, False, False, True, 0),
    ("rnn_tanh", 2, False, True, False, 0), ("rnn_relu", 1, True, True, True, 0),
]


@pytest.mark.parametrize("op,layers,bidirectional,bias,batch_first,proj", RNN_CASES)
def test_functional_rnns_match_torch(op, layers, bidirectional, bias, batch_first, proj):
    T, N, I, H = 3, 2, 4, 5
    kind = {"lstm": "LSTM", "gru": "GRU"}.get(op, "RNN")
    kw = {"proj_size": proj} if proj else {"nonlinearity": "relu"} if op == "rnn_relu" else {}
    twin = getattr(torch.nn, kind)(I, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
                                   **kw).double()
    weights = [w.detach().numpy().copy() for w in twin._flat_weights]
    D, r = 2 if bidirectional else 1, rng(1)
    x = r.standard_normal((N, T, I) if batch_first else (T, N, I))
    h0, c0 = r.standard_normal((layers * D, N, proj or H)), r.standard_normal((layers * D, N, H))

    def fn(M, x, h0, c0, *ws):
        G = gc if M is F else M.torch
        hx = [h0, c0] if op == "lstm" else h0 + 0 * c0.sum()
        return joined(M, getattr(G, op)(x, hx, list(ws), bias, layers, 0.0, False, bidirectional, batch_first))

    matches_torch(fn, [x, h0, c0, *weights])


def test_functional_rnn_refusals_name_the_problem():
    x, h = np.zeros((3, 2, 4)), np.zeros((1, 2, 5))
    w = [np.zeros((15, 4)), np.zeros((15, 5))]
    with pytest.raises(gc.CaptureError, match=r"torch.gru: 2 weights .* expected 4"):
        gc.capture(lambda x, h: gc.gru(x, h, w, True, 1, 0.0, False, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match="packed form, is not captured"):
        gc.capture(lambda x, h: gc.gru(x, np.array([2, 2, 2]), h, w, False, 1, 0.0, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match=r"torch.lstm hx is \[h_0, c_0\]"):
        gc.capture(lambda x, h: gc.lstm(x, h, w, False, 1, 0.0, False, False, False), x=x, h=h)
