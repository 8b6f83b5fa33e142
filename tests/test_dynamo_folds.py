"""Functions of parameters that onnxscript's optimizer folds into one tensor (a dynamo export with
its default ``optimize=True``): the folded tensor trains in the parameters' place. One that only
moves their elements (a transpose, a reshape, a concatenation, a negation) trains as torch does,
silently; any other function (``sigmoid(gate)``, a weight norm, ``w * 0.5``, ``a + b``) does not,
and ``generate`` warns, naming the tensor, its parameters and the ops (``fold_records``)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
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


def _generate(model: gc.Model, optimizer=None, **options) -> tuple[gc.training.TrainingArtifacts, list[str]]:
    """The training artifacts of ``model`` (by default AdamW's) and the folded-parameter warnings
    ``generate`` gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"),
                                    optimizer or gc.optim.AdamW(lr=LR, weight_decay=WD), **options)
    return arts, [str(w.message) for w in caught if "folded parameters" in str(w.message)]


def _gaps(net: nn.Module, arts, backend: str, opt=None) -> tuple[float, float]:
    """The largest relative gap between graphc's and torch's losses over three steps of ``opt`` (by
    default AdamW on every param; the second and third read the updated params) from the same data,
    and the largest gap between their params after them, each tensor's values sorted (a folded one
    holds its parameter's elements moved: ``manifest.sources`` names it; other folds left out)."""
    x = torch.from_numpy(RNG.standard_normal((8, 4)).astype(np.float32))
    y = torch.from_numpy(RNG.integers(0, 3, 8))
    trainer = gc.Trainer(arts, backend=backend)
    opt = opt or torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    gap = 0.0
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        got = trainer.step({"x": x.numpy(), "y": y.numpy()})
        gap = max(gap, abs(float(got) - loss.item()) / abs(loss.item()))
    theirs = dict(net.named_parameters())
    params = {arts.manifest.sources.get(n, n): np.sort(a, axis=None) for n, a in trainer.params.items()}
    return gap, max((float(np.abs(a - np.sort(theirs[n].detach().numpy(), axis=None)).max())
                    for n, a in params.items() if n in theirs), default=0.0)


def _loss_gap(net: nn.Module, arts, backend: str) -> float:
    """``_gaps``' loss gap for AdamW on every param."""
    return _gaps(net, arts, backend)[0]


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


class FoldedLinear(nn.Module):
    """``fc1`` folded: its weight transposed by Linear's conversion of a 3-D input (``val_6``), its
    bias reshaped (``view``); ``fc2`` kept."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x):
        h = nn.functional.linear(x.unsqueeze(1).expand(-1, 2, -1), self.fc1.weight) + self.fc1.bias.view(1, 1, 5)
        return self.fc2(torch.relu(h).mean(1))


def _folded_linear(tmp_path) -> tuple[nn.Module, gc.Model]:
    torch.manual_seed(0)
    net = FoldedLinear()
    return net, _export(net, torch.randn(8, 4), tmp_path)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_no_decay_selects_a_folded_bias_by_its_parameter_name(backend, fused, tmp_path):
    """torch's param groups (AdamW weight_decay 0.1 for weights, 0 for biases). Before, ``*.bias``
    matched fc2.bias alone and fc1's bias, folded into ``view``, was decayed."""
    net, model = _folded_linear(tmp_path)
    arts, found = _generate(model, gc.optim.AdamW(lr=LR, weight_decay=0.1, no_decay=["*.bias"]), fused=fused)
    assert found == [] and arts.manifest.sources == {"val_6": "fc1.weight", "view": "fc1.bias"}
    assert set(arts.manifest.trainable) == {"val_6", "view", "fc2.weight", "fc2.bias"}
    named = dict(net.named_parameters())
    groups = [{"params": [p for n, p in named.items() if not n.endswith(".bias")]},
              {"params": [p for n, p in named.items() if n.endswith(".bias")], "weight_decay": 0.0}]
    loss_gap, param_gap = _gaps(net, arts, backend, torch.optim.AdamW(groups, lr=LR, weight_decay=0.1))
    assert loss_gap < 1e-6 and param_gap < 1e-6


