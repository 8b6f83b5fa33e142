"""Convolutions over tiny maps as products over the batch in the training graphs (dense_conv.py:
dense convs by im2col and one Gemm, grouped and depthwise ones by a dense product per group).

Oracle: the same artifacts with the rewrite off, whose Conv gradient rules are checked against
central differences elsewhere; float64 models, so the two must agree to rounding."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.training import dense_conv


def model(batch, dtype=np.float64) -> gc.Model:
    """x [batch, 3, 2, 2] -> Conv 3x3 pad 1 -> Relu -> Conv 1x1 with bias -> depthwise Conv 5x5
    pad 2 with bias -> Conv 3x3 stride 2 pad (1, 0, 1, 1), no bias."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(4, 3, 3, 3)).astype(dtype), "c1.weight"),
             nh.from_array(rng.normal(size=4).astype(dtype), "c1.bias"),
             nh.from_array(rng.normal(size=(4, 4, 1, 1)).astype(dtype), "pw.weight"),
             nh.from_array(rng.normal(size=4).astype(dtype), "pw.bias"),
             nh.from_array(rng.normal(size=(4, 1, 5, 5)).astype(dtype), "dw.weight"),
             nh.from_array(rng.normal(size=4).astype(dtype), "dw.bias"),
             nh.from_array(rng.normal(size=(5, 4, 3, 3)).astype(dtype), "c2.weight")]
    nodes = [oh.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["h"], pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h"], ["r"]),
             oh.make_node("Conv", ["r", "pw.weight", "pw.bias"], ["p"]),
             oh.make_node("Conv", ["p", "dw.weight", "dw.bias"], ["d"], group=4, pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["d", "c2.weight"], ["out"], strides=[2, 2], pads=[1, 0, 1, 1])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "tiny", [oh.make_tensor_value_info("x", elem, [batch, 3, 2, 2])],
                          [oh.make_tensor_value_info("out", elem, [batch, 5, 1, 1])], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def artifacts(batch, dtype=np.float64):
    return gc.training.generate(model(batch, dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))


@pytest.mark.parametrize("packs", [True, False])
@pytest.mark.parametrize("pixels", [True, False])
@pytest.mark.parametrize(("backend", "dtype", "rtol"), [("numpy", np.float64, 1e-10), ("ort-cpu", np.float32, 1e-4)])
def test_dense_product_gives_the_conv_gradients(backend, dtype, rtol, pixels, packs, monkeypatch):
    """The kxk convs both ways: their columns from x's pixels or transposed from x channel-major;
    and every dense conv's product both ways, weight x columns^T (then transposed) or the rows."""
    monkeypatch.setattr(dense_conv, "_reads_pixels", lambda *args: pixels)
    monkeypatch.setattr(dense_conv, "_packs_columns", lambda *args: packs)
    batch = dense_conv.MIN_BATCH
    dense = artifacts(batch, dtype)
    monkeypatch.setattr(dense_conv, "MAX_WORK", 0.0)
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    convs = artifacts(batch, dtype)
    assert "Conv" not in {n.op_type for n in dense.gradients.proto.graph.node}
    assert sum(n.op_type == "Conv" for n in convs.train_step.proto.graph.node if "/grad/" not in n.name) == 4
    assert "Conv" in {n.op_type for n in dense.eval.proto.graph.node}  # eval and inference keep it
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(batch, 3, 2, 2)).astype(dtype), "y": rng.normal(size=(batch, 5, 1, 1)).astype(dtype)}
    got = gc.Session(dense.gradients, backend=backend).run(feeds)
    want = gc.Session(convs.gradients, backend=backend).run(feeds)
    assert got.keys() == want.keys() == {"loss", "c1.weight_grad", "c1.bias_grad", "pw.weight_grad", "pw.bias_grad",
                                         "dw.weight_grad", "dw.bias_grad", "c2.weight_grad", "out"}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * 1e-2, err_msg=name)


