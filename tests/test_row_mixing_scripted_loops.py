"""The Loop torch.onnx's TorchScript exporter writes for a ``torch.jit.script`` for-loop over time (a
hand-written RNN cell): its body reads ``x[:, t]`` through a Slice whose axes and steps are
``Unsqueeze``s of outer Constants, and types none of its values but the last. The row analysis folds
those and infers the body's shapes (``passes/training/row_shapes.py``), leaving the model as it was:
2 workers train it as torch does on the whole batch, with no ``gc.DataParallelWarning``; a batch mean
inside the body is named."""

from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.training.row_mixing import mixing_nodes
from graphc.passes.values import static_shape

torch = pytest.importorskip("torch")

from ray_util import ray_cluster, workers_step_as_torch  # noqa: E402, F401 - the module's fixture
from test_row_mixing import _found, _mse  # noqa: E402

RNG = np.random.default_rng(0)


class _Rnn(torch.nn.Module):
    """x [N, T, 5] -> [N, 3] in float64: a tanh cell over the T steps; ``mix`` centres h over the batch each step."""

    __constants__ = ["mix"]  # (TorchScript compiles the branch for its value)

    def __init__(self, mix: bool = False):
        super().__init__()
        self.mix = mix
        f64 = {"dtype": torch.float64}
        self.wx, self.wh, self.fc = torch.nn.Linear(5, 4, **f64), torch.nn.Linear(4, 4, **f64), torch.nn.Linear(4, 3, **f64)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 4, dtype=torch.float64)
        for t in range(x.shape[1]):
            h = torch.tanh(self.wx(x[:, t]) + self.wh(h))
            if self.mix:
                h = h - h.mean(0)
        return self.fc(h)


def _export(net: torch.nn.Module, path, opset: int) -> gc.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(net), (torch.randn(2, 7, 5, dtype=torch.float64),), str(path),
                          dynamo=False, opset_version=opset, input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "N", 1: "T"}, "out": {0: "N"}})
    return gc.load(path)


def _values(graph: ir.Graph) -> list:
    """Each value the graph's nodes (its bodies' included) read or write: its shape, dtype and uses."""
    return [(v.name, static_shape(v), v.dtype, len(list(v.uses()))) for n in ir.traversal.RecursiveGraphIterator(graph)
            for v in (*n.inputs, *n.outputs) if v is not None]


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("mix", [False, True])
def test_a_scripted_loop_keeps_rows_apart_or_names_its_mix(opset, mix, tmp_path):
    """On the training artefacts (what gc.Trainer checks) and on the loaded graph itself, whose body
    values have no shapes: nothing found, or the body's ReduceMean; the model is left as it was."""
    model = _export(_Rnn(mix), tmp_path / "m.onnx", opset)
    loop = next(n for n in model.graph if n.op_type == "Loop")
    body = list(loop.attributes["body"].value)
    assert "Unsqueeze" in [v.producer().op_type for n in body if n.op_type == "Slice" for v in n.inputs[3:]]
    assert static_shape(next(n for n in body if n.op_type == "Add").outputs[0]) is None
    before = _values(model.graph)
    why = ["ReduceMean: it reduces the batch axis 0 (inside the body of Loop '/Loop')"] if mix else []
    assert [f"{m.node.op_type}: {m.why}" for m in mixing_nodes(model.graph, {"x": 0}, "out")] == why
    assert _values(model.graph) == before
    assert _found(_mse(model, "out")) == (["ReduceMean /ReduceMean"] if mix else [])


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_two_workers_train_a_scripted_loop_as_torch_on_the_whole_batch(ray_cluster, backend, tmp_path):
    """3 SGD steps on batches of 5 (shards of 3 and 2): losses and weights equal torch's to 1e-12."""
    torch.manual_seed(0)
    net = _Rnn()
    arts = gc.training.generate(_export(net, tmp_path / "m.onnx", 17), gc.losses.mse("out", label="t"),
                                gc.optim.SGD(0.1))
    batches = [{"x": RNG.normal(size=(5, 7, 5)), "t": RNG.normal(size=(5, 3))} for _ in range(3)]
    opt, want = torch.optim.SGD(net.parameters(), 0.1), []
    for b in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.from_numpy(b["x"])), torch.from_numpy(b["t"]))
        loss.backward()
        opt.step()
        want.append(loss.item())
    workers_step_as_torch(arts, backend, batches, want, net, list(net.state_dict()))
