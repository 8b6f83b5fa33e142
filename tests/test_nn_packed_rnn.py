"""``gc.nn.utils.rnn`` and packed runs of ``gc.nn.RNN/LSTM/GRU`` against torch 2's: padded outputs,
final states, the packed layout and the gradients, on the numpy and ort-cpu backends, with the
lengths given as numbers (a constant) and as an int64 Tensor fed at run time."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.nn.utils import rnn as gr
from torch_grad_util import run_both

torch = pytest.importorskip("torch")
from torch.nn.utils import rnn as tr  # noqa: E402

R = np.random.default_rng(0)
X = R.standard_normal((5, 3, 4)).astype(np.float32)  # (T, B, features)

# kind, constructor arguments, lengths, enforce_sorted, batch_first of the packed input
CASES = [
    ("LSTM", dict(num_layers=2, bidirectional=True), [3, 5, 2], False, False),
    ("LSTM", dict(), [5, 3, 2], True, True),
    ("GRU", dict(num_layers=2, bidirectional=True), [2, 5, 5], False, True),
    ("GRU", dict(bias=False), [5, 4, 1], True, False),
    ("RNN", dict(bidirectional=True, nonlinearity="relu"), [4, 2, 4], False, False),
    ("RNN", dict(num_layers=3), [4, 4, 3], True, True),
]


def _twin(kind: str, kwargs: dict, dtype: str = "float64"):
    """``gc.nn.<kind>``, seeded, and torch's (float64) holding the same weights."""
    layer = getattr(gc.nn, kind)(4, 3, **kwargs, dtype=dtype)
    for p in layer.init_parameters(seed=1).parameters():
        p.data = p.numpy()  # pinned: a capture keeps them
    twin = getattr(torch.nn, kind)(4, 3, **kwargs).double()
    twin.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in layer.state_dict().items()})
    return layer, twin


def _torch_run(twin, x: np.ndarray, lengths, enforce_sorted: bool, batch_first: bool, h0=None):
    """torch's padded output, h_n (and c_n), lengths and packed layout, x and h0 requiring grad."""
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    packed = tr.pack_padded_sequence(xt, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    out, states = twin(packed, h0)
    states = states if isinstance(states, tuple) else (states,)
    y, lens = tr.pad_packed_sequence(out, batch_first=True, padding_value=-2.0)
    return xt, y, states, lens, packed


class _Net(gc.nn.Module):
    """``sum(y * c) + sum(h_n * ch)`` (``+ sum(c_n * cc)``) of a packed run on the Parameter ``x``."""

    def __init__(self, layer, x, enforce_sorted, batch_first, lengths=None):
        super().__init__()
        self.rnn, self.x = layer, gc.nn.Parameter(x, dtype=x.dtype.name)
        self.enforce_sorted, self.batch_first, self.lengths = enforce_sorted, batch_first, lengths

    def forward(self, c, ch, cc=None, lens=None):
        packed = gr.pack_padded_sequence(self.x, self.lengths if lens is None else lens, self.batch_first,
                                         self.enforce_sorted)
        out, states = self.rnn(packed)
        states = states if isinstance(states, tuple) else (states,)
        y, lengths = gr.pad_packed_sequence(out, batch_first=True, padding_value=-2.0)
        loss = gc.sum(y * c) + gc.sum(states[0] * ch) + (gc.sum(states[1] * cc) if cc is not None else 0.0)
        return {"y": y, "h_n": states[0], **({"c_n": states[1]} if cc is not None else {}), "lengths": lengths,
                "loss": loss}


@pytest.mark.parametrize("fed", [False, True], ids=["list", "tensor"])
@pytest.mark.parametrize("kind, kwargs, lengths, enforce_sorted, batch_first", CASES)
def test_packed_run_and_gradients_match_torch(kind, kwargs, lengths, enforce_sorted, batch_first, fed):
    layer, twin = _twin(kind, kwargs)
    x = np.ascontiguousarray(X.transpose(1, 0, 2)) if batch_first else X
    xt, y, states, lens, _ = _torch_run(twin, x, lengths, enforce_sorted, batch_first)
    c = R.standard_normal(tuple(y.shape))
    cs = [R.standard_normal(tuple(s.shape)) for s in states]
    (y * torch.from_numpy(c)).sum().add(sum((s * torch.from_numpy(w)).sum() for s, w in zip(states, cs))).backward()

    net = _Net(layer, x.astype(np.float64), enforce_sorted, batch_first, None if fed else lengths)
    feeds = {"c": c, "ch": cs[0], **({"cc": cs[1]} if len(cs) > 1 else {}),
             **({"lens": np.asarray(lengths, np.int64)} if fed else {})}
    model = gc.capture(net, **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    grads = gc.grad(model, "loss")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run(feeds)
        np.testing.assert_allclose(got["y"], y.detach().numpy(), rtol=1e-6, atol=1e-8, err_msg=backend)
        for name, want in zip(("h_n", "c_n"), states):
            np.testing.assert_allclose(got[name], want.detach().numpy(), rtol=1e-6, atol=1e-8, err_msg=name)
        np.testing.assert_array_equal(got["lengths"], lens.numpy())
        np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), rtol=1e-6, atol=1e-8, err_msg=f"{backend} x")
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"rnn.{k}_grad"], p.grad.numpy(), rtol=1e-6, atol=1e-8,
                                       err_msg=f"{backend} {k}")


