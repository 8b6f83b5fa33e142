"""Lazy modules against torch's: the first capture reads the input size, the module becomes the
module it stands for with torch's parameter names, shapes and init, and then matches torch (the
same weights) in output and gradients on the numpy and ort-cpu backends; names inside a model,
weights kept across captures, training, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import assert_module_matches_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_module_matches_torch

R = np.random.default_rng(6)
VEC = R.standard_normal((2, 7)).astype(np.float32)
SEQ = R.standard_normal((2, 3, 9)).astype(np.float32)
IMG = R.standard_normal((2, 3, 6, 6)).astype(np.float32)
VOL = R.standard_normal((2, 2, 4, 4, 4)).astype(np.float32)

# (constructor, in both libraries; input; the real module's class)
CASES = [("LazyLinear(4)", VEC, nn.Linear), ("LazyLinear(4, bias=False)", SEQ, nn.Linear),
         ("LazyConv1d(4, 3, padding=1)", SEQ, nn.Conv1d), ("LazyConv2d(4, 3, stride=2, groups=1)", IMG, nn.Conv2d),
         ("LazyConv3d(3, 2, bias=False)", VOL, nn.Conv3d),
         ("LazyConvTranspose1d(2, 3, stride=2)", SEQ, nn.ConvTranspose1d),
         ("LazyConvTranspose2d(4, 2, stride=2, output_padding=1)", IMG, nn.ConvTranspose2d),
         ("LazyConvTranspose3d(2, 2, stride=(1, 2, 1))", VOL, nn.ConvTranspose3d),
         ("LazyBatchNorm1d()", SEQ, nn.BatchNorm1d), ("LazyBatchNorm2d(eps=1e-3)", IMG, nn.BatchNorm2d),
         ("LazyBatchNorm3d()", VOL, nn.BatchNorm3d),
         ("LazyInstanceNorm1d()", SEQ, nn.InstanceNorm1d),
         ("LazyInstanceNorm2d(track_running_stats=False)", IMG, nn.InstanceNorm2d),
         ("LazyInstanceNorm3d(affine=False, track_running_stats=False)", VOL, nn.InstanceNorm3d)]


@pytest.mark.parametrize("ctor,x,becomes", CASES, ids=[c[0] for c in CASES])
def test_lazy_module_becomes_torchs_and_matches_it(ctor, x, becomes):
    torch = pytest.importorskip("torch")
    layer = eval(f"nn.{ctor}", {"nn": nn})  # noqa: S307 - the constructors listed above
    assert layer.state_dict() == {}
    gc.capture(layer, x=gc.spec("float32", ("N", *x.shape[1:])))
    assert type(layer) is becomes
    tl = eval(f"torch.nn.{ctor}", {"torch": torch})  # noqa: S307
    with torch.no_grad():
        tl(torch.from_numpy(x))  # materialized by its first call, as ours
    state = layer.state_dict()
    assert list(state) == list(tl.state_dict()) and all(tuple(v.shape) == state[k].shape
                                                        for k, v in tl.state_dict().items())
    if "weight" in state and state["weight"].ndim > 1:  # kaiming-uniform: U(+-1/sqrt(fan_in))
        bound = 1 / math.sqrt(math.prod(state["weight"].shape[1:]))
        assert 0.7 * bound < np.abs(state["weight"]).max() <= bound
    tl.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    assert_module_matches_torch(layer, tl.eval(), x, rtol=1e-4)


def test_lazy_layers_in_a_model_are_named_by_path_kept_and_trained():
    net = nn.Sequential(nn.LazyConv1d(4, 3), nn.LazyBatchNorm1d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(1)).train()
    model = gc.capture(net, x=gc.spec("float32", ("N", 3, 9)), seed=3)
    assert list(net.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                      "1.num_batches_tracked", "4.weight", "4.bias"]
    assert set(net.state_dict()) - {"1.num_batches_tracked"} <= set(model.ir.graph.initializers)
    first = net.state_dict()
    gc.capture(net, x=SEQ, seed=5)  # drawn once: a later capture keeps them
    assert all(np.array_equal(v, first[k]) for k, v in net.state_dict().items())
    conv, fc = first["0.weight"].ravel(), first["4.weight"].ravel()
    assert not np.allclose(conv[:fc.size] / np.abs(conv).max(), fc[:conv.size] / np.abs(fc).max())  # two streams
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.05))
    assert arts.manifest.trainable == ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"]
    y = SEQ.sum((1, 2))[:, None]
    trainer = gc.Trainer(arts, backend="numpy")
    losses = [trainer.step({"x": SEQ, "y": y}) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]


def test_unbatched_instance_norm_takes_its_channels_from_dim_0():
    """(torch's lazy instance norms read dim 1 of an unbatched input too, and then refuse it.)"""
    norm = nn.LazyInstanceNorm2d(track_running_stats=False)
    got = gc.Session(gc.capture(norm, x=IMG[0]), backend="numpy").run({"x": IMG[0]})["output"]
    assert norm.num_features == 3 and norm.state_dict()["weight"].shape == (3,)
    mean, var = IMG[0].mean((1, 2), keepdims=True), IMG[0].var((1, 2), keepdims=True)
    np.testing.assert_allclose(got, (IMG[0] - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)


def test_refusals_name_the_module_and_keep_it_lazy():
    lazy = nn.LazyLinear(3)
    with pytest.raises(gc.GraphError, match=r"LazyLinear.*infers its input features \(the last dim\) from the first "
                                            r"input, which needs a static size there"):
        gc.capture(lazy, x=gc.spec("float32", ("N", "F")))
    conv = nn.LazyConv2d(4, 3, groups=3)
    with pytest.raises(gc.GraphError, match=r"Conv2d channels \(3, 4\) must divide by groups=3"):
        gc.capture(conv, x=IMG)
    assert type(lazy) is nn.LazyLinear and type(conv) is nn.LazyConv2d and conv.state_dict() == {}
    gc.capture(lazy, x=VEC)
    assert lazy.state_dict()["weight"].shape == (3, 7)
