"""``generate(..., device="cuda")``: a convolution's weight gradient lowered for onnxruntime's
CUDA provider (every depthwise conv by its taps, every dense one by im2col, whatever the kernel;
``passes/autodiff/rules_nn.py``) instead of the Conv over swapped axes the CPU keeps for large
kernels and maps.

Oracle: the CPU-lowered artifacts of the same float64 model, whose Conv gradient rules are
checked against central differences elsewhere; the two must agree to rounding."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc
from backend_params import CUDA, options

SHAPES = {"stem.weight": (6, 3, 7, 7), "dw5.weight": (6, 1, 5, 5), "dw3.weight": (6, 1, 3, 3),
          "grouped.weight": (4, 3, 3, 3), "dense.weight": (5, 4, 3, 3)}


def model(dtype=np.float64) -> gc.Model:
    """x [4, 3, 20, 20] -> 7x7 stride 2 stem (dense, 49 taps) -> Relu -> depthwise 5x5 stride 2
    -> depthwise 3x3 dilation 2 -> 2-group 3x3 -> dense 3x3 stride 2 -> out [4, 5, 3, 3]."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(scale=0.3, size=s).astype(dtype), n) for n, s in SHAPES.items()]
    nodes = [oh.make_node("Conv", ["x", "stem.weight"], ["s"], strides=[2, 2], pads=[3, 3, 3, 3]),
             oh.make_node("Relu", ["s"], ["r"]),
             oh.make_node("Conv", ["r", "dw5.weight"], ["d5"], group=6, strides=[2, 2], pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["d5", "dw3.weight"], ["d3"], group=6, dilations=[2, 2], pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["d3", "grouped.weight"], ["gr"], group=2, pads=[1, 1, 1, 1]),
             oh.make_node("Conv", ["gr", "dense.weight"], ["out"], strides=[2, 2], pads=[1, 1, 1, 1])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "convs", [oh.make_tensor_value_info("x", elem, [4, 3, 20, 20])],
                          [oh.make_tensor_value_info("out", elem, [4, 5, 3, 3])], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def artifacts(device, dtype=np.float64):
    return gc.training.generate(model(dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device=device)


def feeds(dtype=np.float64):
    rng = np.random.default_rng(1)
    return {"x": rng.normal(size=(4, 3, 20, 20)).astype(dtype), "y": rng.normal(size=(4, 5, 3, 3)).astype(dtype)}


def weight_grad_convs(arts) -> int:
    """Conv nodes the backward added to the gradients graph (input gradients, and weight
    gradients where a Conv computes them)."""
    return sum(n.op_type == "Conv" and "/grad/" in n.name for n in arts.gradients.proto.graph.node)


def test_cuda_lowering_gives_the_cpu_lowerings_gradients():
    cpu, cuda = artifacts("cpu"), artifacts("cuda")
    assert cpu.manifest.device == "cpu" and cuda.manifest.device == "cuda"
    # the CPU keeps the swapped-axes Conv for the 49-tap stem, the strided and dilated depthwise
    # convs; CUDA replaces all three (the 2-group conv keeps it on both)
    assert weight_grad_convs(cpu) - weight_grad_convs(cuda) == 3
    got = gc.Session(cuda.gradients, backend="numpy").run(feeds())
    want = gc.Session(cpu.gradients, backend="numpy").run(feeds())
    assert got.keys() == want.keys() == {"loss", *(f"{n}_grad" for n in SHAPES)}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("backend", ["ort-cpu", CUDA])
def test_cuda_lowering_runs_on_onnxruntime(backend):
    """float32 on onnxruntime (CPU, and CUDA where a device is present, TF32 off) against numpy's
    float64 answer of the same graphs."""
    got = gc.Session(artifacts("cuda", np.float32).gradients, backend=backend, **options(backend)).run(feeds(np.float32))
    want = gc.Session(artifacts("cuda").gradients, backend="numpy").run(feeds())
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-5, err_msg=name)


def test_device_is_checked_and_saved(tmp_path):
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', got 'gpu'"):
        artifacts("gpu")
    artifacts("cuda").save(tmp_path / "arts")
    assert gc.training.load(tmp_path / "arts").manifest.device == "cuda"
