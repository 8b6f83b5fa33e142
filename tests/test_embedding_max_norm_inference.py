"""The inference and eval graphs of ``F.embedding(max_norm=...)`` lookups inside ``gc.fori_loop``,
``gc.while_loop``, ``gc.scan`` and ``gc.cond`` bodies (``passes/training/max_norm_carries.py``): where
nothing reads the weight after the node and every lookup in the body has one ``max_norm`` and
``norm_type``, the body carries no copy of the table (no ScatterND, no whole-table Sub/Add) and equals
torch's loop (float64 to 1e-12, bit for bit the graph that carries it; float32 to 3 ulps); otherwise the
weight is carried as before, torch's loop to 1e-12."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
ROWS, DIM = 12, 5
STEPS = np.array([[0, 1, 1, 6], [7, 2, 0, 6], [5, 7, 3, 1]])  # rows repeated across the iterations
KINDS = ["fori_loop", "while_loop", "scan", "cond"]


class _Net(gc.nn.Module):
    """``fc`` of the iterations' sums of ``lookups`` ((max_norm, norm_type) each) of one row of ``i``
    each; ``read``: "body" adds a read of the weight in the body, "after" one after the node."""

    def __init__(self, kind: str, lookups, read: str | None = None, dtype: str = "float64", scale: float = 1.5):
        super().__init__()
        self.kind, self.lookups, self.read = kind, lookups, read
        self.emb = gc.nn.Embedding(ROWS, DIM, dtype=dtype)
        self.emb.weight = gc.nn.Parameter((RNG.normal(size=(ROWS, DIM)) * scale).astype(dtype), dtype=dtype)
        self.fc = gc.nn.Linear(DIM, 2, dtype=dtype)

    def step(self, rows):
        out = sum(gc.nn.functional.embedding(rows, self.emb.weight, max_norm=m, norm_type=p).sum(0)
                  for m, p in self.lookups)
        return out + self.emb.weight.sum(0) * 0.25 if self.read == "body" else out

    def forward(self, i):
        acc = gc.zeros((DIM,), dtype=self.emb.weight.dtype)
        if self.kind == "fori_loop":
            acc = gc.fori_loop(0, 3, lambda k, a: a + self.step(i[k]), acc)
        elif self.kind == "while_loop":
            acc = gc.while_loop(lambda k, a: k < 3, lambda k, a: (k + 1, a + self.step(i[k])), (gc.tensor(0), acc))[1]
        elif self.kind == "scan":
            acc = gc.scan(lambda a, row: (a + self.step(row), row), acc, i)[0]
        else:
            acc = gc.cond(i[0, 0] >= 3, lambda: self.step(gc.cat([i[0], i[2]])), lambda: acc)
        out = self.fc(acc)
        return out + self.emb.weight.sum() if self.read == "after" else out


def _torch(net: _Net, i: np.ndarray) -> np.ndarray:
    """Torch's Python loop over ``net``'s state: each lookup renormalises its rows in the weight in place."""
    state = {k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()}
    w = state["emb.weight"].clone()
    acc = torch.zeros(DIM, dtype=w.dtype)
    with torch.no_grad():
        for k in ([0, 2] if i[0, 0] >= 3 else []) if net.kind == "cond" else range(3):
            acc = acc + sum(torch.nn.functional.embedding(torch.from_numpy(i[k]), w, max_norm=m, norm_type=p).sum(0)
                            for m, p in net.lookups)
            acc = acc + w.sum(0) * 0.25 if net.read == "body" else acc
        out = acc @ state["fc.weight"].T + state["fc.bias"]
        return (out + w.sum() if net.read == "after" else out).numpy()


def _exported(net: _Net, tmp_path, dtype: str = "float64"):
    """(the captured model, which carries the weight, its Trainer and the exported inference file)."""
    model = gc.capture(net, i=gc.spec("int64", (3, 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
    trainer = gc.Trainer(arts, backend="numpy")
    path = trainer.export_inference(tmp_path / "inference.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    return model, trainer, path


def _ops(graph: onnx.GraphProto) -> list[str]:
    """Every node's op type, nested bodies' included."""
    return [op for n in graph.node for op in [n.op_type, *(o for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
                                                         for o in _ops(a.g))]]


def _carries_the_table(path) -> bool:
    proto = onnx.load(str(path))
    control = [n for n in proto.graph.node if n.op_type in ("Loop", "Scan", "If")]
    return "ScatterND" in _ops(proto.graph) or any("emb.weight" in n.input for n in control)


@pytest.mark.parametrize("kind", KINDS)
def test_an_unread_carried_table_is_dropped_and_matches_torchs_loop(kind, tmp_path):
    """Two lookups with one max_norm in a loop's body (one of rows 0 and 2 in a cond's branch): the exported
    graph and the eval graph (predict, evaluate) copy no table (the old graphs: a ScatterND and a
    whole-table Sub and Add each iteration) and equal torch's loop to 1e-12, the eval graph the carrying
    capture bit for bit."""
    net = _Net(kind, [(1.0, 2.0)] * (1 if kind == "cond" else 2))
    model, trainer, path = _exported(net, tmp_path)
    assert not _carries_the_table(path)
    assert "ScatterND" not in _ops(trainer.artifacts.eval.proto.graph)
    i = STEPS if kind != "cond" else STEPS[::-1].copy()
    want = _torch(net, i)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(path, backend=backend).run({"i": i})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=backend)
    carried = gc.Session(model, backend="numpy").run({"i": i})["output"]
    np.testing.assert_array_equal(trainer.predict({"i": i})["output"], carried)
    y = RNG.normal(size=(2,))
    assert trainer.evaluate({"i": i, "y": y})["loss"] == pytest.approx(float(np.mean((carried - y) ** 2)), rel=1e-14)


@pytest.mark.parametrize("lookups, read", [([(1.0, 2.0), (0.7, 2.0)], None), ([(1.0, 2.0), (1.0, 1.0)], None),
                                           ([(1.0, 2.0)], "body"), ([(1.0, 2.0)], "after")],
                         ids=["two_max_norms", "two_norm_types", "read_in_body", "read_after"])
@pytest.mark.parametrize("kind", ["fori_loop", "scan"])
def test_a_table_read_otherwise_stays_carried_and_matches_torchs_loop(kind, lookups, read, tmp_path):
    """Lookups with different max_norm or norm_type (a row one renormalised reads differently from the
    table as stored), a read of the weight in the body or after the loop: the table stays carried."""
    net = _Net(kind, lookups, read)
    model, _, path = _exported(net, tmp_path)
    assert _carries_the_table(path)
    want = _torch(net, STEPS)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(path, backend=backend).run({"i": STEPS})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=backend)


class _Rows(gc.nn.Module):
    """The rows a lookup with max_norm 1 reads at each step of a ``gc.scan`` over ``i``, stacked."""

    def __init__(self):
        super().__init__()
        self.emb = gc.nn.Embedding(ROWS, DIM, max_norm=1.0, dtype="float32")
        self.emb.weight = gc.nn.Parameter((RNG.normal(size=(ROWS, DIM)) * 30).astype(np.float32), dtype="float32")

    def forward(self, i):
        return gc.scan(lambda a, row: (a, self.emb(row)), gc.zeros((), dtype="float32"), i)[1]


def test_float32_rows_renormalised_again_differ_from_torchs_loop_by_3_ulps(tmp_path):
    """float32, max_norm 1, 40 iterations over 12 rows (each looked up about 13 times): torch renormalises
    a renormalised row again (its norm at max_norm to rounding: scaled by max_norm / (norm + 1e-7)), the
    graph without the carry renormalises the stored row each time; each row within 3 ulps of torch's."""
    steps = RNG.integers(0, ROWS, (40, 4))
    net = _Rows()
    model = gc.capture(net, i=gc.spec("int64", steps.shape))
    path = gc.Trainer(gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1)),
                      backend="numpy").export_inference(tmp_path / "inference.onnx")
    assert not _carries_the_table(path)
    w = torch.from_numpy(net.emb.weight.numpy().copy())
    with torch.no_grad():
        want = np.stack([torch.nn.functional.embedding(torch.from_numpy(row), w, max_norm=1.0).numpy()
                         for row in steps])
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(path, backend=backend).run({"i": steps})["output"]
        np.testing.assert_allclose(got, want, rtol=0, atol=3 * np.finfo(np.float32).eps, err_msg=backend)
