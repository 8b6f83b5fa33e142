"""The batch's size or its rows' positions read as a value (``passes/training/row_counts.py``): each
data-parallel worker counts its shard's rows from 0 and its ``x.shape[0]`` is its shard's size, so
``z + gc.arange(N)[:, None]``, ``z / N``, a position embedding over the batch axis, an ``arange(N) % 2``
mask or InfoNCE's ``labels = gc.arange(N)`` compared with predictions give another output on 2 shards
than on the whole batch (shown on numpy and ort-cpu), and ``gc.Trainer(workers=2)`` warns, naming the node
and its DSL line. The same positions as an index (``p[gc.arange(N), y]``) or the size as a shape
(``z.reshape(N, -1)``, ``gc.zeros(N, 4)``) keep rows apart: no warning, the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.passes.training.row_mixing import mixing_nodes
from test_row_mixing import _found, _found_warns, _mse

RNG = np.random.default_rng(0)
THIS = "tests/test_row_mixing_counts.py"
ZOO = sorted(p.name for p in (Path(__file__).parent / "data" / "zoo").glob("*.onnx") if "float64" not in p.name)


def _counts(kind: str):
    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.pos = nn.Linear(6, 4), nn.Embedding(16, 4)

        def forward(self, x):
            z, n = self.fc(x), x.shape[0]
            if kind == "plus_position":
                return {"out": z + gc.arange(n)[:, None].float()}
            if kind == "fraction":
                return {"out": z * (gc.arange(n).float() / n)[:, None]}
            if kind == "embedding":
                return {"out": z + self.pos(gc.arange(n))}
            if kind == "parity":
                return {"out": gc.where((gc.arange(n) % 2 == 0)[:, None], z, -z)}
            if kind == "info_nce":  # the rows whose prediction is their own index, as InfoNCE's labels = arange(N)
                return {"out": z * (x[:, :4].argmax(-1) == gc.arange(n)).float()[:, None]}
            if kind == "per_size":
                return {"out": z / n}
            if kind == "label_pick":  # torch's logits[arange(N), labels]
                return {"out": z[gc.arange(n), gc.zeros_like(z[:, 0]).long()][:, None] + z}
            if kind == "shapes":
                return {"out": z.reshape(n, -1) + gc.zeros(n, 4)}
            return {"out": z}
    return Counts()


# kind -> (op type of the node named, what it computes per shard, text on its DSL line)
WARNS = {"plus_position": ("Cast", "positions", "z + gc.arange(n)[:, None].float()"),
         "fraction": ("Cast", "positions", "gc.arange(n).float() / n"),
         "embedding": ("Less", "positions", "self.pos(gc.arange(n))"),
         "parity": ("Mod", "positions", "gc.arange(n) % 2"),
         "info_nce": ("Equal", "positions", "x[:, :4].argmax(-1) == gc.arange(n)"),
         "per_size": ("Cast", "sizes", "z / n")}
KEEPS = ["label_pick", "shapes"]


def _capture(kind: str) -> gc.Model:
    return gc.capture(_counts(kind), seed=0, x=gc.spec("float32", ("N", 6)))


def _line(text: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "return" in line and text in line)


@pytest.mark.parametrize("kind", list(WARNS))
def test_a_batch_position_or_size_read_as_a_value_is_named_with_its_op_and_line(kind):
    op, what, text = WARNS[kind]
    arts = _mse(_capture(kind), "out")
    assert [f.split()[0] for f in _found(arts)] == [op]
    with pytest.warns(gc.DataParallelWarning, match=rf"workers=2\): the model's forward may mix the batch's rows: "
                                                    rf"node '[^']+' \({op}, {THIS}:{_line(text)}\): it computes "
                                                    rf"per-shard {what}: "):
        _found_warns(arts)
    assert _found(arts, workers=1) == []


@pytest.mark.parametrize("kind", KEEPS)
def test_a_batch_position_as_an_index_or_the_size_as_a_shape_warns_not(kind):
    assert _found(_mse(_capture(kind), "out")) == []


def _whole_and_shards(kind: str, backend: str) -> tuple[np.ndarray, np.ndarray]:
    """The eval output of a batch of 6 at once and as two shards of 3, as 2 workers compute it; row i's
    prediction (its largest of x[i, :4]) is i % 4."""
    session = gc.Session(_capture(kind), backend=backend)
    x = RNG.standard_normal((6, 6)).astype(np.float32)
    x[np.arange(6), np.arange(6) % 4] += 10
    shards = [session.run({"x": x[s]})["out"] for s in (slice(3), slice(3, 6))]
    return session.run({"x": x})["out"], np.concatenate(shards)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_what_warns_differs_on_two_shards_and_what_does_not_is_the_same(backend):
    for kind in WARNS:
        whole, shards = _whole_and_shards(kind, backend)
        assert np.abs(whole - shards).max() > 1e-3, (kind, backend)
    for kind in KEEPS:
        whole, shards = _whole_and_shards(kind, backend)
        np.testing.assert_allclose(shards, whole, rtol=1e-6, atol=1e-6, err_msg=f"{kind} {backend}")


def test_a_batch_position_read_as_a_value_in_a_branch_is_named_inside_it():
    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            z = self.fc(x)
            return {"out": gc.cond(self.fc.bias.sum() > 0, lambda: z + gc.arange(x.shape[0])[:, None].float(),
                                   lambda: z.reshape(x.shape[0], -1))}
    model = gc.capture(Branch(), seed=0, x=gc.spec("float32", ("N", 6)))
    found = mixing_nodes(_mse(model, "out").eval.ir.graph, {"x": 0}, "out")
    assert [(m.node.op_type, m.why.split(": ")[0], m.why.split("(")[-1]) for m in found] == [
        ("Cast", "it computes per-shard positions", "inside the then_branch of If 'If')")]


@pytest.mark.parametrize("name", ZOO)
def test_the_zoos_torch_exports_mix_no_rows(name):
    """Their shapes' arithmetic (Shape, Gather, Slice of 3 inputs, Concat into a Reshape) reads the batch's
    size as a shape only."""
    model = gc.load(Path(__file__).parent / "data" / "zoo" / name)
    assert _found(gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))) == []