def test_kxk_convs_read_pixels_where_the_weight_is_smaller_than_the_columns():
    """ResNet's 3x3 convs at 64 px: 256 channels on 4x4 maps read x's pixels at batch 32 (the
    weight, 256*9 per input channel, under the columns, 32*16*9), not at batch 2, nor 512
    channels on 2x2 at batch 32 (512*9 over 32*4*9)."""
    x = {batch: ir.Value(name="x", shape=ir.Shape([batch, 256, 4, 4])) for batch in (2, 32)}
    taps = dense_conv._taps([4, 4], [4, 4], [3, 3], [1, 1], [1, 1], [1, 1])
    assert dense_conv._reads_pixels(x[32], 256, 16, taps.shape)
    assert not dense_conv._reads_pixels(x[2], 256, 16, taps.shape)
    x512 = ir.Value(name="x", shape=ir.Shape([32, 512, 2, 2]))
    assert not dense_conv._reads_pixels(x512, 512, 4, dense_conv._taps([2, 2], [2, 2], [3, 3], [1, 1], [1, 1], [1, 1]).shape)


def test_the_columns_are_packed_where_the_weight_is_large_and_has_more_rows():
    """ResNet-18's 512-channel 3x3 convs on 2x2 maps (2.4 M weight values over 32*4 or 2*4 rows of
    columns) make their rows transposed, its 256-channel ones on 4x4 at batch 32 (512 rows) and a
    MobileNet-sized 1x1 weight (576x96) do not; the CUDA graphs keep the rows whatever the sizes."""
    big = 512 * 512 * 9
    assert dense_conv._packs_columns(ir.Value(name="x", shape=ir.Shape([32, 512, 2, 2])), 512, 4, big)
    assert dense_conv._packs_columns(ir.Value(name="x", shape=ir.Shape(["N", 512, 2, 2])), 512, 4, big)
    assert dense_conv._packs_columns(ir.Value(name="x", shape=ir.Shape([2, 256, 4, 4])), 256, 16, 256 * 256 * 9)
    assert not dense_conv._packs_columns(ir.Value(name="x", shape=ir.Shape([32, 256, 4, 4])), 256, 16, 256 * 256 * 9)
    assert not dense_conv._packs_columns(ir.Value(name="x", shape=ir.Shape([2, 96, 2, 2])), 576, 4, 576 * 96)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_only_cpu_graphs_pack_the_columns(device, monkeypatch):
    monkeypatch.setattr(dense_conv, "_packs_columns", lambda *args: True)
    arts = gc.training.generate(model(2), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device=device)
    weights = {"c1.weight", "pw.weight", "c2.weight"}
    graph = arts.train_step.proto.graph
    made = {o: n for n in graph.node for o in n.output}

    def source(name):  # through Reshapes and Transposes to a graph input or initializer
        while name in made and made[name].op_type in ("Reshape", "Transpose", "Gather"):
            name = made[name].input[0]
        return name

    firsts = {source(n.input[0]) for n in graph.node if n.op_type == "Gemm" and "/grad/" not in n.name}
    assert (firsts & weights == {"c1.weight", "pw.weight", "c2.weight"}) == (device == "cpu"), firsts


def test_small_batches_keep_the_depthwise_conv():
    def forward_convs(arts):
        return [n.input[1] for n in arts.train_step.proto.graph.node if n.op_type == "Conv" and "/grad/" not in n.name]

    assert forward_convs(artifacts(2)) == ["dw.weight"]  # dense convs by im2col at any batch
    assert forward_convs(artifacts("N")) == []  # a symbolic batch counts as a typical 16


