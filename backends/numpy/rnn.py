"""Recurrent kernels: LSTM, GRU, RNN (all directions, sequence_lens, layout, peepholes, clip).

The input projection ``X @ W.T`` is one matmul over the whole sequence; the recurrence is a
Python loop over time steps (each step a few batched matmuls), never over batch or units.
Rows whose ``sequence_lens`` has ended keep their state and emit zeros, like onnxruntime.
"""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.elementwise import sigmoid as _sigmoid_kernel
from graphc.backends.numpy.kernels import kernel
from graphc.passes.recurrent_activations import DEFAULT_ACTIVATIONS, activation_names, activation_params


def _sigmoid(x):
    return _sigmoid_kernel(x)[0]


# name -> fn(x, alpha, beta); alpha/beta as ``recurrent_activations.activation_params`` gives them
_ACTIVATIONS = {
    "sigmoid": lambda x, a, b: _sigmoid(x),
    "tanh": lambda x, a, b: np.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "elu": lambda x, a, b: np.where(x > 0, x, a * (np.exp(np.minimum(x, 0)) - 1)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": lambda x, a, b: np.logaddexp(0, x),
}


def _activations(names, alphas, betas, op, num_directions):
    names = activation_names(op, names, num_directions)
    fns = [lambda x, fn=_ACTIVATIONS[name.lower()], a=a, b=b: fn(x, a, b)
           for name, (a, b) in zip(names, activation_params(names, alphas, betas))]
    per = len(DEFAULT_ACTIVATIONS[op])
    return [fns[d * per:(d + 1) * per] for d in range(num_directions)]


def _run(cell, x, seq_lens, states, layout, direction, n_out_states):
    """Drive ``cell(d, x_t_projected, states) -> states`` over time for each direction."""
    if layout:
        x = x.transpose(1, 0, 2)
        states = [s.transpose(1, 0, 2) if s is not None else None for s in states]
    seq, batch = x.shape[:2]
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    lens = np.full(batch, seq) if seq_lens is None else np.asarray(seq_lens).astype(np.int64)
    ys, finals = [], []
    for d, backward in enumerate(dirs):
        st = [s[d] for s in states]
        y = np.zeros((seq, batch, st[0].shape[-1]), dtype=x.dtype)
        steps = range(seq - 1, -1, -1) if backward else range(seq)
        for t in steps:
            new = cell(d, t, st)
            alive = (t < lens)[:, None]
            st = [np.where(alive, n, s) for n, s in zip(new, st)]
            y[t] = np.where(alive, st[0], 0)
        ys.append(y)
        finals.append(st)
    y = np.stack(ys, axis=1)  # (seq, dirs, batch, H)
    outs = [np.stack([f[i] for f in finals]) for i in range(n_out_states)]
    if layout:
        y = y.transpose(2, 0, 1, 3)
        outs = [o.transpose(1, 0, 2) for o in outs]
    return (y.astype(x.dtype, copy=False), *(o.astype(x.dtype, copy=False) for o in outs))


def _split_bias(b, num_dir, gates, hidden, dtype):
    if b is None:
        return np.zeros((num_dir, gates * hidden), dtype), np.zeros((num_dir, gates * hidden), dtype)
    return b[:, :gates * hidden], b[:, gates * hidden:]


def _initial(h, num_dir, batch, hidden, dtype, layout):
    if h is not None:
        return h
    return np.zeros((batch, num_dir, hidden) if layout else (num_dir, batch, hidden), dtype)


def _clip(v, clip):
    return np.clip(v, -clip, clip) if clip is not None else v


@kernel("LSTM", since=7)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size, input_forget=0, layout=0):
    num_dir, hsz = w.shape[0], hidden_size
    batch = x.shape[0] if layout else x.shape[1]
    acts = _activations(activations, activation_alpha, activation_beta, "LSTM", num_dir)
    wb, rb = _split_bias(b, num_dir, 4, hsz, x.dtype)
    peep = p if p is not None else np.zeros((num_dir, 3 * hsz), x.dtype)
    xs = x.transpose(1, 0, 2) if layout else x
    proj = [xs @ w[d].T + wb[d] + rb[d] for d in range(num_dir)]  # (seq, batch, 4H)

    def cell(d, t, st):
        h, c = st
        f_act, g_act, h_act = acts[d]
        gi, go, gf, gc = np.split(proj[d][t] + h @ r[d].T, 4, axis=-1)
        pi, po, pf = np.split(peep[d], 3)
        # clip bounds each gate's whole input, peephole term included (onnxruntime)
        i = f_act(_clip(gi + pi * c, clip))
        f = 1 - i if input_forget else f_act(_clip(gf + pf * c, clip))
        c_new = f * c + i * g_act(_clip(gc, clip))
        o = f_act(_clip(go + po * c_new, clip))
        return o * h_act(c_new), c_new

    h0 = _initial(initial_h, num_dir, batch, hsz, x.dtype, layout)
    c0 = _initial(initial_c, num_dir, batch, hsz, x.dtype, layout)
    return _run(cell, x, sequence_lens, [h0, c0], layout, direction, 2)


@kernel("GRU", since=7)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size,
        linear_before_reset=0, layout=0):
    num_dir, hsz = w.shape[0], hidden_size
    batch = x.shape[0] if layout else x.shape[1]
    acts = _activations(activations, activation_alpha, activation_beta, "GRU", num_dir)
    wb, rb = _split_bias(b, num_dir, 3, hsz, x.dtype)
    xs = x.transpose(1, 0, 2) if layout else x
    proj = [xs @ w[d].T + wb[d] for d in range(num_dir)]  # (seq, batch, 3H)

    def cell(d, t, st):
        (h,) = st
        f_act, g_act = acts[d]
        xz, xr, xh = np.split(proj[d][t], 3, axis=-1)
        rz, rr, rh = np.split(r[d], 3, axis=0)
        bz, br, bh = np.split(rb[d], 3)
        z = f_act(_clip(xz + h @ rz.T + bz, clip))
        rg = f_act(_clip(xr + h @ rr.T + br, clip))
        if linear_before_reset:
            hh = g_act(_clip(xh + rg * (h @ rh.T + bh), clip))
        else:
            hh = g_act(_clip(xh + (rg * h) @ rh.T + bh, clip))
        return ((1 - z) * hh + z * h,)

    h0 = _initial(initial_h, num_dir, batch, hsz, x.dtype, layout)
    return _run(cell, x, sequence_lens, [h0], layout, direction, 1)


@kernel("RNN", since=7)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size,
        layout=0):
    num_dir, hsz = w.shape[0], hidden_size
    batch = x.shape[0] if layout else x.shape[1]
    acts = _activations(activations, activation_alpha, activation_beta, "RNN", num_dir)
    wb, rb = _split_bias(b, num_dir, 1, hsz, x.dtype)
    xs = x.transpose(1, 0, 2) if layout else x
    proj = [xs @ w[d].T + wb[d] + rb[d] for d in range(num_dir)]

    def cell(d, t, st):
        (h,) = st
        return (acts[d][0](_clip(proj[d][t] + h @ r[d].T, clip)),)

    h0 = _initial(initial_h, num_dir, batch, hsz, x.dtype, layout)
    return _run(cell, x, sequence_lens, [h0], layout, direction, 1)
