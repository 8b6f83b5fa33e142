"""``F.unfold``/``F.fold`` and ``gc.nn.Unfold``/``Fold``: values and ``gc.grad`` gradients against
torch on the numpy and ort-cpu backends (several shapes, strides, dilations, paddings, odd sizes,
unbatched inputs), float64 gradients against central differences, the full ONNX checker, clear
errors, and a small model with the padding layers, ``padding_mode`` and Unfold/Fold that trains
with ``gc.Trainer`` step for step as with ``torch.optim``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

try:
    from torch_grad_util import assert_grads_match_central_differences, assert_module_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_grads_match_central_differences, assert_module_matches_torch,
                                       run_both)

R = np.random.default_rng(8)

# (input shape, keyword arguments): Unfold of that input, and Fold of its columns back to its size
GEOMETRIES = [
    ((2, 3, 7, 6), {"kernel_size": 3, "padding": 1}),
    ((2, 3, 9, 8), {"kernel_size": (2, 3), "dilation": (1, 2), "padding": (0, 1), "stride": (2, 1)}),
    ((1, 2, 11, 9), {"kernel_size": 3, "padding": 1, "stride": 3}),  # blocks stop short of the last row
    ((2, 4, 8, 8), {"kernel_size": 2, "stride": 2}),  # patches, no overlap
    ((3, 5, 6), {"kernel_size": 2, "dilation": 2}),  # unbatched
    ((1, 1, 5, 7), {"kernel_size": (5, 1), "padding": (2, 0), "stride": (1, 2)}),
]
IDS = [f"{shape}-{kw}" for shape, kw in GEOMETRIES]


@pytest.mark.parametrize("shape,kw", GEOMETRIES, ids=IDS)
def test_unfold_and_its_gradient_match_torch(shape, kw):
    torch = pytest.importorskip("torch")
    x = R.standard_normal(shape).astype(np.float32)
    layer, want_layer = nn.Unfold(**kw), torch.nn.Unfold(**kw)
    assert repr(layer) == repr(want_layer)
    assert_module_matches_torch(layer, want_layer, x, batched=len(shape) == 4)


@pytest.mark.parametrize("shape,kw", GEOMETRIES, ids=IDS)
def test_fold_and_its_gradient_match_torch(shape, kw):
    torch = pytest.importorskip("torch")
    cols = torch.nn.functional.unfold(torch.zeros(shape), **kw)
    x = R.standard_normal(tuple(cols.shape)).astype(np.float32)
    layer, want_layer = nn.Fold(shape[-2:], **kw), torch.nn.Fold(shape[-2:], **kw)
    assert repr(layer) == repr(want_layer)
    assert_module_matches_torch(layer, want_layer, x, batched=len(shape) == 4)


@pytest.mark.parametrize("shape,kw", GEOMETRIES[:3], ids=IDS[:3])
def test_unfold_and_fold_gradients_match_central_differences(shape, kw):
    """float64 on the numpy backend (onnxruntime's CPU Conv has no float64 kernel); fold's input
    is unfold's output shape, its output ``shape``."""
    x = R.standard_normal(shape)
    assert_grads_match_central_differences(lambda F, x: F.unfold(x, **kw), x, backends=("numpy",))
    cols = gc.Session(gc.capture(lambda x: gc.nn.functional.unfold(x, **kw), x=x), backend="numpy").run({"x": x})
    assert_grads_match_central_differences(lambda F, c: F.fold(c, shape[-2:], **kw), cols["output"],
                                           backends=("numpy",))


def test_fold_of_unfold_counts_each_pixel_s_blocks():
    """fold(unfold(x)) is x times the number of blocks covering each pixel (unfold's adjoint)."""
    x = R.standard_normal((2, 3, 6, 5)).astype(np.float32)
    model = gc.capture(lambda x: {"twice": gc.fold(gc.unfold(x, 3, padding=1), (6, 5), 3, padding=1),
                                  "ones": gc.fold(gc.unfold(gc.ones_like(x), 3, padding=1), (6, 5), 3, padding=1)},
                       x=x)
    out = run_both(model, {"x": x})
    counts = np.outer([2, 3, 3, 3, 3, 2], [2, 3, 3, 3, 2])
    np.testing.assert_allclose(out["ones"], np.broadcast_to(counts, x.shape))
    np.testing.assert_allclose(out["twice"], x * counts, rtol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.unfold(x, 4), r"a \(3, 3\) image padded by \[0, 0\] holds \[0, 0\] blocks of kernel_size \[4, 4\]"),
    (lambda x: gc.unfold(x[0, 0], 2), r"expects a \(C, H, W\) or \(N, C, H, W\) input, got rank 2"),
    (lambda x: gc.unfold(x, 2, stride=0), r"stride \[0, 0\] must be positive"),
    (lambda x: gc.fold(gc.unfold(x, 2), (3, 3), 3), r"fold needs a static dim 1 divisible by the kernel's 9 taps"),
    (lambda x: gc.fold(gc.unfold(x, 2), (4, 3), 2), r"dim 2 must be the 3 x 2 = 6 blocks of output_size \[4, 3\]"),
    (lambda x: nn.Fold(3, (2, 2, 2))(gc.unfold(x, 2)), r"kernel_size must be an int or 2 ints"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=R.standard_normal((2, 4, 3, 3)).astype(np.float32))
    assert "test_nn_fold.py" in str(err.value)


def _patch_net(m):
    """Padding layers, a reflect-padded conv and Unfold/Fold in one classifier of 7 x 7 images,
    in ``m`` (``gc.nn`` or ``torch.nn``)."""

    class PatchNet(m.Module):
        def __init__(self):
            super().__init__()
            self.pad = m.ReplicationPad2d((1, 0, 1, 0))
            self.conv = m.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
            self.unfold, self.fold = m.Unfold(2, stride=2), m.Fold((8, 8), 2, stride=2)
            self.mix = m.Linear(12, 12)
            self.ring = m.CircularPad2d(1)
            self.head = m.Linear(3, 4)

        def forward(self, x):
            patches = self.unfold(self.conv(self.pad(x)))  # [N, 12, 16]
            mixed = self.fold(self.mix(patches.transpose(1, 2)).transpose(1, 2))  # [N, 3, 8, 8]
            return self.head(self.ring(mixed).mean((2, 3)))

    return PatchNet()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_model_with_them_trains_as_with_torch_optim(backend):
    torch = pytest.importorskip("torch")
    model = gc.capture(_patch_net(nn), x=gc.spec("float32", ("N", 2, 7, 7)), seed=3)
    onnx.checker.check_model(model.proto, full_check=True)
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.5, momentum=0.9))
    trainer = gc.Trainer(arts, backend=backend)
    net = _patch_net(torch.nn)
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.params.items()})
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    rng = np.random.default_rng(4)
    for step in range(4):
        batch = {"x": rng.standard_normal((6, 2, 7, 7)).astype(np.float32), "y": rng.integers(0, 4, 6)}
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step(batch), loss.item(), rtol=1e-5, err_msg=f"step {step}")
    for k, p in net.named_parameters():
        np.testing.assert_allclose(trainer.params[k], p.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
