"""A Conv's weight gradient at spatial sizes known only at run time (x [N, C, "H", "W"]), lowered
as gathered columns times dy (``symbolic_spatial._gathered_weight_grad``): one gradient graph and
one session per backend fed several sizes, against the static-shape form's gradient at each size,
torch.autograd in float64, and float64 central differences."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import graphc
from graphc.backends.numpy import NumpyBackend
from graphc.passes.autodiff import gradient_model

torch = pytest.importorskip("torch")
F = torch.nn.functional
ort = pytest.importorskip("onnxruntime")
try:
    from test_autodiff_symbolic_spatial import _check, _grad_proto, _same_pads, _torch_pad
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_symbolic_spatial import _check, _grad_proto, _same_pads, _torch_pad

RNG = np.random.default_rng(0)

CASES = {  # name: (x channels, out channels, kernel, ONNX attrs, sizes, runs of gathered columns)
    # 72 input channels of 9 taps: runs of 64 and 8 channels' columns
    "runs_stride2_dilated_asym": (72, 5, [3, 3], {"strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 0, 2]},
                                  [(9, 11), (12, 8), (15, 14)], 2),
    "same_upper_strided": (9, 4, [3, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [(8, 9), (7, 6), (11, 10)], 1),
    "same_lower_strided": (3, 4, [3, 2], {"auto_pad": "SAME_LOWER", "strides": [3, 1]}, [(8, 9), (10, 5)], 1),
    # 20 groups of 4 channels: runs of 16 groups and 4
    "grouped_runs": (80, 20, [3, 3], {"group": 20, "strides": [1, 2], "pads": [1, 1, 1, 1]}, [(8, 7), (5, 10)], 2),
    "1d_stride3": (4, 3, [5], {"strides": [3], "pads": [2, 1]}, [(13,), (20,), (7,)], 1),
    "3d_8_taps": (2, 3, [2, 2, 2], {"strides": [1, 2, 1], "pads": [1, 0, 0, 0, 1, 1]}, [(4, 5, 6), (5, 6, 3)], 1),
    "depthwise": (4, 4, [3, 3], {"group": 4, "pads": [1, 1, 1, 1]}, [(6, 6), (9, 5)], 0),
    "5x5": (2, 3, [5, 5], {"pads": [2, 2, 2, 2]}, [(6, 7), (9, 5)], 0),  # past 9 taps: the Conv
}


def _gathers(proto: onnx.ModelProto) -> int:
    """The gradient graph's Gathers: a gathered dW's columns, one a run (its forward and dx have none)."""
    return sum(node.op_type == "Gather" for node in proto.graph.node)


def _grads(proto: onnx.ModelProto, x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Every output of ``proto`` on x, from the numpy backend and an onnxruntime session."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"numpy": NumpyBackend().prepare(proto).run({"x": x}),
            "ort": dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))}


@pytest.mark.parametrize("name", CASES)
def test_run_time_weight_gradient_matches_static_form_and_torch(name):
    ci, co, kernel, attrs, sizes, runs = CASES[name]
    group, n_sp = attrs.get("group", 1), len(kernel)
    w = RNG.standard_normal([co, ci // group, *kernel]).astype(np.float32)
    proto = _grad_proto("Conv", attrs, ci, n_sp, {"w": w})
    assert _gathers(proto) == runs  # none: dW the Conv of x by dy with axes swapped
    for size in sizes:  # each size against the static-shape form's gradient graph
        x = RNG.standard_normal((2, ci, *size)).astype(np.float32)
        want = _grads(_grad_proto("Conv", attrs, ci, n_sp, {"w": w}, size=size), x)["ort"]
        for backend, got in _grads(proto, x).items():
            for key in ("x_grad", "w_grad"):
                scale = float(np.abs(want[key]).max())
                np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=f"{key}, size {size}, {backend}")
    conv = getattr(F, f"conv{n_sp}d")
    strides, dilations = attrs.get("strides", [1] * n_sp), attrs.get("dilations", [1] * n_sp)

    def forward(x, w, size):
        pads = attrs.get("pads", [0] * 2 * n_sp)
        if "auto_pad" in attrs:
            pads = _same_pads(size, kernel, strides, dilations, attrs["auto_pad"] == "SAME_UPPER")
        return conv(_torch_pad(x, pads), w, stride=strides, dilation=dilations, groups=group)

    _check(proto, {"w": w}, forward, sizes, ci)


def test_float64_run_time_weight_gradient_matches_central_differences():
    """A grouped, strided, dilated, asymmetrically padded Conv in float64: dW of one graph at two
    sizes against central differences of the loss (step 1e-6) on the numpy backend and ort-cpu."""
    ci, co, attrs = 6, 4, {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 2, 0, 1]}
    w = RNG.standard_normal([co, ci // 2, 3, 3])
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs), helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE,
                                                                            ["N", ci, "H", "W"])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    grads = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["w"]))
    onnx.checker.check_model(grads.proto, full_check=True)
    assert _gathers(grads.proto) == 1
    sessions = {"numpy": graphc.Session(grads, backend="numpy"), "ort": graphc.Session(grads, backend="ort-cpu")}
    tw = torch.tensor(w, requires_grad=False)

    def loss(x, weight):
        padded = F.pad(torch.tensor(x), [2, 1, 1, 0])  # ONNX pads [h0, w0, h1, w1] as torch's (w0, w1, h0, h1)
        return float((F.conv2d(padded, weight, stride=[2, 1], dilation=[1, 2], groups=2) ** 2).sum())

    for size in [(7, 9), (10, 6)]:
        x = RNG.standard_normal((3, ci, *size))
        want = np.zeros_like(w)
        for index in np.ndindex(*w.shape):
            step = torch.zeros_like(tw)
            step[index] = 1e-6
            want[index] = (loss(x, tw + step) - loss(x, tw - step)) / 2e-6
        for backend, session in sessions.items():
            got = session.run({"x": x})["w_grad"]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                       err_msg=f"size {size}, {backend}")
