"""Fully convolutional training at image sizes known only at run time: a small U-Net (conv blocks
with BatchNorm, MaxPool down, ConvTranspose or interpolate up, a skip concatenation) captured with
x [N, 3, "H", "W"] and trained by one Trainer on batches of different sizes, against the same
torch model and torch.optim (float64 on numpy, float32 on onnxruntime CPU), resumed exactly from a
checkpoint; and Resize and Concat gradients at run-time sizes against torch.autograd."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import graphc as gc
from graphc import nn
from graphc.passes.autodiff import gradient_model

torch = pytest.importorskip("torch")
F = torch.nn.functional
try:
    from test_autodiff_symbolic_spatial import check_grads
    from torch_grad_util import assert_step_matches_torch
    from trainer_models import straight_and_resumed
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_symbolic_spatial import check_grads
    from tests.torch_grad_util import assert_step_matches_torch
    from tests.trainer_models import straight_and_resumed

SIZES = [(32, 32), (48, 40), (64, 64), (20, 28)]


class _UNet(nn.Module):
    """inc -> MaxPool -> down -> up (ConvTranspose or interpolate ``up``) -> concat with inc -> dec -> head."""

    def __init__(self, up: str, dtype: str):
        super().__init__()
        k = {"dtype": dtype}

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False, **k), nn.BatchNorm2d(cout, **k),
                                 nn.ReLU())

        self.mode = up
        self.inc, self.pool, self.down = block(3, 4), nn.MaxPool2d(2), block(4, 8)
        if up == "transpose":
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2, **k)
        self.dec, self.head = block(8 if up == "transpose" else 12, 4), nn.Conv2d(4, 2, 1, **k)

    def forward(self, x):
        skip = self.inc(x)
        low = self.down(self.pool(skip))
        up = self.up(low) if self.mode == "transpose" else gc.nn.functional.interpolate(low, scale_factor=2,
                                                                                          mode=self.mode)
        return self.head(self.dec(gc.concat([skip, up], axis=1)))


def _torch_unet(up: str):
    tnn = torch.nn

    def block(cin, cout):
        return tnn.Sequential(tnn.Conv2d(cin, cout, 3, padding=1, bias=False), tnn.BatchNorm2d(cout), tnn.ReLU())

    class UNet(tnn.Module):
        def __init__(self):
            super().__init__()
            self.inc, self.pool, self.down = block(3, 4), tnn.MaxPool2d(2), block(4, 8)
            if up == "transpose":
                self.up = tnn.ConvTranspose2d(8, 4, 2, stride=2)
            self.dec, self.head = block(8 if up == "transpose" else 12, 4), tnn.Conv2d(4, 2, 1)

        def forward(self, x):
            skip = self.inc(x)
            low = self.down(self.pool(skip))
            upped = self.up(low) if up == "transpose" else F.interpolate(low, scale_factor=2, mode=up)
            return self.head(self.dec(torch.cat([skip, upped], 1)))

    return UNet()


def _setup(up: str, dtype: str):
    net = _UNet(up, dtype)
    net.init_parameters(seed=1)
    twin = _torch_unet(up).to(getattr(torch, dtype))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    model = gc.capture(net, training=True, x=gc.spec(dtype, ("N", 3, "H", "W")))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(lr=0.01))
    return arts, twin


def _batches(dtype: str) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((2, 3, h, w)).astype(dtype), "y": rng.standard_normal((2, 2, h, w)).astype(dtype)}
            for h, w in SIZES]


def _train_like_torch(arts, twin, dtype: str, backend: str, **tolerances):
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01)
    counters = tuple(k for k in twin.state_dict() if k.endswith("num_batches_tracked"))  # graphc keeps none
    for step, batch in enumerate(_batches(dtype)):
        x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
        assert_step_matches_torch(trainer, batch, opt, lambda: F.mse_loss(twin(x), y), twin, step,
                                  skip=counters, **tolerances)


@pytest.mark.parametrize("up", ["transpose", "nearest", "bilinear"])
def test_unet_trains_at_varying_sizes_like_torch_float64(up):
    arts, twin = _setup(up, "float64")
    _train_like_torch(arts, twin, "float64", "numpy")


def test_unet_trains_at_varying_sizes_like_torch_on_onnxruntime_and_resumes_exactly(tmp_path):
    arts, twin = _setup("transpose", "float32")
    _train_like_torch(arts, twin, "float32", "ort-cpu", rtol=1e-5, state_rtol=1e-5, state_atol=1e-6)
    straight, resumed = straight_and_resumed(arts, _batches("float32"), 2, tmp_path / "ck")
    for name, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


def _grad_of(nodes: list, inits: dict) -> onnx.ModelProto:
    """The gradient model, wrt x, of loss = sum(y**2), ``nodes`` computing y from x float32 [N, 3, S0, S1]."""
    nodes = nodes + [helper.make_node("Mul", ["y", "y"], ["sq"]), helper.make_node("ReduceSum", ["sq"], ["loss"],
                                                                                      keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                        ["N", 3, "S0", "S1"])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto = gc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["x"])).proto
    onnx.checker.check_model(proto, full_check=True)
    return proto


LINEAR = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
RESIZES = {  # name: (Resize attrs, scales or None, sizes or None, torch F.interpolate keywords)
    "nearest_x2": ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                   [1, 1, 2, 2], None, {"scale_factor": 2, "mode": "nearest"}),
    "nearest_x3_x1": ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                      [1, 1, 3, 1], None, {"scale_factor": (3, 1), "mode": "nearest"}),
    "bilinear_x2": (LINEAR, [1, 1, 2, 2], None, {"scale_factor": 2, "mode": "bilinear"}),
    "bilinear_half": (LINEAR, [1, 1, 0.5, 0.5], None, {"scale_factor": 0.5, "mode": "bilinear"}),
    "bilinear_align_corners": ({"mode": "linear", "coordinate_transformation_mode": "align_corners"},
                               [1, 1, 2, 3], None, {"scale_factor": (2, 3), "mode": "bilinear", "align_corners": True}),
    "bicubic_x2": ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75},
                   [1, 1, 2, 2], None, {"scale_factor": 2, "mode": "bicubic"}),
    "bilinear_to_fixed_size": (LINEAR, None, [2, 3, 10, 12], {"size": (10, 12), "mode": "bilinear"}),
}


@pytest.mark.parametrize("name", RESIZES)
def test_resize_gradients_at_run_time_sizes_match_torch(name):
    attrs, scales, sizes, kw = RESIZES[name]
    inits = {"scales": np.array(scales, np.float32)} if scales else {"sizes": np.array(sizes, np.int64)}
    inputs = ["x", "", "scales"] if scales else ["x", "", "", "sizes"]
    proto = _grad_of([helper.make_node("Resize", inputs, ["y"], **attrs)], inits)
    check_grads(proto, {}, lambda x, size: F.interpolate(x, **kw), [(5, 7), (8, 4), (6, 6)], 3)


def test_concat_gradient_along_a_run_time_axis_matches_torch():
    proto = _grad_of([helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Concat", ["x", "x2"], ["y"],
                                                                                    axis=3)], {})
    check_grads(proto, {}, lambda x, size: torch.cat([x, x * x], 3), [(5, 7), (8, 4)], 3)
