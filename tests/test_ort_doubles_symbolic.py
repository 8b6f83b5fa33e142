"""float64 Conv, ConvTranspose, AveragePool and LpPool of symbolic spatial dims run on ort-cpu
(``backends/doubles_windows_symbolic.py`` sizes their windows at run time): ONE session per model fed several
sizes, against the numpy backend and torch in float64 to ~1e-12 (every case of ``test_ort_doubles_more``'s tables),
torch's MobileNet (its float64 HardSigmoid and HardSwish written out too) and ResNet exports with their H, W made
symbolic; opset 11, and below it a clear refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc
from test_ort_doubles_more import _CONVS, _POOLS, _TRANSPOSED, _single

RNG = np.random.default_rng(1)
ZOO = Path(__file__).parent / "data" / "zoo"


def _symbolic(shape) -> tuple:
    return (*shape[:2], *[f"s{i}" for i in range(len(shape) - 2)])


def _grown(shape, by: int) -> tuple:
    return (*shape[:2], *[d + by + i for i, d in enumerate(shape[2:])])


def _assert_one_session_is_numpy(model: gc.Model, shapes) -> None:
    """One ort-cpu session of ``model`` against the numpy backend on each of ``shapes``."""
    ort, ref = gc.Session(model, backend="ort-cpu"), gc.Session(model, backend="numpy")
    for shape in shapes:
        x = RNG.standard_normal(shape)
        want, got = ref.run({"x": x})["y"], ort.run({"x": x})["y"]
        assert got.dtype == np.float64 and got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max(), err_msg=str(shape))


@pytest.mark.parametrize("case", list(_CONVS))
def test_float64_conv_of_symbolic_dims_matches_numpy_on_several_sizes(case):
    x_shape, w_shape, attrs = _CONVS[case]
    inits = {"w": RNG.standard_normal(w_shape), "b": RNG.standard_normal(w_shape[0])}
    model = _single("Conv", _symbolic(x_shape), inits, attrs, ["w", "b"])
    _assert_one_session_is_numpy(model, [x_shape, _grown(x_shape, 1), _grown(x_shape, 4)])


@pytest.mark.parametrize("case", list(_TRANSPOSED))
def test_float64_conv_transpose_of_symbolic_dims_matches_numpy_on_several_sizes(case):
    x_shape, w_shape, attrs = _TRANSPOSED[case]
    inits = {"w": RNG.standard_normal(w_shape), "b": RNG.standard_normal(w_shape[1] * attrs.get("group", 1))}
    model = _single("ConvTranspose", _symbolic(x_shape), inits, attrs, ["w", "b"])
    # output_shape [8, 9] at stride 2, kernel 3: inputs of 4 or 5 (smaller ones need negative pads, which
    # onnxruntime refuses)
    sizes = [x_shape, (1, 2, 4, 5), (1, 2, 5, 5)] if "output_shape" in attrs else \
        [x_shape, _grown(x_shape, 1), _grown(x_shape, 3)]
    _assert_one_session_is_numpy(model, sizes)


@pytest.mark.parametrize("case", [c for c in _POOLS if not c.startswith("Global")])
def test_float64_pools_of_symbolic_dims_match_numpy_on_several_sizes(case):
    model = _single(case.split()[0], ("N", 3, "h", "w"), {}, _POOLS[case])
    # even and odd sizes: ceil mode's last window and SAME's pads change with them
    _assert_one_session_is_numpy(model, [(2, 3, 7, 8), (1, 3, 8, 9), (2, 3, 12, 5), (1, 3, 3, 4)])


_OPSET_11 = {  # the oldest opset the windows are sized at run time in (Unsqueeze's axes an attribute there)
    "ConvTranspose": ({"w": (3, 2, 3, 3)}, {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}),
    "Conv": ({"w": (2, 3, 3, 3)}, {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    "AveragePool": ({}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                         "count_include_pad": 1}),
}


@pytest.mark.parametrize("op", list(_OPSET_11))
def test_float64_windows_of_symbolic_dims_at_opset_11_match_numpy(op):
    shapes, attrs = _OPSET_11[op]
    model = _single(op, ("N", 3, "h", "w"), {k: RNG.standard_normal(v) for k, v in shapes.items()}, attrs,
                    list(shapes), opset=11)
    _assert_one_session_is_numpy(model, [(2, 3, 5, 6), (1, 3, 8, 7)])


_TORCH = {  # name: fn(M, x, w), channels, w shape or None
    "conv2d": (lambda M, x, w: M.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), 4,
               (6, 2, 3, 3)),
    "conv2d same": (lambda M, x, w: M.conv2d(x, w, padding="same", dilation=(2, 1)), 3, (4, 3, 3, 2)),
    "conv_transpose2d": (lambda M, x, w: M.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2),
                         4, (4, 3, 3, 2)),
    "avg_pool2d ceil": (lambda M, x, w: M.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                        3, None),
    "avg_pool2d counting pads": (lambda M, x, w: M.avg_pool2d(x, (3, 2), (2, 1), padding=1), 3, None),
    "lp_pool2d": (lambda M, x, w: M.lp_pool2d(x, 3.0, 2), 3, None),
}


@pytest.mark.parametrize("case", list(_TORCH))
def test_float64_layers_of_symbolic_dims_match_torch_in_one_session(case):
    torch = pytest.importorskip("torch")
    import graphc.nn.functional as F

    fn, channels, w_shape = _TORCH[case]
    w = RNG.standard_normal(w_shape) if w_shape else None
    model = gc.capture(lambda x: fn(F, x, None if w is None else gc.tensor(w)),
                       x=gc.spec("float64", ("N", channels, "H", "W")))
    session = gc.Session(model, backend="ort-cpu")
    for shape in [(2, channels, 8, 7), (1, channels, 11, 12), (3, channels, 6, 9)]:
        x = RNG.standard_normal(shape)
        want = fn(torch.nn.functional, torch.from_numpy(x), None if w is None else torch.from_numpy(w)).numpy()
        got = session.run({"x": x})["output"]
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=str(shape))


@pytest.mark.parametrize("name", ["mobilenet_torchscript_float64", "resnet_dynamo_float64"])
def test_torch_float64_cnns_with_symbolic_height_and_width_run_on_ort(name):
    """torch's exports, their input's H and W made symbolic: one ort-cpu session on three sizes, as numpy."""
    proto = onnx.load(str(ZOO / f"{name}.onnx"))
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    del proto.graph.value_info[:]
    for out in proto.graph.output:
        out.type.tensor_type.ClearField("shape")
    model = gc.load(onnx.shape_inference.infer_shapes(proto))
    ort, ref = gc.Session(model, backend="ort-cpu"), gc.Session(model, backend="numpy")
    for hw in [(8, 8), (12, 10), (17, 20)]:
        x = RNG.standard_normal((dims[0].dim_value, 3, *hw))
        want, got = ref.run({"x": x}), ort.run({"x": x})
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-12, atol=1e-12 * np.abs(v).max(), err_msg=f"{hw} {k}")


def test_float64_conv_of_symbolic_dims_below_opset_11_is_refused_naming_the_node():
    """Pad takes its pads as an input from opset 11: before it the windows cannot be sized at run time."""
    model = _single("Conv", (1, 2, "h", 5), {"w": RNG.standard_normal((3, 2, 2, 2))}, {}, ["w"], opset=10)
    with pytest.raises(gc.BackendError, match=r"no double kernel for Conv.*spatial dims known before the run below "
                                              r"opset 11.*'x'.*the_conv"):
        gc.Session(model, backend="ort-cpu")
