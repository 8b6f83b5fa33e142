"""``generate(..., device="cuda")``: a convolution's weight gradient lowered for onnxruntime's
CUDA provider (every depthwise conv by its taps, every dense one by im2col, whatever the kernel;
``passes/autodiff/rules_nn.py``) instead of the Conv over swapped axes the CPU keeps for large
kernels and maps; and its reductions over (N, H, W) (BatchNorm's statistics and backward sums,
the conv bias's gradient) as ReduceSums onnxruntime's CUDA provider runs on its own row and
column kernels (``passes/training/reductions.py``).

Oracle: the CPU-lowered artifacts of the same float64 model, whose Conv gradient rules are
checked against central differences elsewhere; the two must agree to rounding."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.training.reductions import split_reductions
from backend_params import CUDA, options

SHAPES = {"stem.weight": (6, 3, 7, 7), "dw5.weight": (6, 1, 5, 5), "dw3.weight": (6, 1, 3, 3),
          "grouped.weight": (4, 3, 3, 3), "bn.scale": (4,), "bn.bias": (4,), "dense.weight": (5, 4, 3, 3),
          "dense.bias": (5,)}


def model(dtype=np.float64) -> gc.Model:
    """x [4, 3, 20, 20] -> 7x7 stride 2 stem (dense, 49 taps) -> Relu -> depthwise 5x5 stride 2
    -> depthwise 3x3 dilation 2 -> 2-group 3x3 -> BatchNorm -> dense 3x3 stride 2 with a bias
    -> out [4, 5, 3, 3]."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(scale=0.3, size=s).astype(dtype), n) for n, s in SHAPES.items()]
    inits += [nh.from_array(np.zeros(4, dtype), "bn.mean"), nh.from_array(np.ones(4, dtype), "bn.var")]
    nodes = [oh.make_node("Conv", ["x", "stem.weight"], ["s"], strides=[2, 2], pads=[3, 3, 3, 3]),
             oh.make_node("Relu", ["s"], ["r"]),
             oh.make_node("Conv", ["r", "dw5.weight"], ["d5"], group=6, strides=[2, 2], pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["d5", "dw3.weight"], ["d3"], group=6, dilations=[2, 2], pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["d3", "grouped.weight"], ["gr"], group=2, pads=[1, 1, 1, 1]),
             oh.make_node("BatchNormalization", ["gr", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"]),
             oh.make_node("Conv", ["bn", "dense.weight", "dense.bias"], ["out"], strides=[2, 2], pads=[1, 1, 1, 1])]
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
    # the CPU keeps the swapped-axes Conv for the 49-tap stem and the strided depthwise conv
    # (the dilated one's dW is its row products), CUDA replaces both; CUDA keeps it for the
    # 2-group conv, whose dW the CPU gathers
    assert weight_grad_convs(cpu) - weight_grad_convs(cuda) == 2 - 1
    got = gc.Session(cuda.gradients, backend="numpy").run(feeds())
    want = gc.Session(cpu.gradients, backend="numpy").run(feeds())
    assert got.keys() == want.keys() == {"loss", *(f"{n}_grad" for n in SHAPES), "bn.mean.next", "bn.var.next", "out"}
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


def constants(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The values of ``proto``'s Constant nodes and initializers, by name."""
    consts = {n.output[0]: nh.to_array(n.attribute[0].t) for n in proto.graph.node if n.op_type == "Constant"}
    consts.update({t.name: nh.to_array(t) for t in proto.graph.initializer})
    return consts


def reduction_axes(proto: onnx.ModelProto) -> list[tuple[str, list[int], int]]:
    """(op, sorted axes, input rank) of each ReduceSum/ReduceMean in ``proto`` (shapes inferred)."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
             [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    consts = constants(proto)
    found = []
    for n in proto.graph.node:
        if n.op_type in ("ReduceSum", "ReduceMean"):
            axes = consts[n.input[1]] if len(n.input) > 1 else \
                next((list(a.ints) for a in n.attribute if a.name == "axes"), [])
            rank = ranks[n.input[0]]
            found.append((n.op_type, sorted(int(a) % rank for a in axes), rank))
    return found


def anchored(axes: list[int], rank: int) -> bool:
    """One run of axes from the front or to the back: onnxruntime's CUDA row or column kernel."""
    return axes == list(range(axes[0], axes[-1] + 1)) and (axes[0] == 0 or axes[-1] == rank - 1)


def test_cuda_graphs_sum_over_leading_or_trailing_axes_only():
    """BatchNorm's statistics and backward sums and the conv bias's gradient reduce over (N, H, W):
    on CUDA each is a sum over (H, W), then over N, and no ReduceMean is left (its fast path
    takes sums only); the CPU's graphs take BatchNorm's means and sums over (H, W), then over N
    too, but keep the means (``rules_norm.channel_reduce``)."""
    cpu, cuda = (reduction_axes(artifacts(d).train_step.proto) for d in ("cpu", "cuda"))
    assert ("ReduceMean", [0, 2, 3], 4) not in cpu and ("ReduceSum", [0, 2, 3], 4) not in cpu
    assert all(r in cpu for r in (("ReduceMean", [2, 3], 4), ("ReduceMean", [0], 4), ("ReduceSum", [2, 3], 4)))
    assert [r for r in cuda if r[0] == "ReduceMean" and r[1]] == []  # (the loss's mean of all)
    assert all(anchored(axes, rank) for _, axes, rank in cuda if axes and len(axes) < rank), cuda
    assert ("ReduceSum", [2, 3], 4) in cuda


def test_cuda_im2col_pads_take_onnxruntimes_fast_kernel():
    """The dense dWs' im2col pads its input before stacking the taps on a new axis: onnxruntime's
    CUDA Pad runs its fast kernel only on tensors of up to 4 axes padded along the last two."""
    proto = onnx.shape_inference.infer_shapes(artifacts("cuda").gradients.proto)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*proto.graph.value_info, *proto.graph.input]}
    consts = constants(proto)
    pads = [(ranks[n.input[0]], consts[n.input[1]].tolist()) for n in proto.graph.node if n.op_type == "Pad"]
    im2col = [p for p in pads if p[1] == [0, 0, 3, 3, 0, 0, 3, 3]]  # the 7x7 stem's, [Ci, N, H, W]
    assert len(im2col) == 1 and im2col[0][0] == 4, pads
    assert all(rank <= 4 and not any(p[:rank - 2] + p[rank:2 * rank - 2]) for rank, p in pads), pads


@pytest.mark.parametrize("opset", [17, 18])
def test_split_reductions_keep_the_values(opset):
    """Each form split_reductions meets, against numpy: sums and means over leading + trailing
    axes (negative ones too), with and without keepdims, over a symbolic batch; the reductions it
    must leave as they are (one trailing run of a sum, a middle axis, all axes) are left."""
    cases = [("ReduceSum", [0, 2, 3], 1), ("ReduceSum", [0, -1], 0), ("ReduceMean", [0, 2, 3], 1),
             ("ReduceMean", [-1], 0), ("ReduceMean", [0, 1, 3], 0), ("ReduceSum", [2, 3], 1),
             ("ReduceSum", [1], 1), ("ReduceMean", [1, 2], 1), ("ReduceSum", [0, 1, 2, 3], 0)]
    nodes, outs = [], []
    for i, (op, axes, keep) in enumerate(cases):
        as_input = op == "ReduceSum" or opset >= 18
        nodes += [oh.make_node("Constant", [], [f"a{i}"], value=nh.from_array(np.array(axes, np.int64)))] * as_input
        nodes.append(oh.make_node(op, ["x", f"a{i}"] if as_input else ["x"], [f"y{i}"], keepdims=keep,
                                  **({} if as_input else {"axes": axes})))
        outs.append(oh.make_tensor_value_info(f"y{i}", onnx.TensorProto.DOUBLE, None))
    graph = oh.make_graph(nodes, "r", [oh.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, ["n", 3, 4, 5])], outs)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(proto))
    assert split_reductions(model.graph, opset) == 5
    rewritten = ir.serde.serialize_model(model)
    onnx.checker.check_model(rewritten, full_check=True)
    forms = reduction_axes(rewritten)
    # the symbolic batch's means stay means of what the sums over (H, W) or W leave; the middle ones
    assert sorted(f for f in forms if f[0] == "ReduceMean") == [("ReduceMean", [0], 4), ("ReduceMean", [0, 1], 3),
                                                                 ("ReduceMean", [1, 2], 4)]
    assert ("ReduceSum", [1], 4) in forms and ("ReduceSum", [0, 1, 2, 3], 4) in forms
    x = np.random.default_rng(2).normal(size=(3, 3, 4, 5))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(gc.load(rewritten), backend=backend).run({"x": x})
        for i, (op, axes, keep) in enumerate(cases):
            want = (np.sum if op == "ReduceSum" else np.mean)(x, axis=tuple(axes), keepdims=bool(keep))
            np.testing.assert_allclose(got[f"y{i}"], want, rtol=1e-12, err_msg=f"{backend} {cases[i]}")


