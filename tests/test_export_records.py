"""What a torch.onnx export leaves out about layers that train differently from the file
(``passes/training/export_records``): ``generate`` warns, naming the layer and the fix, or keeps
spectral norm's vectors as exported; ordinary models (a ResNet of Conv/BatchNorm blocks, a
BatchNorm of momentum 0.1 or 0.01, Dropout and LSTM dropout exported in training mode, a 1-layer
LSTM) warn of none of it."""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
torch_zoo = pytest.importorskip("torch_zoo")
nn = torch.nn
OURS = ("spectral norm buffers", "of a training-mode export", "dropped the running statistics", "exported in eval mode")


def _load(net, x, exporter, train=False, **options):
    net = copy.deepcopy(net).train(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            options.setdefault("optimize", False)
            return gc.load(torch.onnx.export(net, (x,), dynamo=True, verbose=False, input_names=["x"],
                                             output_names=["out"], **options).model_proto)
        buffer = io.BytesIO()
        mode = torch.onnx.TrainingMode.TRAINING if train else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(net, (x,), buffer, dynamo=False, input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "N"}}, training=mode, **options)
        return gc.load(buffer.getvalue())


def _generate(model):
    """The artifacts and the warnings of ``export_records`` that generating them gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    return arts, [str(w.message) for w in caught if any(s in str(w.message) for s in OURS)]


def _linear(*layers, width=6):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), *layers, nn.Linear(width, 3)).double()


X = torch.randn(6, 4, dtype=torch.float64)


def test_torchscript_spectral_norm_vectors_are_kept_as_exported_with_a_warning():
    """Before: weight_u and weight_v trained as parameters, silently (the loss of the third AdamW
    step 0.46 off torch's)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.utils.spectral_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 3)).double()
    arts, said = _generate(_load(net, X, "torchscript"))
    assert arts.manifest.trainable == [n for n, _ in net.named_parameters()]
    assert set(arts.manifest.constants) == {"0.weight_u", "0.weight_v"}
    assert len(said) == 1 and "'0.weight_u', '0.weight_v'" in said[0] and "dynamo=True" in said[0]


def test_a_training_export_of_a_counting_batchnorm_warns_of_its_momentum():
    """BatchNorm(momentum=None) after 3 batches (the export's forward makes 4): momentum 1 - 1/4.
    Before: no warning, the running statistics 2.5e-2 off torch's after 3 steps."""
    net = _linear(nn.BatchNorm1d(6, momentum=None))
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(6, 4, dtype=torch.float64))
    _, said = _generate(_load(net, X, "torchscript", train=True))
    assert len(said) == 1 and "'1' (momentum 0.75)" in said[0] and "momentum=None" in said[0]


@pytest.mark.parametrize("momentum", [0.1, 0.01])
def test_a_training_export_of_a_batchnorm_of_a_written_momentum_warns_not(momentum):
    _, said = _generate(_load(_linear(nn.BatchNorm1d(6, momentum=momentum)), X, "torchscript", train=True))
    assert said == []


class _InstanceNormed(nn.Module):
    def __init__(self, track):
        super().__init__()
        self.c = nn.Conv1d(2, 3, 3)
        self.n = nn.InstanceNorm1d(3, affine=True, track_running_stats=track)
        self.h = nn.Linear(18, 3)

    def forward(self, x):
        return self.h(self.n(self.c(x)).flatten(1))


