"""Small models and data shared by the Trainer, CLI and export tests."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc import nn


class BNNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: exercises BatchNorm running stats as state."""

    def __init__(self, d_in: int = 8, hidden: int = 16, classes: int = 3):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return {"logits": self.fc2(gc.relu(self.bn(self.fc1(x))))}


class DropBNNet(BNNet):
    """BNNet with Dropout before the head: its noise comes from the Trainer's RNG each step."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return {"logits": self.fc2(self.drop(gc.relu(self.bn(self.fc1(x)))))}


class Prototypes(nn.Module):
    """Logits of a batch against K prototypes fed with it (``[N, K]``: the class count is the
    prototypes' length, known only from the batch), or, with ``twice``, against the prototypes
    and their halves (``[N, 2K]``: a class dim computed inside the model, which no input names)."""

    def __init__(self, twice: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.twice = twice

    def forward(self, x, protos):
        logits = self.fc(x) @ protos.t()
        return {"logits": gc.cat([logits, logits * 0.5], dim=1) if self.twice else logits}


class Contrastive(nn.Module):
    """Logits of a batch against itself (``[N, N]``): row i's class is i, as in CLIP's loss."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return {"logits": self.fc(x) @ x.t()}


def drop_bn_artifacts(optimizer=None):
    """Dropout (RNG), BatchNorm (running stats) and Adam (state, step count): all a resume restores."""
    model = gc.capture(DropBNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), optimizer or gc.optim.Adam(1e-2))


def bn_artifacts(optimizer=None):
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"),
                                optimizer or gc.optim.Adam(1e-2))


def blobs(n: int = 96, d: int = 8, classes: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """Separable Gaussian blobs (fixed centers, ``seed`` draws the samples): x float32[n, d], y int64[n]."""
    centers = np.random.default_rng(1234).standard_normal((classes, d)).astype(np.float32) * 2
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    x = (centers[y] + rng.standard_normal((n, d)).astype(np.float32) * 0.5).astype(np.float32)
    return {"x": x, "y": y}


def imported_mlp(seed: int = 0) -> onnx.ModelProto:
    """An MLP written directly with onnx.helper (never captured by graphc): Gemm/Relu/MatMul/Add,
    one weight kept in a Constant node and one initializer passed through Identity."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((16, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "enc.weight"), numpy_helper.from_array(np.zeros(16, np.float32), "enc.bias"),
             numpy_helper.from_array(np.zeros(3, np.float32), "head.bias")]
    nodes = [
        helper.make_node("Gemm", ["x", "enc.weight", "enc.bias"], ["h"], transB=1, name="enc"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Constant", [], ["head.weight"], value=numpy_helper.from_array(w2, "head.weight"), name="w2"),
        helper.make_node("MatMul", ["r", "head.weight"], ["z"], name="head"),
        helper.make_node("Identity", ["head.bias"], ["hb"], name="alias"),
        helper.make_node("Add", ["z", "hb"], ["logits"], name="add_bias"),
    ]
    graph = helper.make_graph(nodes, "imported_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="not-graphc")
    model.ir_version = 8
    return model


def drop_bn_workdir(root, samples: int, eval_samples: int):
    """``root/arts`` (``drop_bn_artifacts``) and ``root/data.npz`` with ``samples`` blobs as
    ``x_train``/``y_train`` and ``eval_samples`` others as ``x_test``/``y_test``."""
    drop_bn_artifacts().save(root / "arts")
    train, test = blobs(samples), blobs(eval_samples, seed=1)
    np.savez(root / "data.npz", x_train=train["x"], y_train=train["y"], x_test=test["x"], y_test=test["y"])
    return root


def straight_and_resumed(arts, batches, at: int, checkpoint, backend: str = "ort-cpu", resumed_arts=None):
    """A Trainer stepped through ``batches``, and one stepped through the first ``at`` of them,
    checkpointed to ``checkpoint`` and resumed by a fresh Trainer (of ``resumed_arts``, default
    ``arts``) for the rest: ``(straight, resumed)``."""
    straight = gc.Trainer(arts, backend=backend)
    for batch in batches:
        straight.step(batch)
    first = gc.Trainer(arts, backend=backend)
    for batch in batches[:at]:
        first.step(batch)
    first.save_checkpoint(checkpoint)
    resumed = gc.Trainer(arts if resumed_arts is None else resumed_arts, backend=backend)
    resumed.load_checkpoint(checkpoint)
    for batch in batches[at:]:
        resumed.step(batch)
    return straight, resumed


def without_prediction(directory, graph: str, format: str) -> None:
    """The artifact folder ``directory`` as an older graphc wrote it: ``graph`` without its
    prediction output (train_step before format 3, gradients before data-parallel train metrics),
    the manifest of ``format``."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["format"] = format
    entry = manifest["graphs"][graph]
    gone = [o["name"] for o in entry["outputs"] if o["role"] == "prediction"]
    entry["outputs"] = [o for o in entry["outputs"] if o["role"] != "prediction"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    model = onnx.load(directory / entry["file"])
    keep = [o for o in model.graph.output if o.name not in gone]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    onnx.save(model, directory / entry["file"])


def interrupt_at(trainer, at: int) -> list[float]:
    """Make ``trainer.step`` raise ``KeyboardInterrupt`` in place of its call number ``at`` (from 0),
    as a run killed there; returns the list the losses of the steps before it go into."""
    real_step, losses = trainer.step, []

    def step(batch):
        if len(losses) == at:
            raise KeyboardInterrupt
        losses.append(real_step(batch))
        return losses[-1]

    trainer.step = step
    return losses