def test_packed_run_from_initial_states_matches_torch():
    """float32: onnxruntime's own fused LSTM kernel (a float64 one runs written out, tests/test_ort_doubles_recurrent.py)."""
    layer, twin = _twin("LSTM", dict(num_layers=2), "float32")
    h0, c0 = (R.standard_normal((2, 3, 3)).astype(np.float32) for _ in range(2))
    x = X
    _, y, (h, c), _, _ = _torch_run(twin, x, [2, 5, 3], False, False, (torch.from_numpy(h0).double(),
                                                                     torch.from_numpy(c0).double()))
    model = gc.capture(lambda x, h0, c0: _flat(layer(gr.pack_padded_sequence(x, [2, 5, 3], enforce_sorted=False),
                                                     (h0, c0))), x=x, h0=h0, c0=c0)
    got = run_both(model, {"x": x, "h0": h0, "c0": c0})
    for name, want in zip(("y", "h", "c"), (y, h, c)):
        np.testing.assert_allclose(got[name], want.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def _flat(result):
    out, (h, c) = result
    return {"y": gr.pad_packed_sequence(out, batch_first=True, padding_value=-2.0)[0], "h": h, "c": c}


@pytest.mark.parametrize("fed", [False, True], ids=["list", "tensor"])
@pytest.mark.parametrize("lengths, enforce_sorted", [([3, 5, 3], False), ([5, 3, 3], True), ([1, 4, 4], False)])
def test_packed_layout_matches_torch(lengths, enforce_sorted, fed):
    """``data``, ``batch_sizes``, ``sorted_indices`` (ties in batch order) and ``unsorted_indices``;
    ``pad_packed_sequence`` with ``total_length``."""
    def fn(x, lens):
        p = gr.pack_padded_sequence(x, lens, enforce_sorted=enforce_sorted)
        out = {"data": p.data, "batch_sizes": p.batch_sizes,
               "padded": gr.pad_packed_sequence(p, padding_value=7.0, total_length=6)[0]}
        return {**out, "sorted": p.sorted_indices, "unsorted": p.unsorted_indices} if not enforce_sorted else out

    lens = np.asarray(lengths, np.int64)
    model = gc.capture(fn, x=X, lens=lens) if fed else gc.capture(lambda x: fn(x, lengths), x=X)
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"x": X, **({"lens": lens} if fed else {})})
    p = tr.pack_padded_sequence(torch.from_numpy(X), lengths, enforce_sorted=enforce_sorted)
    want = {"data": p.data, "batch_sizes": p.batch_sizes, "sorted": p.sorted_indices, "unsorted": p.unsorted_indices,
            "padded": tr.pad_packed_sequence(p, padding_value=7.0, total_length=6)[0]}
    for name, value in got.items():
        assert value.shape == tuple(want[name].shape), name
        np.testing.assert_array_equal(value, want[name].numpy(), err_msg=name)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_pad_sequence_matches_torch(batch_first, padding_side, symbolic):
    seqs = [R.standard_normal((n, 2, 3)).astype(np.float32) for n in (2, 4, 1)]
    specs = {f"s{i}": gc.spec("float32", (f"L{i}", 2, 3)) if symbolic else s for i, s in enumerate(seqs)}
    model = gc.capture(lambda **s: gr.pad_sequence(list(s.values()), batch_first, -1.5, padding_side), **specs)
    got = run_both(model, {f"s{i}": s for i, s in enumerate(seqs)})["output"]
    want = tr.pad_sequence([torch.from_numpy(s) for s in seqs], batch_first, -1.5, padding_side)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("fed", [False, True], ids=["list", "tensor"])