def test_the_workers_update_graph_selects_a_folded_bias_by_its_parameter_name(tmp_path):
    """Data-parallel workers' update (built from the manifest alone, one update per param): with
    zero gradients AdamW only decays, ones to 1 - lr * 0.1 except the biases (before: ``view`` decayed)."""
    _, model = _folded_linear(tmp_path)
    arts, _ = _generate(model, gc.optim.AdamW(lr=LR, weight_decay=0.1, no_decay=["*.bias"]), fused=False)
    update = gc.compile.training.update_model(arts.manifest).ir
    path = tmp_path / "update.onnx"
    onnx.save(ir.to_proto(update), path)
    onnx.checker.check_model(str(path), full_check=True)
    feeds = {v.name: np.full(list(v.shape), 1.0 if v.name in arts.manifest.trainable else 0.0, np.float32)
             for v in update.graph.inputs if v.dtype == ir.DataType.FLOAT}
    feeds.update(step=np.array(0, np.int64), lr=np.array(LR, np.float32))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert {p: float(got[f"{p}.next"].flat[0]) for p in arts.manifest.trainable} == pytest.approx(
        {"val_6": 1 - LR * 0.1, "view": 1.0, "fc2.weight": 1 - LR * 0.1, "fc2.bias": 1.0}, abs=1e-7)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_frozen_by_parameter_name_freezes_the_folded_tensor(backend, tmp_path):
    """``frozen=["fc1.weight"]`` freezes ``val_6`` (before: an unknown-parameter error), as
    ``requires_grad_(False)`` does in torch."""
    net, model = _folded_linear(tmp_path)
    arts, _ = _generate(model, frozen=["fc1.weight"])
    assert "val_6" in arts.manifest.frozen and "val_6" not in arts.manifest.trainable
    net.fc1.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=LR, weight_decay=WD)
    loss_gap, param_gap = _gaps(net, arts, backend, opt)
    assert loss_gap < 1e-6 and param_gap < 1e-6
    arts, _ = _generate(model, trainable=["fc1.*"], params=["fc1.bias"])
    assert arts.manifest.trainable == ["val_6", "view"]


def test_an_unknown_name_lists_folded_tensors_with_their_parameters(tmp_path):
    _, model = _folded_linear(tmp_path)
    with pytest.raises(gc.PassError) as caught:
        _generate(model, frozen=["fc3.weight"])
    assert "val_6 (fc1.weight, re-laid out by the exporter), view (fc1.bias, reshaped)" in str(caught.value)
    with pytest.raises(gc.PassError, match=r"no_decay pattern\(s\) \['fc3.bias'\].*view \(fc1.bias\)"):
        _generate(model, gc.optim.AdamW(lr=LR, no_decay=["fc3.bias"]))


@pytest.mark.parametrize(("make", "pattern", "held"), [
    (Gated, "gate", "'gate' names a parameter folded into 'sigmoid' (computed from gate by sigmoid)"),
    (Concatenated, "b", "'b' names a parameter folded into 't' (a, b, transposed, concatenated)"),
], ids=["warned", "two_params"])
def test_a_name_of_a_parameter_folded_with_a_function_or_others_selects_nothing(make, pattern, held, tmp_path):
    """Only a fold that moves one parameter's elements trains as it: the others are refused by
    that parameter's name, the error naming the tensor to select instead."""
    torch.manual_seed(0)
    model = _export(make(), torch.randn(8, 4), tmp_path)
    with pytest.raises(gc.PassError) as caught:
        _generate(model, frozen=[pattern])
    assert held in str(caught.value)


def test_a_pattern_naming_a_parameter_of_a_warned_fold_is_said_in_the_warning(tmp_path):
    """``*a*`` selects fc.bias for no_decay and names ``gate``, whose fold ``sigmoid`` it leaves
    decayed: the folded-parameters warning says so (before: nothing)."""
    torch.manual_seed(0)
    model = _export(Gated(), torch.randn(8, 4), tmp_path)
    arts, [message] = _generate(model, gc.optim.AdamW(lr=LR, no_decay=["*a*"]))
    assert "'sigmoid' (computed from gate by sigmoid; no_decay= '*a*' names gate, not this tensor)" in message
    assert [b.params for b in arts.manifest.layout if b.weight_decay == 0] == [["fc.bias"]]


def test_a_pattern_naming_a_parameter_folded_with_others_is_warned_about(tmp_path):
    """``b*`` selects ``bias`` and names ``b``, concatenated with ``a`` into ``t`` (which trains as
    they do, so no folded-parameters warning): a warning of its own says ``t`` is not selected."""

    class Biased(Concatenated):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(9))

        def forward(self, x):
            return super().forward(x) + self.bias

    torch.manual_seed(0)
    model = _export(Biased(), torch.randn(8, 4), tmp_path)
    with pytest.warns(UserWarning, match=r"'t' \(a, b, transposed, concatenated\); no_decay= 'b\*' names b, not this"):
        gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(lr=LR, no_decay=["b*"]))
