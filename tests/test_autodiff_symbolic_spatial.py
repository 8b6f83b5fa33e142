"""Gradients of Conv, ConvTranspose and the pools whose input's spatial dims are symbolic
(x [N, C, "H", "W"]): one gradient graph, one session per backend, fed two or three image
sizes, against torch.autograd in float64, on the numpy backend and onnxruntime (CPU)."""

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


def grad_proto(op: str, attrs: dict, channels: int, n_sp: int, params: dict, size=None) -> onnx.ModelProto:
    """The gradient model of loss = sum(op(x, *params)**2), x float32 [N, channels, *symbolic]
    (or [2, channels, *size], static, with ``size``)."""
    names = list(params)
    nodes = [helper.make_node(op, ["x", *names], ["y"], **attrs), helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    dims = ["N", channels] + [f"S{i}" for i in range(n_sp)] if size is None else [2, channels, *size]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["x", *names])).proto
    onnx.checker.check_model(proto, full_check=True)
    return proto


def same_pads(size, kernel, strides, dilations, upper: bool) -> list[int]:
    """ONNX's auto_pad SAME_* pads (begins, then ends) for these spatial dims."""
    begin, end = [], []
    for d, k, s, dl in zip(size, kernel, strides, dilations):
        total = max(0, (-(-d // s) - 1) * s + dl * (k - 1) + 1 - d)
        small = total // 2
        begin.append(small if upper else total - small)
        end.append(total - begin[-1])
    return begin + end


def torch_pad(x, pads):
    """x zero-padded by ONNX pads (begins, then ends) along its spatial axes."""
    n = len(pads) // 2
    return F.pad(x, [v for i in reversed(range(n)) for v in (pads[i], pads[n + i])])


def check_grads(proto, params: dict, forward, sizes, channels: int, batch: int = 2):
    """Each size fed to one numpy and one onnxruntime session: x_grad and every <param>_grad
    against torch.autograd of ``forward(x, *params)`` (float64)."""
    sessions = {"numpy": NumpyBackend().prepare(proto),
                "ort": ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])}
    for i, size in enumerate(sizes):
        x = np.random.default_rng(i).standard_normal((batch, channels, *size)).astype(np.float32)
        tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        tp = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in params.values()]
        (forward(tx, *tp, size=size) ** 2).sum().backward()
        want = {"x_grad": tx.grad.numpy(), **{f"{k}_grad": t.grad.numpy() for k, t in zip(params, tp)}}
        for name, session in sessions.items():
            if name == "numpy":
                got = session.run({"x": x})
            else:
                got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
            for key, value in want.items():
                scale = max(1.0, float(np.abs(value).max()))
                np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4 * scale,
                                           err_msg=f"{key}, size {size}, {name}")


def _weights(*shapes):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


