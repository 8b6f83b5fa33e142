"""Imported (not captured) models become trainable: Constant weights, aliased and shared
initializers, shape arithmetic, frozen params, BatchNorm statistics and Dropout modes."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

import graphc as gc
import training_models
from test_training_artifacts import check_graph, train

RNG = np.random.default_rng(0)


def _regression_batch(n=16):
    return {"x": RNG.normal(size=(n, 6)).astype(np.float32), "y": RNG.normal(size=(n, 8)).astype(np.float32)}


def _awkward_arts(dropout=0.1, **kwargs):
    return gc.training.generate(training_models.awkward(dropout=dropout), gc.losses.mse("out", label="y"),
                                gc.optim.SGD(0.05, momentum=0.9), **kwargs)


def test_constant_weights_become_trainable_and_scalars_stay_constants():
    arts = _awkward_arts()
    assert set(arts.manifest.trainable) == {"emb.weight", "head.bias", "proj.weight"}
    assert "scale" not in arts.state
    for graph in arts.graphs.values():
        check_graph(graph)
    # the inference graph names the promoted weight as the state does, so trained values fold in
    assert "proj.weight" in {i.name for i in arts.inference.proto.graph.initializer}
    np.testing.assert_array_equal(arts.state["proj.weight"], arts.inference.params["proj.weight"])
    batch = _regression_batch()
    noise = {"dropout_noise.0": np.random.default_rng(1).random((16, 8), dtype=np.float32)}  # Dropout input: [B, 8]
    grads = gc.Session(arts.gradients, backend="numpy").run({**batch, **noise})
    assert np.abs(grads["proj.weight_grad"]).max() > 0


def test_aliased_and_shared_weight_gradients_are_summed():
    """emb.weight is read directly and as head.weight through Identity: its gradient is the sum
    of both uses, checked against central differences (Dropout ratio 0: deterministic)."""
    arts = _awkward_arts(dropout=0.0)
    batch = _regression_batch(5)
    grads = gc.Session(arts.gradients, backend="numpy").run(batch)["emb.weight_grad"]

    ev = gc.Session(arts.eval, backend="numpy")
    w = arts.state["emb.weight"].astype(np.float64)
    eps = 1e-2
    numeric = np.zeros_like(w)
    for idx in [(0, 0), (3, 5), (7, 2), (4, 4)]:
        plus, minus = w.copy(), w.copy()
        plus[idx] += eps
        minus[idx] -= eps
        lp = ev.run({**batch, "emb.weight": plus.astype(np.float32)})["loss"]
        lm = ev.run({**batch, "emb.weight": minus.astype(np.float32)})["loss"]
        numeric[idx] = (float(lp) - float(lm)) / (2 * eps)
        np.testing.assert_allclose(grads[idx], numeric[idx], rtol=2e-2, atol=2e-4)


def test_frozen_params_unchanged_bit_for_bit_while_loss_falls():
    arts = _awkward_arts(dropout=0.0, frozen=["emb.weight"])  # ratio 0: a deterministic loss curve
    assert arts.manifest.frozen == ["emb.weight"]
    assert "emb.weight" not in {e.name for e in arts.manifest.graphs["train_step"].inputs}
    assert "emb.weight" not in arts.state
    before = nh.to_array(next(i for i in training_models.awkward().proto.graph.initializer if i.name == "emb.weight"))
    batch = {"x": _regression_batch()["x"], "y": np.full((16, 8), 0.5, np.float32)}  # reachable target
    losses, state = train(arts, batch, 20, backend="ort-cpu")
    assert max(losses[-3:]) < 0.5 * losses[0], losses
    for key, graph in arts.graphs.items():
        frozen = graph.params["emb.weight"]
        assert frozen.tobytes() == before.tobytes(), key
    assert not np.array_equal(state["proj.weight"], arts.state["proj.weight"])


def test_explicit_trainable_subset():
    arts = _awkward_arts(trainable=["head.bias"])
    assert arts.manifest.trainable == ["head.bias"]
    assert set(arts.manifest.frozen) == {"emb.weight", "proj.weight"}
    assert [e.name for e in arts.manifest.graphs["gradients"].outputs] == ["loss", "head.bias_grad", "out"]


def test_dropout_is_training_mode_in_train_step_and_identity_in_eval():
    arts = _awkward_arts()
    ops = {g: [n.op_type for n in arts.graphs[g].proto.graph.node] for g in arts.graphs}
    # training mode: the Dropout is written out in standard ops on an explicit noise input
    for key in ("train_step", "gradients"):
        assert "Dropout" not in ops[key] and "GreaterOrEqual" in ops[key], ops[key]
        noise = [e for e in arts.manifest.graphs[key].inputs if e.role == "noise"]
        assert [(e.name, e.dtype, e.shape[1:]) for e in noise] == [("dropout_noise.0", "float32", [8])]
    # kept where noise >= ratio (0.1), scaled by 1/(1-ratio): the loss follows the mask
    batch = _regression_batch(4)
    noise = np.random.default_rng(1).random((4, 8), dtype=np.float32)
    step = gc.Session(arts.gradients, backend="numpy")
    keep_all = step.run({**batch, "dropout_noise.0": np.ones((4, 8), np.float32)})["loss"]
    drop_all = step.run({**batch, "dropout_noise.0": np.zeros((4, 8), np.float32)})["loss"]
    assert keep_all != drop_all
    c = gc.Session(arts.eval, backend="numpy").run({**batch})  # the identity in eval
    assert c["loss"] != keep_all  # the 1/(1-ratio) scale
    np.testing.assert_allclose(step.run({**batch, "dropout_noise.0": noise})["loss"],
                               gc.Session(arts.gradients, backend="ort-cpu").run({**batch, "dropout_noise.0": noise})["loss"],
                               rtol=1e-6)
    for key in ("eval", "inference"):
        dropouts = [n for n in arts.graphs[key].proto.graph.node if n.op_type == "Dropout"]
        assert all(len(n.input) <= 2 for n in dropouts), ops[key]
    a = gc.Session(arts.eval, backend="numpy").run(batch)
    b = gc.Session(arts.eval, backend="ort-cpu").run(batch)
    np.testing.assert_allclose(a["out"], b["out"], rtol=1e-5)


# -- BatchNorm --------------------------------------------------------------------------------
def _bn_arts(batch: int | str = "N", scaled: bool = False):
    return gc.training.generate(training_models.batchnorm(batch=batch, scaled=scaled),
                                gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))


@pytest.mark.parametrize("batch", ["N", 6])
def test_no_node_reads_a_batchnorm_input_for_its_size(batch):
    """onnxruntime does not fold Size: a Size (or Shape) of a BatchNorm's input, for the running
    variance's count or the gradient's, kept that full-size value alive from the forward to the
    end of the step. The count is a constant, times the batch read off the graph input's shape
    when it is symbolic; the gradient's reads dy."""
    arts = _bn_arts(batch, scaled=True)
    assert "s.weight" in arts.manifest.trainable
    assert not [n.name for n in arts.train_step.proto.graph.node if n.op_type in ("Size", "Shape") and "xs" in n.input]
    x, y = RNG.normal(size=(6, 3, 5)).astype(np.float32), RNG.integers(0, 4, 6)
    out = gc.Session(arts.train_step, backend="ort-cpu").run({"x": x, "y": y, **arts.state})
    xs = x.astype(np.float64) * arts.state["s.weight"]
    np.testing.assert_allclose(out["bn.running_var.next"],
                               0.9 * arts.state["bn.running_var"] + 0.1 * xs.var(axis=(0, 2), ddof=1), rtol=1e-5)


