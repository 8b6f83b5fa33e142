"""``gc.vmap`` of RNN, GRU and LSTM layers with mapped weights (an ensemble, as torch.func's
``stack_module_state`` + ``vmap`` + ``functional_call``) in each form of its rule, forced: one
recurrent op over the members folded into its hidden size, and the op written out with the members'
weights batched, unrolled over time or as a Scan over time; against torch per ensemble member (torch
2.13's vmap has no batching rule for ``aten::lstm``, nor a fallback): values and ``gc.grad``'s gradients
(input, initial state, every stacked weight) in float64 on numpy and ort-cpu, both directions, mapped or
shared sequences and states, packed sequences of shared or per-member lengths. Each vmap passes
``fallback="error"`` so a case no rule rewrites fails, and a PerformanceWarning is an error."""

from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.dsl import vmap_rules_rnn
from graphc.passes.autodiff import recurrent as unrolling
from graphc.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
E, T, N, I, H = 3, 5, 2, 3, 4  # members, steps, batch, input and hidden size
LENGTHS = [5, 3]
MAPPED_LENGTHS = np.array([[5, 3], [2, 4], [1, 5]], np.int64)  # per member


def _members(kind, bidirectional):
    """torch's ``E`` members (float64), our layer of the same shape, and their stacked weights."""
    tnets = [getattr(torch.nn, kind)(I, H, bidirectional=bidirectional).double() for _ in range(E)]
    net = getattr(gc.nn, kind)(I, H, bidirectional=bidirectional, dtype="float64").init_parameters(0)
    stacked = {k: np.stack([dict(t.named_parameters())[k].detach().numpy() for t in tnets])
               for k, _ in tnets[0].named_parameters()}
    return tnets, net, stacked


def _run(M, layer, weights, x, h0, packed, lengths=LENGTHS):
    """``layer``'s output sequence with ``weights`` (a dict) on ``x``, ``h0`` (LSTM: ``c0 = h0 / 2``),
    packed to ``lengths`` and padded back where asked: the same code for torch and the DSL."""
    F = torch.func if M is torch else gc.func
    utils = torch.nn.utils.rnn if M is torch else None
    pack = utils.pack_padded_sequence if utils else pack_padded_sequence
    pad = utils.pad_packed_sequence if utils else pad_packed_sequence
    hx = None if h0 is None else ((h0, h0 * 0.5) if "LSTM" in type(layer).__name__ else h0)
    seq = pack(x, lengths, enforce_sorted=False) if packed else x
    out = F.functional_call(layer, weights, (seq, hx))[0]
    return pad(out, total_length=T)[0] if packed else out


@pytest.fixture(params=["block_diagonal", "unrolled", "scan"])
def form(request, monkeypatch):
    """Each form of the mapped-weights rule forced (``BLOCK_DIAGONAL_UNITS`` past any ``B*H``, or 0);
    written out, unrolled (the default for ``T`` steps) or a Scan over time (no step unrolled)."""
    monkeypatch.setattr(vmap_rules_rnn, "BLOCK_DIAGONAL_UNITS", 10 ** 9 if request.param == "block_diagonal" else 0)
    if request.param == "scan":
        monkeypatch.setattr(unrolling, "MAX_UNROLLED_STEPS", 0)
    return request.param


def _op_types(graph) -> list[str]:
    """The op types of ``graph``'s nodes, its subgraphs' included."""
    return [t for node in graph for t in [node.op_type, *(inner for attr in node.attributes.values()
                                                          if isinstance(attr.value, ir.Graph)
                                                          for inner in _op_types(attr.value))]]


@pytest.mark.parametrize("case", ["mapped_x", "shared_x_mapped_h0", "packed", "packed_mapped_lengths"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_ensemble_matches_torch(kind, bidirectional, case, form):
    """Values and gradients per member; the block-diagonal form one op of ``E*H`` units, the written-out
    form no recurrent op at all (a Scan over time); mapped lengths always written out."""
    tnets, net, stacked = _members(kind, bidirectional)
    names, d = list(stacked), 2 if bidirectional else 1
    x = RNG.standard_normal((T, N, I) if case == "shared_x_mapped_h0" else (E, T, N, I))
    h0 = {"shared_x_mapped_h0": RNG.standard_normal((E, d, N, H)), "packed": RNG.standard_normal((d, N, H))}.get(case)
    lens = MAPPED_LENGTHS if case == "packed_mapped_lengths" else np.array(LENGTHS, np.int64)
    params = {"x": x, **({"h0": h0} if h0 is not None else {}), **{k.replace(".", "_"): v for k, v in stacked.items()}}

    def fn(_, x, *rest, lens):
        h, ws = (rest[0], rest[1:]) if h0 is not None else (None, rest)
        in_dims = (0, None if x.ndim == 3 else 0, 0 if h is not None and h.ndim == 4 else None,
                   0 if lens.ndim == 2 else None)
        member = lambda w, a, s, n: _run(gc, net, dict(zip(names, w)), a, s, "packed" in case, n)
        return gc.vmap(member, in_dims=in_dims, fallback="error")(list(ws), x, h, lens)

    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.PerformanceWarning)
        model = gc.capture(lambda *a: fn(None, *a[:-1], lens=a[-1]), **params, lens=lens)
    ops = _op_types(model.ir.graph)
    folded = form == "block_diagonal" and case != "packed_mapped_lengths"
    scanned = not folded and (form == "scan" or "packed" in case)  # a masked run is never unrolled
    assert (kind in ops, "Scan" in ops) == (folded, scanned), ops
    tin = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx, th, tws = tin["x"], tin.get("h0"), [tin[k.replace(".", "_")] for k in names]
    want = torch.stack([_run(torch, tnets[e], {k: w[e] for k, w in zip(names, tws)},
                             tx if tx.ndim == 3 else tx[e], th if th is None or th.ndim == 3 else th[e],
                             "packed" in case, torch.from_numpy(lens if lens.ndim == 1 else lens[e]))
                        for e in range(E)])
    c = RNG.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, params, {"lens": lens}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        for k, t in tin.items():
            np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"{backend} {k}")


def test_a_mapped_size_unknown_at_capture_is_written_out():
    """Members ``E`` symbolic: no fold (its weights' size needs ``B``), the written-out form, torch's values."""
    tnets, net, stacked = _members("GRU", True)
    names = list(stacked)
    feeds = {"x": RNG.standard_normal((E, T, N, I)), **{f"w{i}": w for i, w in enumerate(stacked.values())}}

    def fn(x, *ws):
        member = lambda w, a: _run(gc, net, dict(zip(names, w)), a, None, False)
        return gc.vmap(member, fallback="error")(list(ws), x)

    model = gc.capture(fn, **{k: gc.spec("float64", ("E", *v.shape[1:])) for k, v in feeds.items()})
    assert "GRU" not in _op_types(model.ir.graph)
    want = np.stack([_run(torch, tnets[e], {k: torch.from_numpy(w[e]) for k, w in stacked.items()},
                          torch.from_numpy(feeds["x"][e]), None, False).detach().numpy() for e in range(E)])
    for backend in ("numpy", "ort-cpu"):
        got = next(iter(gc.Session(model, backend=backend).run(feeds).values()))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=backend)