@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("packs", [True, False])
def test_a_symbolic_batch_gets_the_dense_product_and_the_conv_gradients(batch, packs, monkeypatch):
    """The rewrite reads the batch as -1: one graph for a symbolic batch serves any batch size,
    on numpy (float64, to rounding) and onnxruntime (float32), the products made either way."""
    with monkeypatch.context() as m:
        m.setattr(dense_conv, "_packs_columns", lambda *args: packs)
        dense = {dtype: artifacts("N", dtype) for dtype in (np.float64, np.float32)}
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    convs = {dtype: artifacts("N", dtype) for dtype in (np.float64, np.float32)}
    rng = np.random.default_rng(batch)
    for dtype, backend, rtol in [(np.float64, "numpy", 1e-10), (np.float32, "ort-cpu", 1e-4)]:
        feeds = {"x": rng.normal(size=(batch, 3, 2, 2)).astype(dtype), "y": rng.normal(size=(batch, 5, 1, 1)).astype(dtype)}
        got = gc.Session(dense[dtype].gradients, backend=backend).run(feeds)
        want = gc.Session(convs[dtype].gradients, backend=backend).run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * 0.1, err_msg=f"{backend} {name}")


def depthwise_chain(batch, dtype=np.float64) -> gc.Model:
    """x [batch, 2, 8, 8] -> depthwise 3x3 pad 1 -> depthwise 5x5 pad 2 -> depthwise 3x3 stride 2
    pad 1 (to 4x4) -> depthwise 3x3 pad 1 on 4x4: their dense products would do 8.5x, 3.5x, 8.5x
    and 2.6x the convs' multiply-adds."""
    rng = np.random.default_rng(3)
    shapes = {"a.weight": (2, 1, 5, 5), "b.weight": (2, 1, 3, 3), "c.weight": (2, 1, 3, 3), "d.weight": (2, 1, 3, 3)}
    inits = [nh.from_array(rng.normal(scale=0.4, size=s).astype(dtype), n) for n, s in shapes.items()]
    nodes = [oh.make_node("Conv", ["x", "d.weight"], ["d"], group=2, pads=[1, 1, 1, 1]),
             oh.make_node("Conv", ["d", "a.weight"], ["a"], group=2, pads=[2, 2, 2, 2]),
             oh.make_node("Conv", ["a", "b.weight"], ["b"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
             oh.make_node("Conv", ["b", "c.weight"], ["out"], group=2, pads=[1, 1, 1, 1])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "dw", [oh.make_tensor_value_info("x", elem, [batch, 2, 8, 8])],
                          [oh.make_tensor_value_info("out", elem, [batch, 2, 4, 4])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


def test_depthwise_convs_up_to_max_work_take_the_dense_product(monkeypatch):
    """MAX_WORK = 4 (measured: N=32, fwd + dx + dW on onnxruntime, 3x3 on 4x4 480ch 12.0-13.4 ms
    as Convs vs 4.0-4.4 as products; 5x5 on 8x8, 240ch 21.8 / 26.0 vs 15.3 / 17.8) admits the
    5x5 on 8x8 and the 3x3 on 4x4, not the 3x3 on 8x8 nor the strided one, in CPU graphs (CUDA's
    keep the bound of 2 they were measured with); the products give the Convs' gradients."""
    def forward_convs(arts):
        return [n.input[1] for n in arts.train_step.proto.graph.node if n.op_type == "Conv" and "/grad/" not in n.name]

    def grads(dtype, backend, device="cpu"):
        arts = gc.training.generate(depthwise_chain(16, dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1),
                                    device=device)
        rng = np.random.default_rng(4)
        feeds = {"x": rng.normal(size=(16, 2, 8, 8)).astype(dtype), "y": rng.normal(size=(16, 2, 4, 4)).astype(dtype)}
        return arts, gc.Session(arts.gradients, backend=backend).run(feeds)

    dense = {backend: grads(dtype, backend) for dtype, backend in [(np.float64, "numpy"), (np.float32, "ort-cpu")]}
    assert forward_convs(dense["numpy"][0]) == ["d.weight", "b.weight"]
    assert "Einsum" not in {n.op_type for n in dense["numpy"][0].train_step.proto.graph.node}  # MatMuls on the CPU
    cuda = gc.training.generate(depthwise_chain(16), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device="cuda")
    assert forward_convs(cuda) == ["d.weight", "a.weight", "b.weight", "c.weight"]  # measured on the GPU at 2x
    monkeypatch.setattr(dense_conv, "CUDA_MAX_WORK", dense_conv.MAX_WORK)  # CUDA's products: the Einsums
    cuda, einsums = grads(np.float64, "numpy", "cuda")
    assert forward_convs(cuda) == ["d.weight", "b.weight"] and "Einsum" in {n.op_type for n in cuda.train_step.proto.graph.node}
    for name, want in dense["numpy"][1].items():
        np.testing.assert_allclose(einsums[name], want, rtol=1e-10, atol=1e-12, err_msg=f"cuda {name}")
    monkeypatch.setattr(dense_conv, "MAX_WORK", 0.0)
    for (dtype, backend, rtol) in [(np.float64, "numpy", 1e-10), (np.float32, "ort-cpu", 1e-4)]:
        convs, want = grads(dtype, backend)
        assert len(forward_convs(convs)) == 4
        got = dense[backend][1]
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * 1e-2, err_msg=f"{backend} {name}")


def test_maps_past_max_pixels_keep_the_conv(monkeypatch):
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 3)  # c1 and pw have 4 output pixels, c2 one
    convs = [n.input[1] for n in artifacts(dense_conv.MIN_BATCH).train_step.proto.graph.node
             if n.op_type == "Conv" and "/grad/" not in n.name]
    assert convs == ["c1.weight", "pw.weight"]


def test_tap_count_equals_the_tables_sum():
    """The plan decides from a count of the taps that meet the input, without the table."""
    from graphc.passes.autodiff.rules_nn import out_dims

    rng = np.random.default_rng(0)
    for _ in range(200):
        spatial = [int(v) for v in rng.integers(1, 9, 2)]
        kernel, strides, dilations = ([int(v) for v in rng.integers(1, 4, 2)] for _ in range(3))
        begin, end = ([int(v) for v in rng.integers(0, 3, 2)] for _ in range(2))
        out = out_dims(spatial, kernel, strides, dilations, begin, end)
        if min(out) < 1:
            continue
        taps = dense_conv._taps(spatial, out, kernel, strides, dilations, begin)
        assert dense_conv._tap_count(spatial, out, kernel, strides, dilations, begin) == int(taps.sum())


def grouped_model(batch: int) -> gc.Model:
    """x [batch, 4, 3, 3] -> grouped Conv 3x3 (2 groups of 2 -> 3 channels) pads (1, 0, 1, 2) with
    bias -> grouped Conv 1x1 (3 groups of 2 -> 2) with bias -> Conv 1x1 stride 2 -> out [batch, 2, 2, 2]."""
    rng = np.random.default_rng(2)
    inits = [nh.from_array(rng.normal(size=(6, 2, 3, 3)), "g.weight"), nh.from_array(rng.normal(size=6), "g.bias"),
             nh.from_array(rng.normal(size=(6, 2, 1, 1)), "p.weight"), nh.from_array(rng.normal(size=6), "p.bias"),
             nh.from_array(rng.normal(size=(2, 6, 1, 1)), "s.weight")]
    nodes = [oh.make_node("Conv", ["x", "g.weight", "g.bias"], ["h"], group=2, pads=[1, 0, 1, 2]),
             oh.make_node("Conv", ["h", "p.weight", "p.bias"], ["hp"], group=3),
             oh.make_node("Conv", ["hp", "s.weight"], ["out"], strides=[2, 2])]
    graph = oh.make_graph(nodes, "grouped", [oh.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [batch, 4, 3, 3])],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.DOUBLE, [batch, 2, 2, 2])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


def test_grouped_and_strided_pointwise_convs_by_im2col_give_the_conv_gradients(monkeypatch):
    def grads():
        arts = gc.training.generate(grouped_model(3), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        rng = np.random.default_rng(3)
        feeds = {"x": rng.normal(size=(3, 4, 3, 3)), "y": rng.normal(size=(3, 2, 2, 2))}
        return arts, gc.Session(arts.gradients, backend="numpy").run(feeds)

    im2col, got = grads()
    assert "Conv" not in {n.op_type for n in im2col.gradients.proto.graph.node}
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    _, want = grads()
    assert got.keys() == want.keys() == {"loss", "g.weight_grad", "g.bias_grad", "p.weight_grad", "p.bias_grad",
                                         "s.weight_grad", "out"}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)


def per_group_model(batch: int, dtype) -> gc.Model:
    """x [batch, 4, 3, 3] -> grouped Conv 3x3 (2 groups of 2 -> 3 channels) pads (1, 0, 1, 2) with
    bias -> depthwise Conv 3x3 of channel multiplier 2 -> Conv 1x1 stride 2 -> out [batch, 2, 2, 2]."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.normal(size=(6, 2, 3, 3)).astype(dtype), "g.weight"),
             nh.from_array(rng.normal(size=6).astype(dtype), "g.bias"),
             nh.from_array(rng.normal(size=(12, 1, 3, 3)).astype(dtype), "m.weight"),
             nh.from_array(rng.normal(size=(2, 12, 1, 1)).astype(dtype), "s.weight")]
    nodes = [oh.make_node("Conv", ["x", "g.weight", "g.bias"], ["h"], group=2, pads=[1, 0, 1, 2]),
             oh.make_node("Conv", ["h", "m.weight"], ["hm"], group=6, pads=[1, 1, 1, 1]),
             oh.make_node("Conv", ["hm", "s.weight"], ["out"], strides=[2, 2])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "per_group", [oh.make_tensor_value_info("x", elem, [batch, 4, 3, 3])],
                          [oh.make_tensor_value_info("out", elem, [batch, 2, 2, 2])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


@pytest.mark.parametrize(("backend", "dtype", "rtol"), [("numpy", np.float64, 1e-10), ("ort-cpu", np.float32, 1e-4)])
def test_grouped_convs_from_min_batch_take_per_group_products(backend, dtype, rtol, monkeypatch):
    """From MIN_BATCH, within MAX_WORK, a grouped Conv (and a depthwise one of channel multiplier
    2) is one dense product per group, its matrix the weight by the taps brought into the group's
    [Ci/G*Q, Co/G*P] by one Transpose; the gradients are the Convs'."""
    batch = dense_conv.MIN_BATCH

    def grads():
        arts = gc.training.generate(per_group_model(batch, dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        rng = np.random.default_rng(6)
        feeds = {"x": rng.normal(size=(batch, 4, 3, 3)).astype(dtype), "y": rng.normal(size=(batch, 2, 2, 2)).astype(dtype)}
        return arts, gc.Session(arts.gradients, backend=backend).run(feeds)

    graph = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(per_group_model(batch, dtype).proto)).graph
    plans = {n.inputs[1].name: dense_conv._plan(n, "cpu")[0] for n in graph if n.op_type == "Conv"}
    assert plans == {"g.weight": True, "m.weight": True, "s.weight": False}  # s: im2col
    products, got = grads()
    assert "Conv" not in {n.op_type for n in products.gradients.proto.graph.node}
    monkeypatch.setattr(dense_conv, "MAX_WORK", 0.0)
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    convs, want = grads()
    assert sum(n.op_type == "Conv" for n in convs.train_step.proto.graph.node if "/grad/" not in n.name) == 3
    assert got.keys() == want.keys() == {"loss", "g.weight_grad", "g.bias_grad", "m.weight_grad", "s.weight_grad",
                                         "out"}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * 1e-2, err_msg=name)


@pytest.mark.parametrize("batch", [3, 20])
def test_a_symbolic_batch_gets_the_per_group_products(batch, monkeypatch):
    """A symbolic batch counts as a typical 16: the products, read with the batch as -1 and 0,
    serve any batch the graph is fed."""
    proto = per_group_model(dense_conv.MIN_BATCH, np.float32).proto
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"

    def grads():
        arts = gc.training.generate(gc.load(proto), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        rng = np.random.default_rng(7)
        feeds = {"x": rng.normal(size=(batch, 4, 3, 3)).astype(np.float32),
                 "y": rng.normal(size=(batch, 2, 2, 2)).astype(np.float32)}
        return arts, gc.Session(arts.gradients, backend="ort-cpu").run(feeds)

    products, got = grads()
    assert "Conv" not in {n.op_type for n in products.gradients.proto.graph.node}
    monkeypatch.setattr(dense_conv, "MAX_WORK", 0.0)
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    _, want = grads()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_conv_with_a_large_tap_matrix_keeps_the_conv(monkeypatch):
    """A ViT-style patch embedding (8x8 stride 8 on 16x16: a 256 x 256 tap matrix) past MAX_TAPS."""
    rng = np.random.default_rng(4)
    graph = oh.make_graph([oh.make_node("Conv", ["x", "p.weight"], ["out"], strides=[8, 8])], "patch",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 3, 16, 16])],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [4, 5, 2, 2])],
                          [nh.from_array(rng.normal(size=(5, 3, 8, 8)).astype(np.float32), "p.weight")])
    model = gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))

    def forward_ops():
        arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        return {n.op_type for n in arts.train_step.proto.graph.node if "/grad/" not in n.name}

    monkeypatch.setattr(dense_conv, "MAX_TAPS", 256 * 256 - 1)
    assert "Conv" in forward_ops()
    monkeypatch.setattr(dense_conv, "MAX_TAPS", 256 * 256)
    assert "Conv" not in forward_ops()


