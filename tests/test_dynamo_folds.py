"""Functions of parameters that onnxscript's optimizer folds into one tensor (a dynamo export with
its default ``optimize=True``): the folded tensor trains in the parameters' place. One that only
moves their elements (a transpose, a reshape, a concatenation, a negation) trains as torch does,
silently; any other function (``sigmoid(gate)``, a weight norm, ``w * 0.5``, ``a + b``) does not,
and ``generate`` warns, naming the tensor, its parameters and the ops (``fold_records``)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
nn = torch.nn
LR, WD = 1e-2, 0.01
RNG = np.random.default_rng(0)


class Linear3d(nn.Module):
    """A Linear on [N, T, 4]: its weight folded through the Transpose of Linear's conversion (``val_N``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.unsqueeze(1).expand(-1, 2, -1)).mean(1)


class Reshaped(nn.Module):
    """``w.t().reshape(4, 3)`` folded into ``view``; ``b`` into its negation ``neg``."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3))

    def forward(self, x):
        return x @ self.w.t().reshape(4, 3) - self.b


class Concatenated(nn.Module):
    """Two params concatenated and transposed into one tensor ``t``: each element once."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(1, 4))

    def forward(self, x):
        return x @ torch.cat([self.a, self.b]).t()


class Gated(nn.Module):
    """A Linear's output gated by ``sigmoid(gate)``, folded into ``sigmoid``."""

    def __init__(self):
        super().__init__()
        self.fc, self.gate = nn.Linear(4, 3), nn.Parameter(torch.linspace(-1, 1, 3))

    def forward(self, x):
        return self.fc(x) * torch.sigmoid(self.gate)


class Scaled(nn.Module):
    """A param times a constant, folded into ``mul``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x @ (self.w * 0.5)


class Summed(nn.Module):
    """Two params added, folded into ``add``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x @ (self.a + self.b)


class WeightNormed(nn.Module):
    """A weight-normed Linear (``g * v / ||v||`` folded into ``mul``) whose direction repeats a
    value in each row, so the folded tensor repeats values as a copied table does."""

    def __init__(self):
        super().__init__()
        fc = nn.Linear(4, 3)
        with torch.no_grad():
            fc.weight.copy_(torch.tensor([[1.0, 1.0, -2.0, 0.5], [0.3, -0.7, 0.3, 1.1], [2.0, -1.0, 0.4, 2.0]]))
        self.fc = nn.utils.parametrizations.weight_norm(fc)

    def forward(self, x):
        return self.fc(x)


def _export(net: nn.Module, x, tmp_path, optimize: bool = True) -> gc.Model:
    """``net`` exported by the dynamo exporter (its default optimize=True unless told), the file checked."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(net, (x,), dynamo=True, optimize=optimize, verbose=False,
                                    input_names=["x"], output_names=["logits"])
    path = tmp_path / "net.onnx"
    onnx.save(program.model_proto, path)
    onnx.checker.check_model(str(path), full_check=True)
    return gc.load(path)


def _generate(model: gc.Model) -> tuple[gc.training.TrainingArtifacts, list[str]]:
    """The AdamW training artifacts of ``model`` and the folded-parameter warnings ``generate`` gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"),
                                    gc.optim.AdamW(lr=LR, weight_decay=WD))
    return arts, [str(w.message) for w in caught if "folded parameters" in str(w.message)]


def _loss_gap(net: nn.Module, arts, backend: str) -> float:
    """The largest relative gap between graphc's and torch's losses over three AdamW steps (the
    second and third read the updated params) from the same data."""
    x = torch.from_numpy(RNG.standard_normal((8, 4)).astype(np.float32))
    y = torch.from_numpy(RNG.integers(0, 3, 8))
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    gap = 0.0
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        got = trainer.step({"x": x.numpy(), "y": y.numpy()})
        gap = max(gap, abs(float(got) - loss.item()) / abs(loss.item()))
    return gap


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("make", [Linear3d, Reshaped, Concatenated], ids=lambda c: c.__name__)
def test_a_fold_that_moves_elements_trains_as_torch_silently(make, backend, tmp_path):
    torch.manual_seed(0)
    net = make()
    model = _export(net, torch.randn(8, 4), tmp_path)
    folded = [n for n in model.ir.graph.initializers if n not in dict(net.named_parameters())]
    assert folded  # the optimizer did fold a param
    arts, found = _generate(model)
    assert found == []
    assert _loss_gap(net, arts, backend) < 1e-6


@pytest.mark.parametrize(("make", "named"), [
    (Gated, "'sigmoid' (computed from gate by sigmoid)"),
    (Scaled, "'mul' (computed from w by mul)"),
    (Summed, "'add' (computed from a, b by add)"),
    (WeightNormed, "'mul' (computed from fc.parametrizations.weight.original0, fc.parametrizations.weight.original1 "
                   "by div, linalg_vector_norm, mul)"),
], ids=lambda c: getattr(c, "__name__", ""))
def test_a_fold_by_any_other_function_is_named(make, named, tmp_path):
    """Before, only the weight norm was named, as "copies of" its params (its values repeat)."""
    torch.manual_seed(0)
    _, [message] = _generate(_export(make(), torch.randn(8, 4), tmp_path))
    assert named in message and "copies of" not in message
    assert "torch.onnx.export(..., dynamo=True, optimize=False)" in message


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_named_fold_trains_apart_from_torch_and_optimize_false_does_not(backend, tmp_path):
    """``sigmoid(gate)`` trained in the gate's place: three AdamW steps end off torch's losses
    (1.7e-3 relative); exported with optimize=False the gate is a param and they agree to 1e-6."""
    torch.manual_seed(0)
    net = Gated()
    start = {k: v.clone() for k, v in net.state_dict().items()}
    arts, [message] = _generate(_export(net, torch.randn(8, 4), tmp_path))
    assert "'sigmoid' (computed from gate by sigmoid)" in message and "sigmoid" in arts.manifest.trainable and "gate" not in arts.manifest.trainable
    assert _loss_gap(net, arts, backend) > 1e-5
    net.load_state_dict(start)
    arts, found = _generate(_export(net, torch.randn(8, 4), tmp_path, optimize=False))
    assert found == [] and "gate" in arts.manifest.trainable
    assert _loss_gap(net, arts, backend) < 1e-6