@pytest.mark.parametrize(("batch", "length"), [("?", "?"), ("N", "L"), ("N", 5), (6, "?")])
def test_the_running_variance_counts_the_values_of_a_channel(batch, length):
    """The unbiased variance's count N*L, computed without reading the BatchNorm's input where it
    can: static dims as constants, a named symbolic dim off the graph input's shape, an unnamed
    one (``?`` loads as unnamed) off x's own shape. Each dim its own: N*N would be 36, not 30."""
    arts = gc.training.generate(training_models.pooled_batchnorm(batch, length),
                                gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    x, y = RNG.normal(size=(6, 3, 5)).astype(np.float32), RNG.integers(0, 4, 6)
    out = gc.Session(arts.train_step, backend="ort-cpu").run({"x": x, "y": y, **arts.state})
    np.testing.assert_allclose(out["bn.running_var.next"],
                               0.9 * arts.state["bn.running_var"] + 0.1 * x.var(axis=(0, 2), ddof=1), rtol=1e-5)


@pytest.mark.parametrize("batch", ["N", 6])
def test_batchnorm_stats_are_state_updated_like_pytorch(batch):
    arts = _bn_arts(batch)
    roles = {e.name: e.role for e in arts.manifest.graphs["train_step"].inputs}
    assert roles["bn.running_mean"] == roles["bn.running_var"] == "state"
    assert "bn.running_mean" not in arts.manifest.trainable and "bn.weight" in arts.manifest.trainable
    assert arts.manifest.feeds["bn.running_var.next"] == "bn.running_var"
    # no training-mode BatchNormalization is left (onnxruntime's inference build has no kernel for
    # it): the statistics are written out, and an inference-mode one normalises with them
    bns = [n for n in arts.train_step.proto.graph.node if n.op_type == "BatchNormalization"]
    assert bns and all(len(n.output) == 1 and all(a.name != "training_mode" or a.i == 0 for a in n.attribute)
                       for n in bns)
    x = RNG.normal(1.0, 2.0, size=(6, 3, 5)).astype(np.float32)
    y = RNG.integers(0, 4, 6)
    out = gc.Session(arts.train_step, backend="ort-cpu").run({"x": x, "y": y, **arts.state})
    mean = x.astype(np.float64).mean(axis=(0, 2))
    var = x.astype(np.float64).var(axis=(0, 2), ddof=1)  # PyTorch's running_var uses the unbiased variance
    np.testing.assert_allclose(out["bn.running_mean.next"], 0.9 * arts.state["bn.running_mean"] + 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(out["bn.running_var.next"], 0.9 * arts.state["bn.running_var"] + 0.1 * var, rtol=1e-5)

    torch = pytest.importorskip("torch")
    bn = torch.nn.BatchNorm1d(3, momentum=0.1)
    with torch.no_grad():
        bn.running_mean.copy_(torch.from_numpy(arts.state["bn.running_mean"].copy()))
        bn.running_var.copy_(torch.from_numpy(arts.state["bn.running_var"].copy()))
    bn.train()(torch.from_numpy(x))
    np.testing.assert_allclose(out["bn.running_mean.next"], bn.running_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(out["bn.running_var.next"], bn.running_var.numpy(), rtol=1e-5)


def test_eval_uses_the_running_stats_fed_in():
    arts = _bn_arts()
    x = RNG.normal(size=(4, 3, 5)).astype(np.float32)
    y = RNG.integers(0, 4, 4)
    ev = gc.Session(arts.eval, backend="numpy")
    default = ev.run({"x": x, "y": y})
    mean, var = np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32)
    fed = ev.run({"x": x, "y": y, "bn.running_mean": mean, "bn.running_var": var})
    assert not np.allclose(default["logits"], fed["logits"])
    w, b = arts.state["bn.weight"], arts.state["bn.bias"]
    xn = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5) * w[None, :, None] + b[None, :, None]
    logits = xn.reshape(4, -1) @ arts.state["fc.weight"].T + arts.state["fc.bias"]
    np.testing.assert_allclose(fed["logits"], logits, rtol=1e-5, atol=1e-6)
    inf = gc.Session(arts.inference, backend="numpy").run({"x": x})
    np.testing.assert_allclose(inf["logits"], default["logits"], rtol=1e-6)


def test_batchnorm_training_gradients_match_torch():
    torch = pytest.importorskip("torch")
    arts = _bn_arts()
    x = RNG.normal(size=(6, 3, 5)).astype(np.float32)
    y = RNG.integers(0, 4, 6)
    grads = gc.Session(arts.gradients, backend="ort-cpu").run({"x": x, "y": y})
    bn = torch.nn.BatchNorm1d(3)
    fc = torch.nn.Linear(15, 4)
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(arts.state["bn.weight"].copy()))
        bn.bias.copy_(torch.from_numpy(arts.state["bn.bias"].copy()))
        fc.weight.copy_(torch.from_numpy(arts.state["fc.weight"].copy()))
        fc.bias.copy_(torch.from_numpy(arts.state["fc.bias"].copy()))
    loss = torch.nn.functional.cross_entropy(fc(bn.train()(torch.from_numpy(x)).flatten(1)), torch.from_numpy(y))
    loss.backward()
    np.testing.assert_allclose(grads["loss"], loss.item(), rtol=1e-5)
    np.testing.assert_allclose(grads["bn.weight_grad"], bn.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["fc.weight_grad"], fc.weight.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_torch_exported_model_trains_with_frozen_layer(tmp_path):
    """A model exported by torch.onnx (when torch can export here) trains with its first layer frozen."""
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    path = tmp_path / "net.onnx"
    try:
        torch.onnx.export(net, (torch.zeros(2, 6),), str(path), input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, opset_version=17, dynamo=False)
    except Exception as exc:  # noqa: BLE001 - exporter availability varies by torch build
        pytest.skip(f"torch.onnx.export unavailable here: {exc}")
    model = gc.load(path)
    first = [n for n in model.params if n.startswith("0.")]
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(0.05),
                                frozen=first)
    for graph in arts.graphs.values():
        check_graph(graph)
    batch = {"x": RNG.normal(size=(20, 6)).astype(np.float32), "y": RNG.integers(0, 3, 20)}
    losses, state = train(arts, batch, 10)
    assert losses[-1] < losses[0]
    for name in first:
        assert arts.train_step.params[name].tobytes() == model.params[name].tobytes()
        assert name not in state


