"""Which forwards mix the batch's rows (``passes/training/row_mixing.py``) and the
``gc.DataParallelWarning`` ``gc.Trainer(workers=N)`` gives for them
(``graphc.runtime.distributed.mixed_rows``), run on training artifacts without Ray: the models/
examples and row-wise ops give none; forwards that mix rows, in the DSL and exported by torch,
name the node, its op type and the DSL line."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.nn import functional as F
from graphc.runtime.distributed.mixed_rows import warn_mixed_rows
from graphc.runtime.rows import batch_dim, by_rows

RNG = np.random.default_rng(0)
THIS = "tests/test_row_mixing.py"


def _found(arts, workers: int = 2) -> list[str]:
    """The warning's nodes as ``op_type node_name``, the inputs split as ``DistributedTrainer``
    splits them; no warning where none is found."""
    specs = arts.manifest.graphs["eval"].inputs
    dim = batch_dim(specs)
    rows = {e.name for e in specs if by_rows(e, dim, computed=True)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = warn_mixed_rows(arts.eval, arts.manifest, rows, workers)
    mine = [w for w in caught if issubclass(w.category, gc.DataParallelWarning)]
    assert len(mine) == (1 if found else 0)
    if found:
        assert "\n" not in str(mine[0].message)
    return [f"{m.node.op_type} {m.node.name}" for m in found]


class _Rowwise(nn.Module):
    """Row-wise ops the analysis follows: moves, flattens, per-row normalisations and reductions,
    products within rows."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.out = nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.ln(self.fc(x))                                   # [N, 8]
        h = h - h.mean(1, keepdim=True)
        q = h.reshape(-1, 2, 4)                                    # [N, 2, 4]
        att = F.softmax(q @ q.transpose(1, 2), -1)                 # [N, 2, 2]: within each row
        h = (att @ gc.cumsum(q, 2)).transpose(1, 2).flatten(1)     # [N, 4, 2] -> [N, 8]
        return {"logits": self.out(F.softmax(h, dim=-1))}


def _mixer(kind: str):
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            z = self.fc(x)
            if kind == "gram":
                return {"out": z @ z.t()}  # an MSE on z z^T
            if kind == "centred":
                return {"out": z - z.mean(0)}
            if kind == "negatives":
                return {"out": (z * gc.flip(z, [0])).sum(-1, keepdim=True)}  # another row as a negative
            if kind == "cdist":
                return {"out": gc.cdist(z, z)}
            if kind == "softmax":
                return {"out": F.softmax(z, dim=0)}
            if kind == "cumsum":
                return {"out": gc.cumsum(z, 0)}
            return {"out": z[1:] - z[:-1]}  # neighbours
    return Mixer()


# kind: (the op type reported first, or None for any; the forward's line, by its text)
MIXERS = {"gram": ("MatMul", "z @ z.t()"), "centred": ("ReduceMean", "z - z.mean(0)"),
          "negatives": (None, "gc.flip(z, [0])"), "cdist": (None, "gc.cdist(z, z)"),
          "softmax": ("Softmax", "F.softmax(z, dim=0)"), "cumsum": ("CumSum", "gc.cumsum(z, 0)"),
          "diff": ("Slice", "z[1:] - z[:-1]")}


def _line(text: str) -> int:
    """The line of this file that holds ``text`` after ``return``."""
    lines = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "return" in line and text in line)


def _mse(model, output: str):
    return gc.training.generate(model, gc.losses.mse(output, label="t"), gc.optim.SGD(0.1))


@pytest.mark.parametrize("name", ["two_layer_net", "cnn", "resnet", "transformer", "gpt", "lstm_lm", "packed_lstm",
                                  "audio_cnn", "unet", "sn_discriminator"])