def test_an_integer_mean_is_left_as_it_is():
    """ONNX's integer ReduceMean divides once, rounding; a sum times 1/count would not be it."""
    node = oh.make_node("ReduceMean", ["x"], ["y"], axes=[0, 2, 3])
    graph = oh.make_graph([node], "r", [oh.make_tensor_value_info("x", onnx.TensorProto.INT32, [2, 3, 4, 5])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.INT32, None)])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert split_reductions(model.graph, 17) == 0
    assert [n.op_type for n in model.graph] == ["ReduceMean"]


def test_a_strided_pointwise_dw_subsamples_x_by_pooling_on_the_cpu():
    """A strided 1x1 Conv's dW takes x[..., ::2, ::2] by a 1-tap AveragePool in CPU graphs
    (onnxruntime pools on its threads, slices on one), by the strided Slice in CUDA graphs; the
    same gradients either way (numpy, float64)."""
    rng = np.random.default_rng(2)
    graph = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["out"], strides=[2, 2])], "pointwise",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [4, 6, 9, 8])],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.DOUBLE, [4, 5, 5, 4])],
                          [nh.from_array(rng.normal(size=(5, 6, 1, 1)), "w")])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    arts = {d: gc.training.generate(gc.load(proto), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device=d)
            for d in ("cpu", "cuda")}
    ops = {d: [n.op_type for n in a.gradients.proto.graph.node] for d, a in arts.items()}
    assert "AveragePool" in ops["cpu"] and "Slice" not in ops["cpu"]
    assert "Slice" in ops["cuda"] and "AveragePool" not in ops["cuda"]
    feeds = {"x": rng.normal(size=(4, 6, 9, 8)), "y": rng.normal(size=(4, 5, 5, 4))}
    got, want = (gc.Session(arts[d].gradients, backend="numpy").run(feeds) for d in ("cpu", "cuda"))
    np.testing.assert_array_equal(got["w_grad"], want["w_grad"])