# -- PyTorch exports (tests/data, written by torch.onnx) ---------------------------------------
def _torch_cnn_bn():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(288, 4)

        def forward(self, x):
            x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return self.fc(torch.flatten(x, 1))

    return torch, Net()


def test_torch_export_with_batchnorm_trains_like_torch():
    """tests/data/torch_cnn_bn.onnx (Conv-BN-Relu-MaxPool-Gemm): 5 SGD steps in train_step give
    PyTorch's losses, params and BatchNorm running statistics. (Not Adam: conv.bias, right
    before BatchNorm, has a gradient of rounding noise that Adam normalises to full steps, so its
    value -- and the running mean -- would follow the noise of each implementation.)"""
    torch, net = _torch_cnn_bn()
    model = gc.load("tests/data/torch_cnn_bn.onnx")
    with torch.no_grad():
        for name, t in [*net.named_parameters(), *net.named_buffers()]:
            if name in model.params:
                t.copy_(torch.from_numpy(np.array(model.params[name])))
    arts = gc.training.generate(model, gc.losses.mse("y", label="target"), gc.optim.SGD(0.01, momentum=0.9))
    assert arts.manifest.trainable == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    x = RNG.normal(size=(8, 1, 12, 12)).astype(np.float32)
    target = RNG.normal(size=(8, 4)).astype(np.float32)
    losses, state = train(arts, {"x": x, "target": target}, 5)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, foreach=False)
    torch_losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net.train()(torch.from_numpy(x)), torch.from_numpy(target))
        loss.backward()
        opt.step()
        torch_losses.append(loss.item())
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    np.testing.assert_allclose(state["fc.weight"], net.fc.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state["bn.running_mean"], net.bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["bn.running_var"], net.bn.running_var.numpy(), rtol=1e-5, atol=1e-6)