def mid_map_model(batch) -> gc.Model:
    """float32 x [batch, 128, 8, 8] -> Conv 3x3 pad 1 with bias -> Relu -> Conv 3x3 dilations
    (2, 1), uneven pads -> Relu -> Conv 3x3 stride 2: maps of 64 and 49 pixels, then 16."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.normal(size=(4, 128, 3, 3)).astype(np.float32) / 8, "c1.weight"),
             nh.from_array(rng.normal(size=4).astype(np.float32), "c1.bias"),
             nh.from_array(rng.normal(size=(5, 4, 3, 3)).astype(np.float32), "c2.weight"),
             nh.from_array(rng.normal(size=(2, 5, 3, 3)).astype(np.float32), "c3.weight")]
    nodes = [oh.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["h"], pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h"], ["r"]),
             oh.make_node("Conv", ["r", "c2.weight"], ["d"], dilations=[2, 1], pads=[2, 1, 1, 0]),
             oh.make_node("Relu", ["d"], ["s"]),
             oh.make_node("Conv", ["s", "c3.weight"], ["out"], strides=[2, 2], pads=[1, 1, 1, 1])]
    graph = oh.make_graph(nodes, "mid", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 128, 8, 8])],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [batch, 2, 4, 4])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


@pytest.mark.parametrize(("batch", "runs"), [(8, (8,)), ("N", (3, 17))])
def test_mid_map_convs_by_gathered_columns_give_the_conv_gradients(batch, runs, monkeypatch):
    """On the CPU, at a batch of 8 or more (a symbolic one counts as 16), dense stride-1 convs
    become gathered columns times the weight: forward ones of 128+ channels on maps of 17 to 64
    pixels (c1, not c2 of 4), dx ones on maps of 17 to 144 (c2's; c1's x wants none, c3 is
    ``dense_conv``'s): no ConvTranspose is left, CUDA-lowered artifacts keep both Convs; loss and
    gradients equal those of the Convs on onnxruntime and numpy. (Generated as for a CPU without
    NCHWc kernels: ort-cpu runs c1 on those where it has them, see the next test.)"""
    from graphc.compile import training
    from graphc.passes.autodiff import rules_nn

    monkeypatch.setattr(training, "_nchwc_block", lambda: 0)

    def generate(device="cpu"):
        return gc.training.generate(mid_map_model(batch), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1),
                                    device=device)

    def convs(arts):  # (the forward's Convs' weights, how many ConvTransposes)
        nodes = arts.train_step.proto.graph.node
        forward = sorted(n.input[1] for n in nodes if n.op_type == "Conv" and "/grad/" not in n.name)
        return forward, sum(n.op_type == "ConvTranspose" for n in nodes)

    gathered = generate()
    assert convs(gathered) == (["c2.weight"], 0)
    assert convs(generate("cuda"))[0] == ["c1.weight", "c2.weight"]
    for module in (rules_nn, dense_conv):
        monkeypatch.setattr(module, "gathers_conv", lambda *args, **kwargs: False)
    plain = generate()
    assert convs(plain) == (["c1.weight", "c2.weight"], 1)
    for n in runs:
        rng = np.random.default_rng(n)
        feeds = {"x": rng.normal(size=(n, 128, 8, 8)).astype(np.float32),
                 "y": rng.normal(size=(n, 2, 4, 4)).astype(np.float32)}
        for backend in ("ort-cpu", "numpy"):
            got = gc.Session(gathered.gradients, backend=backend).run(feeds)
            want = gc.Session(plain.gradients, backend=backend).run(feeds)
            assert got.keys() == want.keys() == {"loss", "c1.weight_grad", "c1.bias_grad", "c2.weight_grad",
                                                 "c3.weight_grad", "out"}
            for name in want:  # float32 sums of up to 10^4 products: rounding relative to the largest
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * np.abs(want[name]).max(),
                                           err_msg=f"{backend} batch {n} {name}")


def test_convs_on_nchwc_kernels_stay_convs(monkeypatch):
    """Where ort-cpu runs a dense Conv on its NCHWc kernels (input channels whole blocks, batch
    times output pixels ``rules_nn.NCHWC_MIN_PIXELS`` or more) it stays a Conv, and a dx it would
    run so is a Conv by the flipped weight: x [16, 128, 8, 8] -> Conv 3x3 to 32 -> Relu -> Conv
    3x3 to 16. With a channel block of 16 both forward Convs stay and the second's dx is a Conv;
    without NCHWc kernels the first and that dx are gathered columns times the weight. Loss and
    gradients agree on onnxruntime."""
    from graphc.compile import training

    rng = np.random.default_rng(7)
    inits = [nh.from_array(rng.normal(size=(32, 128, 3, 3)).astype(np.float32) / 16, "c1.weight"),
             nh.from_array(rng.normal(size=(16, 32, 3, 3)).astype(np.float32) / 8, "c2.weight")]
    nodes = [oh.make_node("Conv", ["x", "c1.weight"], ["h"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["h"], ["r"]),
             oh.make_node("Conv", ["r", "c2.weight"], ["out"], pads=[1, 1, 1, 1])]
    graph = oh.make_graph(nodes, "blocked", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16, 128, 8, 8])],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [16, 16, 8, 8])], inits)
    model = gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))

    def generate(block):
        monkeypatch.setattr(training, "_nchwc_block", lambda: block)
        arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        nodes = arts.train_step.proto.graph.node
        forward = sorted(n.input[1] for n in nodes if n.op_type == "Conv" and "/grad/" not in n.name)
        return arts, forward, sum(n.op_type == "Conv" and "/grad/" in n.name for n in nodes)  # (dWs are Gemms)

    blocked, forward, dx = generate(16)
    assert (forward, dx) == (["c1.weight", "c2.weight"], 1)
    gathered, forward, dx = generate(0)
    assert (forward, dx) == (["c2.weight"], 0)
    feeds = {"x": rng.normal(size=(16, 128, 8, 8)).astype(np.float32), "y": rng.normal(size=(16, 16, 8, 8)).astype(np.float32)}
    got = gc.Session(blocked.gradients, backend="ort-cpu").run(feeds)
    want = gc.Session(gathered.gradients, backend="ort-cpu").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * np.abs(want[name]).max(), err_msg=name)