@pytest.mark.parametrize("track", [True, False])
def test_a_dynamo_export_that_drops_an_instance_norms_statistics_warns(track):
    """Before: no warning; torch tracks the statistics and normalizes with them in eval."""
    torch.manual_seed(0)
    model = _load(_InstanceNormed(track).double(), torch.randn(5, 2, 8, dtype=torch.float64), "dynamo", train=True)
    _, said = _generate(model)
    if track:
        assert len(said) == 1 and "'n' (n.running_mean, n.running_var)" in said[0] and "model.eval()" in said[0]
    else:
        assert said == []


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_eval_export_of_an_instance_norms_statistics_trains_them_as_torch(backend):
    """The fix the warning above names: a dynamo eval-mode export keeps the statistics (tracked for two
    batches here, so not torch's initial zeros and ones) as a BatchNormalization of them tiled over the
    batch. 3 SGD steps in train mode against torch's: losses within 1e-10, params 1e-9, the statistics
    2.4e-7 relative (torch's momentum 0.1 is the float32 attribute 1 - 0.9), eval outputs 1e-7."""
    torch.manual_seed(0)
    net = _InstanceNormed(True).double().train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(5, 2, 8, dtype=torch.float64))
    arts, said = _generate(_load(net, torch.randn(5, 2, 8, dtype=torch.float64), "dynamo"))
    assert said == [] and {"n.running_mean", "n.running_var"} <= set(arts.manifest.state)
    trainer, opt = gc.Trainer(arts, backend=backend), torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        x, y = (torch.tensor(RNG.standard_normal(shape)) for shape in ((5, 2, 8), (5, 3)))
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        assert trainer.step({"x": x.numpy(), "y": y.numpy()}) == pytest.approx(loss.item(), rel=1e-10, abs=0)
    state = trainer.state_dict()
    for name, value in net.named_parameters():
        np.testing.assert_allclose(state[name], value.detach().numpy(), rtol=0, atol=1e-9, err_msg=name)
    for name in ("n.running_mean", "n.running_var"):
        np.testing.assert_allclose(state[name], net.state_dict()[name].numpy(), rtol=3e-7, atol=1e-12, err_msg=name)
    x = torch.tensor(RNG.standard_normal((5, 2, 8)))
    np.testing.assert_allclose(trainer.predict({"x": x.numpy()})["out"], net.eval()(x).detach().numpy(), rtol=0,
                               atol=1e-7)


@pytest.mark.parametrize("train", [False, True])
def test_a_dynamo_eval_export_of_dropout_warns(train):
    """Before: an eval-mode export trained its Dropout as the identity, silently (Dropout(0.5):
    losses 0.3 off torch's train mode)."""
    _, said = _generate(_load(_linear(nn.Dropout(0.5)), X, "dynamo", train=train))
    if train:
        assert said == []
    else:
        assert len(said) == 1 and "'1' (Dropout)" in said[0] and "model.train()" in said[0]


class _Recurrent(nn.Module):
    def __init__(self, cls, layers):
        super().__init__()
        self.r, self.h = cls(4, 5, num_layers=layers, dropout=0.5 if layers > 1 else 0.0, batch_first=True), nn.Linear(5, 3)

    def forward(self, x):
        return self.h(self.r(x)[0][:, -1])


@pytest.mark.parametrize("cls, layers, train", [(nn.LSTM, 2, False), (nn.GRU, 2, False), (nn.LSTM, 2, True),
                                                (nn.LSTM, 1, False)])
def test_a_dynamo_eval_export_of_a_recurrent_layers_dropout_warns(cls, layers, train):
    """Before: the dropout between layers, absent from an eval-mode export, silently (GRU: losses
    3e-2 off torch's train mode)."""
    torch.manual_seed(0)
    model = _load(_Recurrent(cls, layers).double(), torch.randn(3, 6, 4, dtype=torch.float64), "dynamo", train=train)
    _, said = _generate(model)
    if train or layers == 1:
        assert said == []
    else:
        assert len(said) == 1 and f"'r' ({cls.__name__.upper()}, dropout 0.5 between layers)" in said[0]


@pytest.mark.parametrize("exporter, train, optimize", [("dynamo", False, True), ("dynamo", True, False),
                                                        ("dynamo", False, False), ("torchscript", True, None),
                                                        ("torchscript", False, None)])
def test_a_resnet_warns_of_none_of_it(exporter, train, optimize):
    net, x, _ = torch_zoo.build("resnet", torch.float64)
    options = {} if optimize is None else {"optimize": optimize}
    _, said = _generate(_load(net, x, exporter, train=train, **options))
    assert said == []
