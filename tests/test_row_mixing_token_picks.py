"""A language model's per-token pick, the loss written by hand (``passes/training/row_merged.py``,
``row_linear.py``): the multi-axis pick ``lp[arange(B)[:, None], arange(T), y]`` (the TorchScript exporter's flat
index adds ``arange(T) * C``; dynamo gathers the index tuples), the pick on the flattened batch
``lp.reshape(-1, C)[arange(B * T), y.reshape(-1)]`` (or its flat index, or ``gather``), reshaped back to
``[B, T]``, and the flat index with the time term inside, ``lp.reshape(-1)[(arange(B)[:, None] * T + arange(T)) *
C + y]``, give no ``gc.DataParallelWarning``: exported by both torch exporters and captured by graphc. A flip
or roll of the batch's positions, an offset into the row before (the flat index minus ``C``: row 0's first
token picks the last row's last) or past the label's (plus 1: a label ``C - 1`` picks the next token's first), ``arange(B * T) // T`` or a flip of the merged positions still warn; so do the
hand-written flat index of flipped, rolled, halved or next rows' positions (``(r + 1) % B``), and its picks
less their sum over the batch."""

from __future__ import annotations

import warnings

import pytest

import graphc as gc
from graphc import nn
from graphc.nn import functional as F
from test_row_mixing import _found

C = 3


def _pick(kind: str, lp, y, arange, flip):
    """The per-token negative log-probability ``kind`` picks from lp [B, T, C] by labels y [B, T]."""
    b, t = lp.shape[0], lp.shape[1]
    r, s, flat = arange(b), arange(t), lp.reshape(-1, C)
    return -{
        "tokens": lambda: lp[r[:, None], s, y],
        "merged": lambda: flat[arange(b * t), y.reshape(-1)].reshape(b, t),
        "merged_flat": lambda: lp.reshape(-1)[arange(b * t) * C + y.reshape(-1)].reshape(b, t),
        "merged_gather": lambda: flat.gather(1, y.reshape(-1, 1)).reshape(b, t),
        "flipped": lambda: lp[flip(r)[:, None], s, y],
        "rolled": lambda: lp[r.roll(1, 0)[:, None], s, y],
        "row_before": lambda: lp.reshape(-1)[(arange(b * t) * C + y.reshape(-1)) - C].reshape(b, t),
        "shifted_label": lambda: lp.reshape(-1)[arange(b * t) * C + 1 + y.reshape(-1)].reshape(b, t),
        "merged_div": lambda: flat[arange(b * t) // t, y.reshape(-1)].reshape(b, t),
        "merged_flipped": lambda: flat[flip(arange(b * t)), y.reshape(-1)].reshape(b, t),
        "by_hand": lambda: _by_hand(lp, r, s, y),
        "by_hand_flipped": lambda: _by_hand(lp, flip(r), s, y),
        "by_hand_halved": lambda: _by_hand(lp, r // 2, s, y),
        "by_hand_next": lambda: _by_hand(lp, (r + 1) % b, s, y),
        "by_hand_rolled": lambda: _by_hand(lp, r.roll(1, 0), s, y),
        "by_hand_less_sum": lambda: _by_hand(lp, r, s, y) - _by_hand(lp, r, s, y).sum(0),
    }[kind]()


def _by_hand(lp, rows, s, y):
    """The flat index of each token's label written out, the time term inside."""
    return lp.reshape(-1)[(rows[:, None] * lp.shape[1] + s) * C + y]


KEEPS = ["tokens", "merged", "merged_flat", "merged_gather", "by_hand"]
BY_HAND_MIXES = ["by_hand_flipped", "by_hand_halved", "by_hand_next", "by_hand_less_sum"]
MIXES = ["flipped", "rolled", "row_before", "merged_div", "merged_flipped", "by_hand_rolled", *BY_HAND_MIXES]
# shifted_label only captured: torch's own run of it reads past lp's end at a last label C - 1
CAPTURED = ["tokens", "merged", "flipped", "shifted_label", "merged_div", "merged_flipped", "by_hand", *BY_HAND_MIXES]  # (no gc roll)
MIXED_BY = {"by_hand_less_sum": "ReduceSum"}  # the first node that mixes, where not the pick


def _ce(model: gc.Model):
    """The mean of the per-token negative log-probabilities: an L1 loss to zeros."""
    return gc.training.generate(model, gc.losses.l1("out", label="zero"), gc.optim.SGD(0.1))


def _exported(kind: str, dynamo: bool, path) -> gc.Model:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, C, dtype=torch.float64)

        def forward(self, x, y):
            return _pick(kind, torch.log_softmax(self.fc(x), -1), y, torch.arange, lambda v: v.flip(0))

    args = (torch.randn(4, 5, 6, dtype=torch.float64), torch.randint(0, C, (4, 5)))
    names = {"input_names": ["x", "y"], "output_names": ["out"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            n = torch.export.Dim("N", min=2)
            torch.onnx.export(Net(), args, str(path), dynamo=True, verbose=False, **names,
                              dynamic_shapes={"x": {0: n}, "y": {0: n}})
        else:
            torch.onnx.export(Net(), args, str(path), dynamo=False, opset_version=17, **names,
                              dynamic_axes={k: {0: "N"} for k in ("x", "y", "out")})
    return gc.load(path)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", KEEPS + MIXES)
def test_a_torch_exported_per_token_pick(kind, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
        if kind == "by_hand_next":
            pytest.skip("torch.onnx's dynamo exporter does not convert the remainder of a symbolic size")
    found = [f.split()[0] for f in _found(_ce(_exported(kind, dynamo, tmp_path / "m.onnx")))]
    if kind in KEEPS:
        assert found == []
    else:
        assert found[:1] == [MIXED_BY.get(kind, "GatherND" if dynamo else "Gather")], found


class _Captured(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind = nn.Linear(6, C), kind

    def forward(self, x, y):
        return {"out": _pick(self.kind, F.log_softmax(self.fc(x), -1), y, gc.arange, lambda v: gc.flip(v, [0]))}


@pytest.mark.parametrize("kind", CAPTURED)
def test_a_captured_per_token_pick(kind):
    model = gc.capture(_Captured(kind), seed=0, x=gc.spec("float32", ("N", 5, 6)), y=gc.spec("int64", ("N", 5)))
    found = [f.split()[0] for f in _found(_ce(model))]
    flat = kind.startswith("by_hand") or kind == "shifted_label"  # a flat index: a Gather, else graphc's GatherND
    assert found == ([] if kind in KEEPS else [MIXED_BY.get(kind, "Gather" if flat else "GatherND")]), found