def _steps_match_torch(arts, net, x, y, loss_fn, steps: int = 3):
    """``steps`` SGD (lr 0.1) steps of a Trainer on ``arts`` and of torch on ``net``, both on
    (x, y): equal losses each step, then equal params and buffers; returns the Trainer."""
    import torch

    trainer = gc.Trainer(arts, backend="numpy")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(net.train()(x), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step({"x": x.numpy(), "y": y.numpy()}), loss.item(), rtol=1e-5)
    state = trainer.state_dict()
    for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
        if not name.endswith("num_batches_tracked"):
            np.testing.assert_allclose(state[name], tensor.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    return trainer


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fresh_batchnorm_export_tracks_its_running_statistics_like_torch(exporter, tmp_path):
    """A fresh BatchNorm's running mean and var (zeros, ones) equal its bias and weight, and
    torch.onnx merges equal initializers: TorchScript writes ``bn.running_mean = Identity(bn.bias)``,
    dynamo passes bn.bias itself. Each statistic gets its own initializer, named as torch's
    buffer: 3 SGD steps give torch's losses, params and running statistics, and the exported
    model torch's eval-mode output."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    x, y = torch.randn(8, 5), torch.randn(8, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            proto = torch.onnx.export(net.eval(), (x,), dynamo=True, verbose=False, input_names=["x"],
                                      output_names=["out"]).model_proto
        else:
            path = tmp_path / "net.onnx"
            torch.onnx.export(net.eval(), (x,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["out"])
            proto = onnx.load(path)
    assert "2.running_mean" not in {i.name for i in proto.graph.initializer}  # merged with 2.bias
    arts = gc.training.generate(gc.load(proto), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    assert arts.manifest.trainable == [n for n, _ in net.named_parameters()]
    trainer = _steps_match_torch(arts, net, x, y, torch.nn.functional.mse_loss)
    exported = gc.load(trainer.export_inference(tmp_path / "trained.onnx"))
    with torch.no_grad():
        expected = net.eval()(x).numpy()
    np.testing.assert_allclose(gc.Session(exported, backend="numpy").run({"x": x.numpy()})["out"], expected,
                               rtol=1e-5, atol=1e-6)


def test_a_fresh_batchnorm_merged_with_a_layernorm_by_dynamo_names_its_statistics_as_torch():
    """onnxscript's optimizer merges a fresh BatchNorm's scale, bias and running statistics
    (ones, zeros) with the LayerNorm's before it: the BatchNorm reads ``1.weight``, ``1.bias``.
    Its statistics, split out, were named after the LayerNorm (``1.running_mean``); the export
    records the BatchNorm's module (``3``), so they are torch's buffers ``3.running_mean`` and
    ``3.running_var``, and a step updates them as torch's."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4), torch.nn.ReLU(), torch.nn.BatchNorm1d(4),
                              torch.nn.Linear(4, 2))
    x, y = torch.randn(8, 5), torch.randn(8, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(net.eval(), (x,), dynamo=True, verbose=False, input_names=["x"],
                                  output_names=["out"]).model_proto
        arts = gc.training.generate(gc.load(proto), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    bn = next(n for n in proto.graph.node if n.op_type == "BatchNormalization")
    assert list(bn.input[1:]) == ["1.weight", "1.bias", "1.bias", "1.weight"]  # merged with the LayerNorm's
    stats = [e.name for e in arts.manifest.graphs["train_step"].inputs if e.role == "state" and e.name != "step"]
    assert stats == ["3.running_mean", "3.running_var"]
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.step({"x": x.numpy(), "y": y.numpy()})
    net.train()(x)  # the statistics of the first step's forward, the params still equal
    for name in stats:
        np.testing.assert_allclose(trainer.state_dict()[name], net.state_dict()[name].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fold", [False, True])
def test_fresh_norm_layers_merged_by_torchscript_train_apart_like_torch(fold, tmp_path):
    """An eval-mode TorchScript export merges every fresh norm layer's weight and bias (ones,
    zeros) into the first one's: ``ln2.weight = Identity(bn1.weight)``. They trained as one
    tensor (params 0.03 from torch after 3 steps); each gets its own initializer again."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 6),
                              torch.nn.BatchNorm1d(6), torch.nn.LayerNorm(6), torch.nn.ReLU(), torch.nn.LayerNorm(6),
                              torch.nn.Linear(6, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (x,), str(path), dynamo=False, do_constant_folding=fold, input_names=["x"],
                          output_names=["out"])
    merged = {n.output[0] for n in onnx.load(path).graph.node if n.op_type == "Identity"}
    assert {"4.weight", "5.weight", "7.bias"} <= merged
    arts = gc.training.generate(gc.load(path), gc.losses.cross_entropy("out", label="y"), gc.optim.SGD(0.1))
    assert sorted(arts.manifest.trainable) == sorted(n for n, _ in net.named_parameters())
    _steps_match_torch(arts, net, x, y, torch.nn.functional.cross_entropy)


@pytest.mark.parametrize(("exporter", "nested"), [("torchscript", False), ("dynamo", False), ("dynamo-unoptimized", False),
                                                ("dynamo-unoptimized", True)])
def test_a_tied_weight_trains_as_one_like_torch(exporter, nested, tmp_path):
    """An Embedding's weight shared with the output Linear. TorchScript's default constant
    folding exports it as ``0.weight`` and ``onnx::MatMul_<N>`` (its transpose); onnxscript's
    optimizer (dynamo) as ``2.weight`` and a folded transpose ``val_0``: the copy is computed from
    the weight again. The dynamo exporter keeps one initializer and lists both parameters, and
    ``0.weight`` was warned about as "folded into other tensors". No warning now; 3 SGD steps give
    torch's losses and weight, and the exported model torch's output. ``nested``: the layers in
    sub-modules (GPT-2's ``transformer.wte`` and ``lm_head``), whose name scopes torch records as
    full paths (``['', '0', '0.0', 'embedding']``): read as ``0.0.0`` the tie went unseen and the
    warning came back."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    emb, out = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    out.weight = emb.weight
    wrap = torch.nn.Sequential if nested else (lambda layer: layer)
    net = torch.nn.Sequential(wrap(emb), torch.nn.Tanh(), wrap(out))
    ids, y = torch.tensor([[1, 3, 5], [2, 0, 9]]), torch.randn(2, 3, 10)
    path = tmp_path / "tied.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(net, (ids,), str(path), dynamo=False, opset_version=17, input_names=["ids"],
                              output_names=["out"])
        else:
            torch.onnx.export(net, (ids,), dynamo=True, optimize=exporter == "dynamo", verbose=False,
                              input_names=["ids"], output_names=["out"]).save(path)
    model = gc.load(path)
    folded = [n for n in model.params if n.startswith("onnx::MatMul") or n.startswith("val_")]
    assert len(folded) == (exporter != "dynamo-unoptimized")  # the folded transpose
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.5))
    weight = ("0.weight" if exporter == "torchscript" else "2.weight").replace(".", ".0." if nested else ".")
    assert arts.manifest.trainable == [weight]
    trainer = gc.Trainer(arts, backend="numpy")
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(ids), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step({"ids": ids.numpy(), "y": y.numpy()}), loss.item(), rtol=1e-5)
    np.testing.assert_allclose(trainer.state_dict()[weight], emb.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    exported = gc.load(trainer.export_inference(tmp_path / "trained.onnx"))
    with torch.no_grad():
        expected = net(ids).numpy()
    np.testing.assert_allclose(gc.Session(exported, backend="numpy").run({"ids": ids.numpy()})["out"], expected,
                               rtol=1e-5, atol=1e-6)


def test_torch_export_with_frozen_conv():
    model = gc.load("tests/data/torch_cnn_bn.onnx")
    arts = gc.training.generate(model, gc.losses.mse("y", label="target"), gc.optim.SGD(0.01, momentum=0.9),
                                frozen=["conv.weight", "conv.bias"])
    batch = {"x": RNG.normal(size=(8, 1, 12, 12)).astype(np.float32), "target": np.zeros((8, 4), np.float32)}
    losses, state = train(arts, batch, 10)
    assert losses[-1] < 0.5 * losses[0], losses
    for name in ("conv.weight", "conv.bias"):
        assert name not in state
        for graph in arts.graphs.values():
            assert graph.params[name].tobytes() == model.params[name].tobytes()


def test_torch_attention_export_with_shape_arithmetic_trains():
    """tests/data/torch_attention.onnx: MultiheadAttention as torch.onnx writes it (Reshape to
    shapes built from Shape/Gather/Slice/Concat, MatMul weights under onnx:: names)."""
    model = gc.load("tests/data/torch_attention.onnx")
    arts = gc.training.generate(model, gc.losses.mse("y", label="target"), gc.optim.Adam(0.01))
    for graph in arts.graphs.values():
        check_graph(graph)
    assert {"attn.in_proj_bias", "norm1.weight", "attn.out_proj.weight"} <= set(arts.manifest.trainable)
    batch = {"x": RNG.normal(size=(3, 5, 16)).astype(np.float32), "target": np.zeros((3, 5, 16), np.float32)}
    losses, _ = train(arts, batch, 8)
    assert losses[-1] < 0.7 * losses[0], losses
    partial = gc.Session(arts.train_step, backend="numpy").run({**batch, "x": batch["x"][:1], "target": batch["target"][:1],
                                                                 **arts.manifest.pack(arts.state)})
    assert np.isfinite(partial["loss"])


PYTORCH_CONVERTED = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted"


@pytest.mark.parametrize("case", ["test_Linear", "test_Conv2d", "test_BatchNorm2d_eval", "test_Embedding"])
def test_onnx_pytorch_converted_models_train(case):
    """onnx's own PyTorch-converted test models (opset 6, IR 3: initializers listed as inputs)
    are upgraded to opset 17 and train."""
    path = PYTORCH_CONVERTED / case / "model.onnx"
    if not path.is_file():
        pytest.skip(f"onnx ships no {path}")
    model = gc.load(path)
    out = model.outputs[0]
    arts = gc.training.generate(model, gc.losses.mse(out.name, label="target"), gc.optim.SGD(0.05))
    assert arts.manifest.opset == 17
    assert [e.role for e in arts.manifest.graphs["inference"].inputs] == ["data"]
    if len(arts.manifest.trainable) > 1:  # IR 3 lists initializers as inputs: a frozen one is not
        frozen = gc.training.generate(model, gc.losses.mse(out.name, label="target"), gc.optim.SGD(0.05),
                                      frozen=arts.manifest.trainable[:1])
        assert arts.manifest.trainable[0] not in {e.name for e in frozen.manifest.graphs["train_step"].inputs}
    for graph in arts.graphs.values():
        check_graph(graph)
    data = [e for e in arts.manifest.graphs["train_step"].inputs if e.role == "data"]
    batch = {e.name: (RNG.integers(0, 3, e.shape) if e.dtype == "int64" else RNG.normal(size=e.shape)).astype(e.dtype)
             for e in data}
    batch["target"] = np.zeros(out.shape, np.float32)
    losses, _ = train(arts, batch, 5)
    assert losses[-1] < losses[0], losses


def test_dsl_constants_stay_constants():
    """A float table the user wrote as a constant in DSL code is not made trainable."""
    table = np.arange(12, dtype=np.float32).reshape(3, 4) / 10

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = gc.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x + table)

    model = gc.capture(Net(), x=gc.spec("float32", ("N", 3, 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    assert arts.manifest.trainable == ["fc.weight", "fc.bias"]


def _settings_model() -> gc.Model:
    """y = Sigmoid(Clip(x @ W, lo, hi)) ** p -> class-weighted cross-entropy; lo, hi, p and the
    class weights are float initializers (as exporters that keep constants as initializers, such
    as torch.onnx's dynamo exporter, write them)."""
    from onnx import TensorProto, helper

    inits = [nh.from_array(RNG.normal(size=(6, 3)).astype(np.float32), "W"),
             nh.from_array(np.array(-1.0, np.float32), "lo"), nh.from_array(np.array(1.5, np.float32), "hi"),
             nh.from_array(np.array([1.0, 2.0, 0.5], np.float32), "class_w"), nh.from_array(np.array(2.0, np.float32), "p")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Clip", ["xw", "lo", "hi"], ["clipped"]),
             helper.make_node("Sigmoid", ["clipped"], ["s"]), helper.make_node("Pow", ["s", "p"], ["logits"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y", "class_w"], ["out"])]
    graph = helper.make_graph(nodes, "settings", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
                                                  helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])], inits)
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_initializers_read_only_as_op_settings_are_not_trained_by_default():
    # PyTorch keeps clamp bounds, exponents and a loss's class weights as constants/buffers: so
    # does graphc unless they are named in ``trainable``; then their gradient is exact (finite
    # differences)
    loss = gc.losses.mse("out", label="target")
    arts = gc.training.generate(_settings_model(), loss, gc.optim.AdamW(1e-2))
    assert arts.manifest.trainable == ["W"] and set(arts.manifest.frozen) == {"lo", "hi", "class_w", "p"}
    arts = gc.training.generate(_settings_model(), loss, gc.optim.SGD(0.1), trainable=["W", "hi", "class_w", "p"])
    # rows whose x @ W lies 0.1 or more from the clip bounds: the loss is smooth in hi there
    x = RNG.normal(size=(64, 6)).astype(np.float32)
    xw = x @ arts.state["W"]
    x = x[(np.abs(xw - 1.5) > 0.1).all(axis=1) & (np.abs(xw + 1.0) > 0.1).all(axis=1)][:8]
    assert len(x) == 8 and ((x @ arts.state["W"]) > 1.5).any()
    batch = {"x": x, "y": RNG.integers(0, 3, 8).astype(np.int64), "target": np.zeros((), np.float32)}
    _check_directional_derivatives(arts, batch, ["hi", "class_w", "p"])


def _check_directional_derivatives(arts, batch, names):
    """Each named param's gradient (``gradients`` graph) against central differences of the
    ``eval`` loss along a random direction (float32 graphs: eps 1e-2, 2% tolerance)."""
    grads = gc.Session(arts.gradients, backend="numpy").run(batch)
    ev = gc.Session(arts.eval, backend="numpy")
    for name in names:
        value = arts.state[name].astype(np.float64)
        direction = RNG.normal(size=value.shape)
        eps = 1e-2
        plus = ev.run({**batch, name: (value + eps * direction).astype(np.float32)})["loss"]
        minus = ev.run({**batch, name: (value - eps * direction).astype(np.float32)})["loss"]
        numeric = (float(plus) - float(minus)) / (2 * eps)
        np.testing.assert_allclose(float(np.sum(grads[f"{name}_grad"] * direction)), numeric, rtol=2e-2, atol=1e-4,
                                   err_msg=name)


def test_function_ops_train_through_their_bodies_and_inference_keeps_them():
    """Mish and RMSNormalization have no gradient rule; ONNX defines both as functions, so the
    training graphs differentiate their bodies (finite differences agree) while the eval and
    inference graphs keep the ops themselves."""
    from onnx import TensorProto, helper

    inits = [nh.from_array(RNG.normal(size=(6, 8)).astype(np.float32), "W"),
             nh.from_array(RNG.uniform(0.5, 1.5, size=8).astype(np.float32), "gamma")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mish", ["h"], ["m"]),
             helper.make_node("RMSNormalization", ["m", "gamma"], ["out"], axis=-1)]
    graph = helper.make_graph(nodes, "fn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8])], inits)
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    ops = {key: {n.op_type for n in g.proto.graph.node} for key, g in arts.graphs.items()}
    assert {"Mish", "RMSNormalization"} <= ops["inference"] and {"Mish", "RMSNormalization"} <= ops["eval"]
    assert not {"Mish", "RMSNormalization"} & ops["train_step"]
    _check_directional_derivatives(arts, _regression_batch(5), ["W", "gamma"])


def _two_layer_norms(shared: bool) -> gc.Model:
    from onnx import TensorProto, helper

    names = ["g", "b", "g", "b"] if shared else ["g1", "b1", "g2", "b2"]
    inits = {n: nh.from_array(np.ones(8, np.float32) if n.startswith("g") else np.zeros(8, np.float32), n)
             for n in names}
    inits["W"] = nh.from_array(RNG.normal(size=(8, 8)).astype(np.float32), "W")
    nodes = [helper.make_node("LayerNormalization", ["x", names[0], names[1]], ["h"], name="ln_a"),
             helper.make_node("MatMul", ["h", "W"], ["m"]),
             helper.make_node("LayerNormalization", ["m", names[2], names[3]], ["out"], name="ln_b")]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8])], list(inits.values()))
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_normalization_param_shared_by_layers_is_trained_as_one_with_a_warning():
    """torch.onnx's dynamo exporter merges equal initializers (every fresh LayerNorm's ones and
    zeros): generate keeps the graph's meaning, one tensor, and says so naming the layers."""
    with pytest.warns(UserWarning, match=r"several normalization nodes \('g' by 'ln_a', 'ln_b'; 'b' by 'ln_a', 'ln_b'\)"):
        arts = gc.training.generate(_two_layer_norms(shared=True), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    assert {"g", "b"} <= set(arts.manifest.trainable)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arts = gc.training.generate(_two_layer_norms(shared=False), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    assert {"g1", "b1", "g2", "b2"} <= set(arts.manifest.trainable)


def test_pads_computed_from_constants_are_folded_so_later_pads_have_static_shapes():
    """torch.onnx (TorchScript) writes F.pad's pads as ConstantOfShape/Concat/Reshape/Slice/
    Transpose/Cast of constants; onnx shape inference knows the pads' shape but not their
    values, so the padded tensor's dims were unknown and the next edge-mode Pad had no
    gradient. Integer values computable from constants are folded first."""
    from onnx import TensorProto, helper

    i64 = lambda name, *values: nh.from_array(np.array(values, np.int64), name)  # noqa: E731
    inits = [nh.from_array(RNG.normal(size=(6, 6)).astype(np.float32), "W"), i64("two", 2), i64("torch_pads", 1, 2),
             i64("pairs", -1, 2), i64("last", -1), i64("first", -(2 ** 62)), i64("axis0", 0), i64("flat", -1)]
    nodes = [helper.make_node("ConstantOfShape", ["two"], ["zeros"], value=nh.from_array(np.array([0], np.int64))),
             helper.make_node("Concat", ["torch_pads", "zeros"], ["full"], axis=0),  # [1, 2, 0, 0]
             helper.make_node("Reshape", ["full", "pairs"], ["rows"]),
             helper.make_node("Slice", ["rows", "last", "first", "axis0", "last"], ["reversed"]),
             helper.make_node("Transpose", ["reversed"], ["columns"], perm=[1, 0]),
             helper.make_node("Reshape", ["columns", "flat"], ["pads64"]),
             helper.make_node("Cast", ["pads64"], ["pads"], to=TensorProto.INT64),  # [0, 1, 0, 2]
             helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Pad", ["h", "pads"], ["padded"], mode="reflect"),  # [N, 6] -> [N, 9]
             helper.make_node("Pad", ["padded", "pads"], ["out"], mode="edge")]  # -> [N, 12]
    graph = helper.make_graph(nodes, "pads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 12])], inits)
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    batch = {"x": RNG.normal(size=(4, 6)).astype(np.float32), "y": RNG.normal(size=(4, 12)).astype(np.float32)}
    _check_directional_derivatives(arts, batch, ["W"])

    from graphc.passes.autodiff.model import fold_integer_values, infer_shapes

    folded = infer_shapes(model.ir)
    assert fold_integer_values(folded) == 7  # the whole pads chain, ConstantOfShape to Cast
    pads = next(n for n in folded.graph if n.op_type == "Pad").inputs[1]
    np.testing.assert_array_equal(pads.const_value.numpy(), [0, 1, 0, 2])
    padded = next(v for n in infer_shapes(folded).graph for v in n.outputs if v.name == "padded")
    assert padded.shape[1] == 9


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_frozen_batchnorm_matches_torch_eval_mode_gradients(exporter):
    """batchnorm="frozen": BatchNorm normalises with the running statistics, which stay as they
    are; gamma/beta still train. Gradients equal torch's eval-mode autograd (float64, a
    committed torch.onnx export of a ResNet-style net: tests/data/zoo)."""
    torch = pytest.importorskip("torch")
    import torch_zoo

    module, x, y = torch_zoo.load("resnet", torch.float64)
    model = gc.load(torch_zoo.files("resnet", exporter, "float64")[0])
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1),
                                batchnorm="frozen")
    m = arts.manifest
    assert m.batchnorm == "frozen" and {"stem.1.weight", "a.4.bias"} <= set(m.trainable)
    assert not [o for o in m.graphs["train_step"].outputs if "running" in o.name]
    feeds = {"x": x.numpy(), "y": y.numpy()}
    got = gc.Session(arts.gradients, backend="numpy").run(feeds)
    module.eval()
    loss = torch.nn.functional.cross_entropy(module(x), y)
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-10)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), rtol=1e-6, atol=1e-9, err_msg=name)

    stats = {n: arts.state[n].copy() for n in ("stem.1.running_mean", "b.4.running_var")}
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.step(feeds)
    for n, before in stats.items():
        np.testing.assert_array_equal(trainer.state_dict()[n], before)
    with pytest.raises(ValueError, match="batchnorm must be"):
        gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1), batchnorm="eval")