def test_the_example_models_mix_no_rows(name):
    """models/ (flow and vae return their own batch-mean loss, which data-parallel refuses)."""
    module = importlib.import_module(f"graphc.models.{name}")
    factory = next(getattr(module, n) for n in dir(module) if isinstance(getattr(module, n), type)
                   and getattr(module, n).__module__ == module.__name__ and hasattr(module, "example_inputs")
                   and n.lower().replace("_", "") in {name.replace("_", ""), "lenet", "resnet", "transformerencoder",
                                                       "gpt", "lstmlanguagemodel", "packedlstmclassifier", "audiocnn",
                                                       "unet", "sndiscriminator", "twolayernet"})
    model = gc.capture(factory(), seed=0, **module.example_inputs())
    output = next(v.name for v in model.graph.outputs if v.dtype is not None and v.dtype.is_floating_point())
    assert _found(_mse(model, output)) == []


def test_row_wise_ops_mix_no_rows():
    model = gc.capture(_Rowwise(), seed=0, x=gc.spec("float32", ("N", 6)))
    assert _found(gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))) == []


class _TiedMaxNorm(nn.Module):
    """An Embedding(max_norm) whose weight a tied output layer reads after the lookup renormalised it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 3, max_norm=1.0)

    def forward(self, i):
        return {"out": F.linear(self.emb(i).mean(1), self.emb.weight)}


def test_an_embeddings_max_norm_write_back_mixes_no_rows():
    """Its ScatterND writes the batch's rows into the weight, but the workers write back the union of
    every shard's rows (``renorm_rows``), as one process: no warning."""
    model = gc.capture(_TiedMaxNorm(), seed=0, i=gc.spec("int64", ("N", 4)))
    assert _found(_mse(model, "out")) == []


class _Untracked(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 4), norm(4, track_running_stats=False)

    def forward(self, x):
        return {"out": self.bn(self.fc(x))}


def test_a_syncbatchnorm_without_running_statistics_mixes_no_rows():
    """Its statistics (plain ops) are taken over every worker's shard in training: no warning;
    BatchNorm1d's, the same ops per worker, are reported (their ReduceMean over the batch)."""
    for norm, found in ((nn.SyncBatchNorm, []), (nn.BatchNorm1d, ["ReduceMean bn/ReduceMean"])):
        model = gc.capture(_Untracked(norm), seed=0, x=gc.spec("float32", ("N", 6)))
        assert _found(_mse(model, "out"))[:1] == found, norm


@pytest.mark.parametrize("kind", list(MIXERS))
def test_a_forward_that_mixes_rows_is_named_with_its_op_and_line(kind):
    op, text = MIXERS[kind]
    line = _line(text)
    model = gc.capture(_mixer(kind), seed=0, x=gc.spec("float32", ("N", 6)))
    arts = _mse(model, "out")
    found = _found(arts)
    assert found and (op is None or found[0].startswith(op))
    with pytest.warns(gc.DataParallelWarning, match=rf"workers=2\): the model's forward may mix the batch's rows: "
                                                    rf"node '[^']+' \(\w+, {THIS}:{line}\): "):
        _found_warns(arts)
    assert _found(arts, workers=1) == []


def _found_warns(arts) -> None:
    specs = arts.manifest.graphs["eval"].inputs
    warn_mixed_rows(arts.eval, arts.manifest, {e.name for e in specs if e.role in ("data", "label")}, 2)


def _torch_export(module, tmp_path, width: int = 6) -> gc.Model:
    torch = pytest.importorskip("torch")
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(4, width),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["out"], dynamic_axes={"x": {0: "N"}, "out": {0: "N"}})
    return gc.load(path)


@pytest.mark.parametrize("kind", ["gram", "centred", "cdist", "rowwise"])
def test_torch_exported_forwards(kind, tmp_path):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ln = torch.nn.Linear(6, 4), torch.nn.LayerNorm(4)

        def forward(self, x):
            z = self.fc(x)
            if kind == "rowwise":
                return torch.softmax(self.ln(z).flatten(1), -1) - (z[:, :, None] @ z[:, None, :]).sum(-1)
            return {"gram": lambda: z @ z.T, "centred": lambda: z - z.mean(0), "cdist": lambda: torch.cdist(z, z)}[kind]()

    found = _found(_mse(_torch_export(Net(), tmp_path), "out"))
    assert (found == []) == (kind == "rowwise"), found