CONVS = {  # name: (x channels, out channels, kernel, ONNX attrs, sizes)
    "2d_stride2_pads": (3, 4, [3, 3], {"strides": [2, 2], "pads": [1, 0, 0, 1]}, [(9, 8), (6, 11), (12, 12)]),
    "2d_dilated": (2, 3, [3, 2], {"dilations": [2, 1], "strides": [1, 2], "pads": [2, 1, 0, 1]}, [(7, 9), (10, 6)]),
    "2d_groups": (4, 6, [3, 3], {"group": 2, "strides": [2, 1], "pads": [1, 1, 1, 1]}, [(8, 7), (5, 10)]),
    "2d_depthwise": (4, 4, [3, 3], {"group": 4, "pads": [1, 1, 1, 1]}, [(6, 6), (9, 5)]),
    "2d_stride1_pads": (3, 4, [3, 3], {"pads": [1, 0, 2, 1]}, [(6, 7), (9, 5)]),
    "2d_same_upper": (3, 4, [3, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [(8, 9), (7, 6), (11, 10)]),
    "2d_same_lower": (2, 3, [4, 2], {"auto_pad": "SAME_LOWER", "strides": [3, 1]},
                      [(8, 9), (10, 5)]),
    "2d_valid": (2, 3, [3, 3], {"auto_pad": "VALID", "strides": [2, 2]}, [(8, 9), (7, 6)]),
    "1d_stride2": (2, 3, [3], {"strides": [2], "pads": [1, 0]}, [(9,), (12,), (5,)]),
    "3d": (2, 2, [3, 2, 2], {"strides": [1, 2, 2], "pads": [1, 0, 1, 1, 1, 0]}, [(4, 5, 6), (5, 6, 5)]),
}


@pytest.mark.parametrize("name", CONVS)
def test_conv_gradients_at_run_time_sizes_match_torch(name):
    ci, co, kernel, attrs, sizes = CONVS[name]
    group = attrs.get("group", 1)
    n_sp = len(kernel)
    w, b = _weights([co, ci // group, *kernel], [co])
    proto = grad_proto("Conv", attrs, ci, n_sp, {"w": w, "b": b})
    conv = getattr(F, f"conv{n_sp}d")
    strides, dilations = attrs.get("strides", [1] * n_sp), attrs.get("dilations", [1] * n_sp)

    def forward(x, w, b, size):
        pads = attrs.get("pads", [0] * 2 * n_sp)
        if attrs.get("auto_pad", "").startswith("SAME"):
            pads = same_pads(size, kernel, strides, dilations, attrs["auto_pad"] == "SAME_UPPER")
        return conv(torch_pad(x, pads), w, b, stride=strides, dilation=dilations, groups=group)

    check_grads(proto, {"w": w, "b": b}, forward, sizes, ci)


CONV_TRANSPOSES = {  # name: (x channels, out channels per group, kernel, ONNX attrs, sizes)
    "2d_stride2": (3, 2, [3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]},
                   [(4, 5), (6, 3)]),
    "2d_groups_dilated": (4, 1, [2, 3], {"group": 2, "dilations": [2, 1], "strides": [1, 2]}, [(3, 4), (5, 5)]),
    "1d": (2, 3, [4], {"strides": [3], "pads": [2, 2]}, [(5,), (8,)]),
}


@pytest.mark.parametrize("name", CONV_TRANSPOSES)
def test_conv_transpose_gradients_at_run_time_sizes_match_torch(name):
    ci, cog, kernel, attrs, sizes = CONV_TRANSPOSES[name]
    group, n_sp = attrs.get("group", 1), len(kernel)
    w, b = _weights([ci, cog, *kernel], [cog * group])
    proto = grad_proto("ConvTranspose", attrs, ci, n_sp, {"w": w, "b": b})
    conv = getattr(F, f"conv_transpose{n_sp}d")
    pads = attrs.get("pads", [0] * 2 * n_sp)
    assert pads[:n_sp] == pads[n_sp:]  # torch pads both ends alike

    def forward(x, w, b, size):
        return conv(x, w, b, stride=attrs.get("strides", 1), padding=pads[:n_sp], dilation=attrs.get("dilations", 1),
                    output_padding=attrs.get("output_padding", 0), groups=group)

    check_grads(proto, {"w": w, "b": b}, forward, sizes, ci)


POOLS = {  # name: (op, ONNX attrs, sizes); symmetric pads (torch's)
    "avg_pads_exclude": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                         [(7, 8), (10, 5)]),
    "avg_pads_include": ("AveragePool", {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 1, 1, 1],
                                         "count_include_pad": 1}, [(7, 8), (6, 5)]),
    "avg_ceil": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, [(8, 9), (7, 6), (10, 10)]),
    "avg_ceil_pads_include": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                              "ceil_mode": 1, "count_include_pad": 1}, [(8, 9), (7, 6)]),
    "avg_1d": ("AveragePool", {"kernel_shape": [2], "strides": [2]}, [(9,), (6,)]),
    "avg_3d": ("AveragePool", {"kernel_shape": [2, 2, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 1]},
               [(4, 5, 6), (3, 3, 5)]),
    "max_pads": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [(7, 8), (10, 5)]),
    "max_tiles": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, [(8, 6), (4, 10), (7, 5)]),
    "max_ceil": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, [(8, 9), (7, 6)]),
    "max_1d_dilated": ("MaxPool", {"kernel_shape": [2], "strides": [1], "dilations": [2]}, [(9,), (6,)]),
}


@pytest.mark.parametrize("name", POOLS)
def test_pool_gradients_at_run_time_sizes_match_torch(name):
    op, attrs, sizes = POOLS[name]
    n_sp = len(attrs["kernel_shape"])
    proto = grad_proto(op, attrs, 3, n_sp, {})
    kw = {"kernel_size": attrs["kernel_shape"], "stride": attrs["strides"],
          "padding": attrs.get("pads", [0] * 2 * n_sp)[:n_sp], "ceil_mode": bool(attrs.get("ceil_mode", 0))}
    if op == "AveragePool":
        pool = getattr(F, f"avg_pool{n_sp}d")
        kw["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
    else:
        pool = getattr(F, f"max_pool{n_sp}d")
        kw["dilation"] = attrs.get("dilations", 1)

    def forward(x, size):
        return pool(x, **kw)

    check_grads(proto, {}, forward, sizes, 3)