def test_a_module_registered_under_two_names_is_no_folded_parameter(tmp_path):
    """T5 and BART register their embedding as ``shared`` and as ``encoder.embed_tokens``, tied
    to ``lm_head``: the dynamo exporter lists all three names and keeps the last. No node ran
    under ``shared``, and ``shared.weight`` was warned about as "folded into other tensors"; it
    is the weight trained as ``head.weight``, as torch trains it."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = torch.nn.Embedding(10, 4)
            self.enc = torch.nn.Sequential(self.shared, torch.nn.Tanh())
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.shared.weight

        def forward(self, ids):
            return self.head(self.enc(ids))

    net = Net()
    ids, y = torch.tensor([[1, 3, 5], [2, 0, 9]]), torch.randn(2, 3, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (ids,), dynamo=True, optimize=False, verbose=False, input_names=["x"],
                          output_names=["out"]).save(tmp_path / "alias.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arts = gc.training.generate(gc.load(tmp_path / "alias.onnx"), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    assert arts.manifest.trainable == ["head.weight"]
    trainer, opt = gc.Trainer(arts, backend="numpy"), torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(ids), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step({"x": ids.numpy(), "y": y.numpy()}), loss.item(), rtol=1e-5)
    np.testing.assert_allclose(trainer.state_dict()["head.weight"], net.shared.weight.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
