"""float64 Conv, ConvTranspose, AveragePool, LpPool, the global pools, Resize/Upsample, InstanceNormalization and
PRelu run on ort-cpu (onnxruntime has no double kernels for them: ``backends/doubles_windows.py`` and
``doubles_layers.py`` write them out for the session): single nodes against the numpy backend to ~1e-12 over
strides, dilations, groups, pads, auto_pad, ceil_mode and Resize's modes; the DSL's layers and their ``gc.grad``
gradients against torch in float64; in an If branch and a Loop body; a float64 CNN training on ort-cpu step for
step with numpy; float32 graphs untouched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphc as gc
from graphc.backends import doubles
from torch_grad_util import gc_grads

RNG = np.random.default_rng(0)


def _single(op: str, x_shape, inits: dict, attrs: dict, extra_inputs=(), opset: int = 21) -> gc.Model:
    """One ``op`` node of a float64 input ``x`` (then ``extra_inputs``, names of ``inits`` or "")."""
    node = helper.make_node(op, ["x", *extra_inputs], ["y"], name=f"the_{op.lower()}", **attrs)
    graph = helper.make_graph([node], "doubles", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, x_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return gc.load(onnx.shape_inference.infer_shapes(proto))


def _assert_ort_is_numpy(model: gc.Model, x: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
    want = gc.Session(model, backend="numpy").run({"x": x})["y"]
    got = gc.Session(model, backend="ort-cpu").run({"x": x})["y"]
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want[np.isfinite(want)]).max())
    return got


_CONVS = {  # name: (x shape, weight shape, attributes)
    "2d": ((2, 3, 7, 6), (4, 3, 3, 2), {}),
    "2d stride pads": ((2, 3, 9, 8), (5, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    "2d dilated groups": ((1, 4, 9, 9), (6, 2, 3, 2), {"dilations": [2, 3], "group": 2, "pads": [2, 1, 1, 2]}),
    "2d depthwise": ((2, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    "2d same upper": ((1, 2, 7, 8), (3, 2, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2d same lower": ((1, 2, 7, 8), (3, 2, 2, 4), {"auto_pad": "SAME_LOWER"}),
    "2d valid": ((1, 2, 7, 8), (3, 2, 2, 3), {"auto_pad": "VALID", "strides": [3, 2]}),
    "1d": ((2, 3, 11), (4, 3, 3), {"strides": [2], "dilations": [2], "pads": [1, 2]}),
    "3d": ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 1]}),
}


@pytest.mark.parametrize("case", list(_CONVS))
@pytest.mark.parametrize("bias", [False, True])
def test_float64_conv_matches_numpy(case, bias):
    x_shape, w_shape, attrs = _CONVS[case]
    inits = {"w": RNG.standard_normal(w_shape), **({"b": RNG.standard_normal(w_shape[0])} if bias else {})}
    model = _single("Conv", x_shape, inits, attrs, ["w", "b"] if bias else ["w"])
    _assert_ort_is_numpy(model, RNG.standard_normal(x_shape))


_TRANSPOSED = {
    "2d": ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    "2d stride output_padding": ((2, 3, 4, 5), (3, 4, 3, 2), {"strides": [2, 3], "output_padding": [1, 2],
                                                              "pads": [1, 0, 0, 1]}),
    "2d dilated groups": ((1, 4, 5, 4), (4, 3, 2, 3), {"dilations": [2, 2], "group": 2, "strides": [2, 1]}),
    "2d pads past the kernel": ((1, 2, 6, 6), (2, 2, 2, 2), {"pads": [2, 3, 2, 1], "strides": [3, 3]}),
    "2d output_shape": ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 9]}),
    "2d same upper": ((1, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "1d": ((2, 3, 7), (3, 2, 4), {"strides": [3], "pads": [1, 2]}),
    "3d": ((1, 2, 3, 3, 2), (2, 2, 2, 2, 3), {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", list(_TRANSPOSED))
@pytest.mark.parametrize("bias", [False, True])
def test_float64_conv_transpose_matches_numpy(case, bias):
    x_shape, w_shape, attrs = _TRANSPOSED[case]
    out_channels = w_shape[1] * attrs.get("group", 1)
    inits = {"w": RNG.standard_normal(w_shape), **({"b": RNG.standard_normal(out_channels)} if bias else {})}
    model = _single("ConvTranspose", x_shape, inits, attrs, ["w", "b"] if bias else ["w"])
    _assert_ort_is_numpy(model, RNG.standard_normal(x_shape))


_POOLS = {
    "AveragePool": {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0]},
    "AveragePool counting pads": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "count_include_pad": 1},
    "AveragePool ceil": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    "AveragePool ceil counting pads": {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 1, 0, 0],
                                       "ceil_mode": 1, "count_include_pad": 1},
    "AveragePool dilated same": {"kernel_shape": [2, 2], "dilations": [2, 3], "auto_pad": "SAME_UPPER"},
    "LpPool": {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 0, 0, 1]},
    "LpPool p1": {"kernel_shape": [3, 3], "p": 1},
    "LpPool p3": {"kernel_shape": [2, 2], "strides": [2, 2], "p": 3},
    "GlobalAveragePool": {}, "GlobalMaxPool": {}, "GlobalLpPool": {}, "GlobalLpPool p3": {"p": 3},
}


@pytest.mark.parametrize("case", list(_POOLS))
@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (1, 2, 5, 6, 4)], ids=["2d", "3d"])
def test_float64_pools_match_numpy(case, shape):
    attrs = dict(_POOLS[case])
    if "kernel_shape" in attrs and len(shape) == 5:
        attrs = {k: (v + v[:1] if k in ("kernel_shape", "strides", "dilations") else
                     v[:2] + v[:1] + v[2:] + v[2:3] if k == "pads" else v) for k, v in attrs.items()}
    model = _single(case.split()[0], shape, {}, attrs)
    _assert_ort_is_numpy(model, RNG.standard_normal(shape))


_RESIZES = {  # name: (x shape, roi, scales, sizes, attributes)
    "nearest asymmetric floor x2": ((2, 3, 4, 5), None, [1, 1, 2, 2], None,
                                    {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    "nearest half_pixel sizes": ((2, 3, 5, 4), None, None, [2, 3, 7, 3], {}),
    "nearest round_prefer_ceil axes": ((2, 3, 5, 4), None, None, [8, 6], {"axes": [2, 3],
                                                                          "nearest_mode": "round_prefer_ceil"}),
    "linear half_pixel": ((2, 3, 4, 5), None, [1, 1, 1.5, 0.6], None, {"mode": "linear"}),
    "linear align_corners": ((1, 2, 4, 5), None, None, [1, 2, 7, 9], {"mode": "linear",
                                                                      "coordinate_transformation_mode": "align_corners"}),
    "linear antialias down": ((1, 2, 9, 8), None, [1, 1, 0.4, 0.5], None, {"mode": "linear", "antialias": 1}),
    "cubic": ((1, 2, 5, 6), None, [1, 1, 2, 1.5], None, {"mode": "cubic", "cubic_coeff_a": -0.75}),
    "cubic exclude_outside pytorch": ((1, 2, 5, 6), None, None, [1, 2, 9, 4],
                                      {"mode": "cubic", "exclude_outside": 1,
                                       "coordinate_transformation_mode": "pytorch_half_pixel"}),
    "linear 3d": ((1, 2, 3, 4, 5), None, [1, 1, 2, 1, 0.5], None, {"mode": "linear"}),
    "tf_crop_and_resize": ((1, 2, 6, 6), [0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], None, [1, 2, 5, 7],
                           {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                            "extrapolation_value": 2.5}),
}


@pytest.mark.parametrize("case", list(_RESIZES))
def test_float64_resize_matches_numpy(case):
    shape, roi, scales, sizes, attrs = _RESIZES[case]
    inits = {"roi": np.asarray(roi if roi is not None else [], np.float64),
             "scales": np.asarray(scales if scales is not None else [], np.float32),
             **({"sizes": np.asarray(sizes, np.int64)} if sizes is not None else {})}
    model = _single("Resize", shape, inits, attrs, ["roi", "scales", "sizes"] if sizes is not None else ["roi", "scales"])
    _assert_ort_is_numpy(model, RNG.standard_normal(shape))


@pytest.mark.parametrize("opset", [9, 10])
def test_float64_upsample_and_opset_10_resize_match_numpy(opset):
    op = "Upsample" if opset == 9 else "Resize"
    model = _single(op, (1, 2, 3, 4), {"scales": np.array([1, 1, 2, 1.5], np.float32)}, {"mode": "linear"},
                    ["scales"], opset=opset)
    _assert_ort_is_numpy(model, RNG.standard_normal((1, 2, 3, 4)))


def test_float64_instance_norm_and_prelu_match_numpy():
    shape = (2, 3, 5, 4)
    model = _single("InstanceNormalization", shape, {"s": RNG.standard_normal(3), "b": RNG.standard_normal(3)},
                    {"epsilon": 1e-3}, ["s", "b"])
    _assert_ort_is_numpy(model, RNG.standard_normal(shape) * 3 + 1)
    model = _single("PRelu", shape, {"slope": RNG.standard_normal((3, 1, 1))}, {}, ["slope"])
    x = RNG.standard_normal(shape)
    x.flat[:3] = [0.0, -0.0, np.inf]
    got = _assert_ort_is_numpy(model, x)
    assert np.signbit(got.flat[1])


def test_float64_resize_of_computed_sizes_is_refused_naming_the_node():
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="the_resize")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [1, 1, 2, 2]),
                                            helper.make_tensor_value_info("sizes", onnx.TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [1, 1, None, None])])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    with pytest.raises(gc.BackendError, match=r"no double kernel for Resize.*'sizes'.*constants.*the_resize"):
        gc.Session(model, backend="ort-cpu")


def test_float32_graphs_keep_onnxruntime_kernels():
    """A float32 CNN of every op written out here is left as it is: the same proto, the same node multiset."""
    net = _net("float32")
    model = gc.capture(net, x=gc.spec("float32", ("N", 2, 8, 8)))
    proto = model.proto
    assert doubles.lower_double(proto) is proto
    grads = gc.grad(gc.capture(_Loss(net), x=gc.spec("float32", (2, 2, 8, 8))), "loss").proto
    assert doubles.lower_double(grads) is grads
    assert {"Conv", "ConvTranspose", "AveragePool", "Resize", "PRelu"} <= {n.op_type for n in grads.graph.node}


# --- the DSL against torch in float64, values and gc.grad gradients on ort-cpu

_TORCH_CASES = {  # name: (fn(M, x, w), x shape, w shape or None)
    "conv2d stride dilation groups": (lambda M, x, w: M.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                                                               groups=2), (2, 4, 9, 8), (6, 2, 3, 3)),
    "conv1d": (lambda M, x, w: M.conv1d(x, w, stride=2, padding=1), (2, 3, 10), (4, 3, 3)),
    "conv3d": (lambda M, x, w: M.conv3d(x, w, padding=1), (1, 2, 4, 4, 3), (3, 2, 2, 3, 2)),
    "conv_transpose2d": (lambda M, x, w: M.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2,
                                                            dilation=(1, 2)), (2, 4, 4, 5), (4, 3, 3, 2)),
    "conv_transpose1d": (lambda M, x, w: M.conv_transpose1d(x, w, stride=3), (2, 3, 5), (3, 2, 4)),
    "avg_pool2d ceil": (lambda M, x, w: M.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                        (2, 3, 8, 7), None),
    "avg_pool2d counting pads": (lambda M, x, w: M.avg_pool2d(x, (3, 2), (2, 1), padding=1), (2, 3, 8, 7), None),
    "lp_pool2d": (lambda M, x, w: M.lp_pool2d(x, 2.0, 2), (2, 3, 8, 6), None),
    "adaptive_avg_pool2d": (lambda M, x, w: M.adaptive_avg_pool2d(x, 1), (2, 3, 5, 4), None),
    "max_pool2d": (lambda M, x, w: M.max_pool2d(x, 2), (2, 3, 8, 6), None),  # its gradient is a Resize
    "instance_norm": (lambda M, x, w: M.instance_norm(x, weight=w, bias=w * 0.5), (2, 3, 5, 4), (3,)),
    "prelu": (lambda M, x, w: M.prelu(x, w), (2, 3, 5, 4), (3,)),
    "interpolate nearest": (lambda M, x, w: M.interpolate(x, scale_factor=2, mode="nearest"), (2, 3, 4, 3), None),
    "interpolate bilinear": (lambda M, x, w: M.interpolate(x, size=(7, 5), mode="bilinear", align_corners=False),
                             (2, 3, 4, 3), None),
    "interpolate bilinear corners": (lambda M, x, w: M.interpolate(x, scale_factor=2, mode="bilinear",
                                                                   align_corners=True), (2, 3, 4, 3), None),
    "interpolate bicubic": (lambda M, x, w: M.interpolate(x, size=(6, 7), mode="bicubic"), (1, 2, 4, 3), None),
    "interpolate trilinear": (lambda M, x, w: M.interpolate(x, scale_factor=2, mode="trilinear"), (1, 2, 3, 2, 3),
                              None),
}


@pytest.mark.parametrize("case", list(_TORCH_CASES))
def test_float64_layers_and_their_gradients_match_torch_on_ort(case):
    torch = pytest.importorskip("torch")
    fn, x_shape, w_shape = _TORCH_CASES[case]
    params = {"x": RNG.standard_normal(x_shape), **({"w": RNG.standard_normal(w_shape)} if w_shape else {})}
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    out = fn(torch.nn.functional, ts["x"], ts.get("w"))
    c = RNG.standard_normal(tuple(out.shape))
    (out * torch.from_numpy(c)).sum().backward()
    call = (lambda M, x, w: fn(M, x, w)) if w_shape else (lambda M, x: fn(M, x, None))
    got = gc_grads(call, params, {}, c, backend="ort-cpu")
    np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for k, t in ts.items():
        np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-11, atol=1e-12, err_msg=k)


def test_float64_conv_and_resize_in_an_if_branch_and_a_loop_body_run_on_ort():
    import graphc.nn.functional as F

    w = RNG.standard_normal((2, 2, 3, 3))

    def fn(x, flag):
        def body(i, h):
            return F.interpolate(F.conv2d(h, gc.tensor(w), padding=1), scale_factor=1, mode="nearest") * 0.5
        looped = gc.fori_loop(0, 2, body, x)
        return gc.cond(flag, lambda v: F.avg_pool2d(F.conv_transpose2d(v, gc.tensor(w), stride=2), 2),
                       lambda v: F.conv2d(v, gc.tensor(w), padding=1), looped)

    model = gc.capture(fn, x=gc.spec("float64", (2, 2, 5, 5)), flag=gc.spec("bool", ()))
    x = RNG.standard_normal((2, 2, 5, 5))
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        want = gc.Session(model, backend="numpy").run(feeds)["output"]
        np.testing.assert_allclose(gc.Session(model, backend="ort-cpu").run(feeds)["output"], want, rtol=1e-12,
                                   atol=1e-12)


# --- a float64 CNN trains on ort-cpu step for step with numpy

class _Net(gc.nn.Module):
    """Conv, InstanceNorm, PReLU, max and average pools, a transposed conv, an upsampling and a Linear head."""

    def __init__(self, dtype):
        super().__init__()
        nn = gc.nn
        self.conv = nn.Conv2d(2, 4, 3, padding=1, dtype=dtype)
        self.norm = nn.InstanceNorm2d(4, affine=True, dtype=dtype)
        self.act = nn.PReLU(4, dtype=dtype)
        self.up = nn.ConvTranspose2d(4, 3, 2, stride=2, dtype=dtype)
        self.fc = nn.Linear(3, 2, dtype=dtype)

    def forward(self, x):
        import graphc.nn.functional as F

        h = F.max_pool2d(self.act(self.norm(self.conv(x))), 2)
        h = F.avg_pool2d(self.up(F.interpolate(h, scale_factor=2, mode="bilinear")), 3, 2, padding=1)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _net(dtype):
    return _Net(dtype).init_parameters(seed=3)


class _Loss(gc.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return {"loss": gc.sum(self.net(x) ** 2)}


def test_float64_cnn_trains_on_ort_step_for_step_with_numpy():
    arts = gc.training.generate(gc.capture(_net("float64"), x=gc.spec("float64", ("N", 2, 8, 8))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.05, momentum=0.5))
    trainers = {backend: gc.Trainer(arts, backend=backend) for backend in ("numpy", "ort-cpu")}
    rng = np.random.default_rng(5)
    for step in range(3):
        batch = {"x": rng.standard_normal((3, 2, 8, 8)), "y": rng.standard_normal((3, 2))}
        losses = {backend: trainer.step(batch) for backend, trainer in trainers.items()}
        np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=1e-12, err_msg=f"step {step}")
        want, got = trainers["numpy"].state_dict(), trainers["ort-cpu"].state_dict()
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-11, atol=1e-13, err_msg=f"step {step} {k}")
    assert losses["numpy"] != 0


def test_cuda_sessions_leave_the_ops_it_runs_in_double_to_the_provider():
    """The CUDA provider has double kernels for Conv, the pools, Resize, InstanceNormalization, PRelu
    and seven activations: only LpPool and Mish (no double kernel on either provider) are written out for it."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [1, 2, 5, 5])
    w = numpy_helper.from_array(np.ones((3, 2, 3, 3)), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Elu", ["c"], ["e"]),
             helper.make_node("Mish", ["e"], ["m"]), helper.make_node("LpPool", ["m"], ["y"], kernel_shape=[2, 2])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ops = {device: {n.op_type for n in doubles.lower_double(proto, device).graph.node} for device in ("cpu", "cuda")}
    assert not {"Conv", "Elu", "Mish", "LpPool"} & ops["cpu"]
    assert {"Conv", "Elu"} <= ops["cuda"] and not {"Mish", "LpPool"} & ops["cuda"]


def test_a_fed_initializer_is_not_taken_for_a_constant():
    """An initializer that is also a graph input takes the caller's value: a float64 Resize whose
    scales are one is refused, naming them (it was written out with the initializer's scales, so
    fed [1, 1, 3, 3] gave a 4x4 image where numpy gives 6x6)."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [1, 1, 2, 2])
    scales = helper.make_tensor_value_info("scales", onnx.TensorProto.FLOAT, [4])
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], "g", [x, scales],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, ["a", "b", "c", "d"])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    feeds = {"x": np.arange(4.0).reshape(1, 1, 2, 2), "scales": np.array([1, 1, 3, 3], np.float32)}
    assert gc.Session(proto, backend="numpy").run(feeds)["y"].shape == (1, 1, 6, 6)
    with pytest.raises(gc.BackendError, match="'scales' are constants"):
        gc.Session(proto, backend="ort-cpu")
