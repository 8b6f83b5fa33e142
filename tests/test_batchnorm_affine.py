"""A training BatchNorm's per-channel affine over a large map as a 1x1 Conv of one channel a group
in CPU graphs (``rules_norm.normalize``): the forward's normalisation where a Relu or a residual
Add follows from 16x16, and from 32x32 whatever follows; the backward's xhat term from 16x16.
CUDA graphs and smaller maps keep the inference-mode BatchNormalization.

Oracle: the same model in float64 (which keeps BatchNormalization everywhere: the Conv form is
for float32), its gradients on the numpy backend; the float32 BatchNormalization form of the
CUDA graphs, on onnxruntime's CPU provider, shows what rounding alone moves."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc

C = 8
CONVS = {"c1": (C, 3, 3, 3), "c2": (C, C, 3, 3), "c3": (C, C, 3, 3), "c4": (C, 3, 1, 1), "c5": (C, C, 3, 3),
         "c6": (C, C, 3, 3), "c7": (C, C, 1, 1)}


def model(dtype=np.float32) -> gc.Model:
    """x [4, 3, 32, 32] -> stride-2 conv -> bn1 -> Relu (r1, 16x16) -> conv -> bn2 -> + bn7 (r1's
    1x1 conv and BatchNorm) -> Relu (r2); r2 -> conv -> bn3 -> + r2 -> Sigmoid (g3, no Relu);
    x -> 1x1 conv -> bn4 (32x32, alone); g3 -> stride-2 conv -> bn5 -> Relu (8x8); r2 -> conv ->
    bn6 -> + a [1, 8, 1, 1] constant -> Sigmoid (16x16: no Add onnxruntime fuses); the four
    branches globally pooled and summed: out [4, 8, 1, 1]."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(scale=0.3, size=s).astype(dtype), f"{n}.weight") for n, s in CONVS.items()]
    nodes = []
    for i in range(1, 8):
        inits += [nh.from_array(rng.uniform(0.5, 1.5, C).astype(dtype), f"bn{i}.scale"),
                  nh.from_array(rng.normal(size=C).astype(dtype), f"bn{i}.bias"),
                  nh.from_array(np.zeros(C, dtype), f"bn{i}.mean"), nh.from_array(np.ones(C, dtype), f"bn{i}.var")]

    def conv_bn(i, src, stride=1, k=3):
        stats = [f"bn{i}.{p}" for p in ("scale", "bias", "mean", "var")]
        nodes.extend([oh.make_node("Conv", [src, f"c{i}.weight"], [f"k{i}"], strides=[stride] * 2, pads=[k // 2] * 4),
                      oh.make_node("BatchNormalization", [f"k{i}", *stats], [f"bn{i}"])])
        return f"bn{i}"

    nodes.append(oh.make_node("Relu", [conv_bn(1, "x", stride=2)], ["r1"]))
    nodes += [oh.make_node("Add", [conv_bn(2, "r1"), conv_bn(7, "r1", k=1)], ["s2"]),
              oh.make_node("Relu", ["s2"], ["r2"])]
    nodes += [oh.make_node("Add", [conv_bn(3, "r2"), "r2"], ["s3"]), oh.make_node("Sigmoid", ["s3"], ["g3"])]
    conv_bn(4, "x", k=1)
    nodes.append(oh.make_node("Relu", [conv_bn(5, "g3", stride=2)], ["r5"]))
    inits.append(nh.from_array(rng.normal(size=(1, C, 1, 1)).astype(dtype), "shift6"))
    nodes += [oh.make_node("Add", [conv_bn(6, "r2"), "shift6"], ["s6"]), oh.make_node("Sigmoid", ["s6"], ["g6"])]
    nodes += [oh.make_node("GlobalAveragePool", [v], [f"p{v}"]) for v in ("g3", "bn4", "r5", "g6")]
    nodes.append(oh.make_node("Sum", ["pg3", "pbn4", "pr5", "pg6"], ["out"]))
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "bns", [oh.make_tensor_value_info("x", elem, [4, 3, 32, 32])],
                          [oh.make_tensor_value_info("out", elem, [4, C, 1, 1])], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def artifacts(device: str, dtype=np.float32):
    return gc.training.generate(model(dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device=device)


def feeds(dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.normal(1.0, 2.0, size=(4, 3, 32, 32)).astype(dtype),
            "y": rng.normal(size=(4, C, 1, 1)).astype(dtype)}


def affines(proto: onnx.ModelProto) -> tuple[list[str], int]:
    """(names of the Convs of one channel a group, count of BatchNormalization nodes)."""
    convs = [n.name for n in proto.graph.node if n.op_type == "Conv"
             and any(a.name == "group" and a.i == C for a in n.attribute)]
    return convs, sum(n.op_type == "BatchNormalization" for n in proto.graph.node)


def test_large_maps_normalise_with_a_grouped_conv_on_the_cpu_only():
    cpu, cuda = artifacts("cpu"), artifacts("cuda")
    convs, bns = affines(cpu.gradients.proto)
    # forward: bn1 (a Relu after it), bn2 and bn7 (their sum, a Relu after it), bn3 (an Add),
    # bn4 (32x32, alone); backward: all but bn5 (16x16 and up)
    assert (sum("/grad/" not in n for n in convs), sum("/grad/" in n for n in convs)) == (5, 6)
    assert bns == 7 * 2 - 11  # bn5 both ways (8x8); bn6's forward (16x16, a broadcast Add after it)
    assert affines(cuda.gradients.proto) == ([], 14)
    for proto in (cpu.train_step.proto, cpu.gradients.proto):
        onnx.checker.check_model(proto, full_check=True)


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
def test_the_grouped_conv_gives_the_batchnorms_gradients(backend):
    want = gc.Session(artifacts("cpu", np.float64).gradients, backend="numpy").run(feeds(np.float64))
    got = gc.Session(artifacts("cpu").gradients, backend=backend).run(feeds())
    rounded = gc.Session(artifacts("cuda").gradients, backend="ort-cpu").run(feeds())
    names = {"loss", "out", "shift6_grad", *(f"{n}.weight_grad" for n in CONVS),
             *(f"bn{i}.{p}_grad" for i in range(1, 8) for p in ("scale", "bias")),
             *(f"bn{i}.{s}.next" for i in range(1, 8) for s in ("mean", "var"))}
    assert got.keys() == want.keys() == rounded.keys() == names
    for name in sorted(names):
        # float32 against float64: within a few times what the BatchNormalization form's own
        # rounding moves each value (bn4's input gradient sums terms that nearly cancel)
        bound = 4 * np.abs(rounded[name] - want[name]).max() + 1e-6 * np.abs(want[name]).max()
        assert np.abs(got[name] - want[name]).max() <= bound, name
