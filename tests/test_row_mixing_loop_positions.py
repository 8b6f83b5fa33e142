"""The batch's positions (``gc.arange(N)``) carried into a Loop or Scan, or scanned (``row_subgraphs``): bound to
the body's inputs, a position carried unchanged picks each row's own there or after the loop (no
``gc.DataParallelWarning``; before, the Loop or Scan itself was named as computing per-shard positions), a scan
over time with per-row state and a per-row pick each step warns not; a position changed by an iteration, a scan
over the positions (a cumulative sum over the batch) or over the batch, and positions read as a value after the
loop are named; a position flipped in the body once, where it is flipped. torch's scan exported by the dynamo
exporter alike."""

from __future__ import annotations

import re
import warnings

import pytest

import graphc as gc
from graphc import nn
from graphc.nn import functional as F
from graphc.passes.training.row_mixing import mixing_nodes
from test_row_mixing import _found, _mse


class _Carried(nn.Module):
    """x [N, 6], ys [N, 4] labels of 3 classes; ``kind`` picks a forward."""

    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind = nn.Linear(6, 3), kind

    def forward(self, x, ys):
        z, p, kind = self.fc(x), gc.arange(x.shape[0]), self.kind
        if kind == "carried_pick":
            return {"out": z[gc.fori_loop(0, 3, lambda i, q: q, p), ys[:, 0]][:, None]}
        if kind == "scan_over_time_pick":
            def step(h, yt):
                h = gc.tanh(h + z)
                return h, F.log_softmax(h, -1)[p, yt]
            return {"out": gc.scan(step, z, ys.transpose(0, 1))[1].transpose(0, 1)}
        if kind == "scan_over_time_carried_pick":
            def carried(c, yt):
                h = gc.tanh(c[0] + z)
                return (h, c[1]), F.log_softmax(h, -1)[c[1], yt]
            return {"out": gc.scan(carried, (z, p), ys.transpose(0, 1))[1].transpose(0, 1)}
        if kind == "carried_flip":
            return {"out": z[gc.fori_loop(0, 3, lambda i, q: gc.flip(q, [0]), p), ys[:, 0]][:, None]}
        if kind == "carried_value":
            return {"out": z + gc.fori_loop(0, 3, lambda i, q: q, p)[:, None].float()}
        if kind == "scan_positions_cumsum":
            return {"out": gc.scan(lambda c, i: (c + z[i], c + z[i]), self.fc.bias * 0, p)[1]}
        return {"out": gc.scan(lambda c, zi: (c + zi, c + zi), self.fc.bias * 0, z)[1]}  # "scan_batch_cumsum"


KEEPS = ["carried_pick", "scan_over_time_pick", "scan_over_time_carried_pick"]
# kind: (the op types named, a message's start)
MIXES = {"carried_flip": ("Slice", "it computes per-shard positions: .* \\(inside the body of Loop '[^']+'\\)$"),
         "carried_value": ("Cast", "it computes per-shard positions"),
         "scan_positions_cumsum": ("Scan", "it scans '[^']+' \\(the batch's positions\\) along their axis 0: each "
                                           "iteration sees one row"),
         "scan_batch_cumsum": ("Scan", "it scans '[^']+' along its batch axis 0")}


def _mixes(kind: str) -> list[str]:
    model = gc.capture(_Carried(kind), seed=0, x=gc.spec("float32", ("N", 6)), ys=gc.spec("int64", ("N", 4)))
    arts = _mse(model, "out")
    found = mixing_nodes(arts.eval.ir.graph, {"x": 0, "ys": 0, "t": 0}, "out")
    assert [f.split()[0] for f in _found(arts)] == [m.node.op_type for m in found]
    return [f"{m.node.op_type}: {m.why}" for m in found]


@pytest.mark.parametrize("kind", KEEPS)
def test_positions_carried_or_captured_for_a_per_row_pick_warn_not(kind):
    assert _mixes(kind) == []


@pytest.mark.parametrize("kind", list(MIXES))
def test_positions_changed_or_scanned_in_a_loop_are_named(kind):
    op, why = MIXES[kind]
    assert any(re.match(f"{op}: {why}", m) for m in _mixes(kind)), _mixes(kind)


def test_a_flipped_carried_position_is_named_once_where_it_is_flipped():
    """Not again by the Loop that carries it out (positions one way, a reported count the other) or by the
    GatherND that picks by it."""
    assert [m.split(":")[0] for m in _mixes("carried_flip")] == ["Slice"]


@pytest.mark.parametrize(("kind", "found"), [("per_row_pick", []), ("batch_cumsum", ["Scan"])])
def test_torch_dynamo_exported_scans(kind, found, tmp_path):
    """torch's scan over time whose step picks each row's target ``logp[arange(B), y[:, t]]`` (the positions
    captured from outside the step), and a cumulative sum over the batch by a scan along it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from torch._higher_order_ops.scan import scan

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)

        def forward(self, x, ys):
            r = torch.arange(x.shape[0])

            def step(h, yt):
                h = torch.tanh(self.a(h) + x)
                return h, torch.log_softmax(h, -1)[r, yt]

            def running(c, xi):
                return c + xi, (c + xi).clone()

            if kind == "per_row_pick":
                return scan(step, torch.zeros_like(x), ys.transpose(0, 1))[1].transpose(0, 1)
            return scan(running, torch.zeros_like(x[0]), self.a(x))[1]

    path = tmp_path / "m.onnx"
    n = torch.export.Dim("N", min=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net(), (torch.randn(4, 3), torch.zeros(4, 5, dtype=torch.int64)), dynamo=True,
                          input_names=["x", "ys"], output_names=["out"], dynamic_shapes={"x": {0: n}, "ys": {0: n}},
                          verbose=False).save(str(path))
    model = gc.load(path)
    assert "Scan" in [node.op_type for node in model.graph]
    assert [f.split()[0] for f in _found(_mse(model, "out"))] == found