def test_pack_unpack_unpad_round_trips_as_torch(fed):
    seqs = [R.standard_normal((n, 3)).astype(np.float32) for n in (4, 2, 3)]
    specs = {f"s{i}": gc.spec("float32", (f"L{i}", 3)) if fed else s for i, s in enumerate(seqs)}

    def fn(**s):
        packed = gr.pack_sequence(list(s.values()), enforce_sorted=False)
        padded = gr.pad_sequence(list(s.values()), batch_first=True)
        lengths = [len(v) for v in seqs]
        return {**{f"u{i}": t for i, t in enumerate(gr.unpack_sequence(packed))},
                **{f"p{i}": t for i, t in enumerate(gr.unpad_sequence(padded, lengths, batch_first=True))},
                "data": packed.data}

    got = run_both(gc.capture(fn, **specs), {f"s{i}": s for i, s in enumerate(seqs)})
    want = tr.pack_sequence([torch.from_numpy(s) for s in seqs], enforce_sorted=False)
    np.testing.assert_array_equal(got["data"], want.data.numpy())
    for i, (s, t) in enumerate(zip(seqs, tr.unpack_sequence(want))):
        np.testing.assert_array_equal(got[f"u{i}"], t.numpy())
        np.testing.assert_array_equal(got[f"p{i}"], s)


def test_unpad_sequence_with_lengths_fed_matches_torch():
    lens = np.array([3, 5, 1])
    model = gc.capture(lambda x, lens: tuple(gr.unpad_sequence(x, lens)), x=X, lens=lens)
    got = run_both(model, {"x": X, "lens": lens})
    for g, want in zip(got.values(), tr.unpad_sequence(torch.from_numpy(X), torch.from_numpy(lens))):
        np.testing.assert_array_equal(g, want.numpy())


@pytest.mark.parametrize("call, match", [
    (lambda x: gr.pack_padded_sequence(x, [3, 5, 2]), "lengths=\\[3, 5, 2\\] must be sorted in decreasing order"),
    (lambda x: gr.pack_padded_sequence(x, [5, 3]), "len\\(lengths\\) to equal the batch size 3, got 2"),
    (lambda x: gr.pack_padded_sequence(x, [5, 3, 0]), "every length must be greater than 0"),
    (lambda x: gr.pack_padded_sequence(x, [6, 3, 1]), "exceed the 5 steps"),
    (lambda x: gr.pack_padded_sequence(x, gc.cast(x[0, :, 0], "float32")), "lengths must be a 1-D int64 Tensor"),
    (lambda x: gr.pad_packed_sequence(gr.pack_padded_sequence(x, [5, 3, 1]), total_length=4),
     "total_length=4 is less than the longest sequence's length 5"),
    (lambda x: gr.pad_packed_sequence(x), "sequence must be a PackedSequence, got Tensor"),
    (lambda x: gr.pad_sequence([x[0], x[1, :, :2]]), "same trailing dims"),
    (lambda x: gr.pad_sequence([x[0]], padding_side="middle"), "padding_side='middle'"),
    (lambda x: gc.nn.GRU(3, 2)(gr.pack_padded_sequence(x, [5, 3, 1])), "expects a rank-3 input with 3 features"),
])
def test_bad_input_is_refused_naming_it_and_the_line(call, match):
    with pytest.raises(gc.CaptureError, match=match) as err:
        gc.capture(call, x=X)
    assert "test_nn_packed_rnn.py" in str(err.value)


def test_symbolic_steps_and_batch_match_torch():
    """Time and batch symbolic, lengths fed: ``total_length`` pads at run time; a packed GRU."""
    layer, twin = _twin("GRU", dict(bidirectional=True), "float32")
    lens = np.array([3, 5, 2])

    def fn(x, lens):
        p = gr.pack_padded_sequence(x, lens, enforce_sorted=False)
        out, h = layer(p)
        return {"long": gr.pad_packed_sequence(p, total_length=7, padding_value=3.0)[0],
                "y": gr.pad_packed_sequence(out, padding_value=-2.0)[0], "h": h}

    model = gc.capture(fn, x=gc.spec("float32", ("T", "N", 4)), lens=gc.spec("int64", ("N",)))
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"x": X, "lens": lens})
    p = tr.pack_padded_sequence(torch.from_numpy(X), torch.from_numpy(lens), enforce_sorted=False)
    np.testing.assert_array_equal(got["long"], tr.pad_packed_sequence(p, total_length=7, padding_value=3.0)[0].numpy())
    _, y, (h,), _, _ = _torch_run(twin, X, lens, False, False)
    np.testing.assert_allclose(got["y"], y.detach().numpy().transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["h"], h.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_static_length_does_not_unroll_the_packed_train_step():
    """models/packed_lstm.py with a static T: the masked LSTM is a Scan in train_step, so its node
    count does not grow with T (unrolled it was ~7000 nodes at T=8, ~28000 at T=32)."""
    from graphc.models import packed_lstm

    def nodes(steps: int) -> int:
        model = gc.capture(packed_lstm.PackedLSTMClassifier(), **packed_lstm.example_inputs(length=steps))
        arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1))
        return len(arts.train_step.proto.graph.node)

    short, long = nodes(8), nodes(64)
    assert long <= short + 10 and short < 1500, (short, long)
