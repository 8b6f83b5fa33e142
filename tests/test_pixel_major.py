"""BatchNorms and elementwise ops between small-map dense convs moved onto the convs' rows
(passes/training/pixel_major.py).

Oracle: the same artifacts with every Conv kept (dense_conv off), whose gradient rules are
checked against central differences elsewhere; float64 on numpy, so the two agree to rounding."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc
from graphc.passes.training import dense_conv, pixel_major

C = 6


def model(batch, dtype=np.float64) -> gc.Model:
    """x [batch, 3, 2, 2] -> Conv 3x3 -> BN -> Relu -> Conv 1x1 -> BN -> SiLU (Sigmoid, Mul) ->
    Conv 3x3 -> BN -> + the 1x1 conv's output -> Relu -> out (a graph output)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(C, 3, 3, 3)).astype(dtype), "c0.weight"),
             nh.from_array(rng.normal(size=(C, C, 1, 1)).astype(dtype), "c1.weight"),
             nh.from_array(rng.normal(size=(C, C, 3, 3)).astype(dtype), "c2.weight")]
    for i in range(3):
        inits += [nh.from_array(rng.uniform(0.5, 1.5, C).astype(dtype), f"bn{i}.scale"),
                  nh.from_array(0.1 * rng.normal(size=C).astype(dtype), f"bn{i}.bias"),
                  nh.from_array(0.1 * rng.normal(size=C).astype(dtype), f"bn{i}.mean"),
                  nh.from_array(rng.uniform(0.5, 1.5, C).astype(dtype), f"bn{i}.var")]

    def bn(i, src):
        return oh.make_node("BatchNormalization", [src, *(f"bn{i}.{k}" for k in ("scale", "bias", "mean", "var"))],
                            [f"b{i}"])

    nodes = [oh.make_node("Conv", ["x", "c0.weight"], ["h0"], pads=[1, 1, 1, 1]), bn(0, "h0"),
             oh.make_node("Relu", ["b0"], ["r0"]),
             oh.make_node("Conv", ["r0", "c1.weight"], ["h1"]), bn(1, "h1"),
             oh.make_node("Sigmoid", ["b1"], ["s1"]), oh.make_node("Mul", ["b1", "s1"], ["r1"]),
             oh.make_node("Conv", ["r1", "c2.weight"], ["h2"], pads=[1, 1, 1, 1]), bn(2, "h2"),
             oh.make_node("Add", ["b2", "h1"], ["a2"]), oh.make_node("Relu", ["a2"], ["out"])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "small_maps", [oh.make_tensor_value_info("x", elem, [batch, 3, 2, 2])],
                          [oh.make_tensor_value_info("out", elem, [batch, C, 2, 2])], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def transposes(arts) -> int:
    return sum(n.op_type == "Transpose" for n in arts.train_step.proto.graph.node)


def forward_transposes(arts) -> list[tuple[str, tuple[int, ...]]]:
    """(pass, perm) of each Transpose outside the backward."""
    return [(n.name.split("/")[0], tuple(n.attribute[0].ints)) for n in arts.train_step.proto.graph.node
            if n.op_type == "Transpose" and "/grad/" not in n.name]


@pytest.mark.parametrize("pixels", [True, False])
@pytest.mark.parametrize("batch", [16, "N"])
@pytest.mark.parametrize(("backend", "dtype", "rtol"), [("numpy", np.float64, 1e-10), ("ort-cpu", np.float32, 1e-4)])
def test_rows_give_the_convs_gradients_and_statistics(backend, dtype, rtol, batch, pixels, monkeypatch):
    """Both forms of the 3x3 convs: reading x's pixels (the second one the SiLU's rows), or
    their columns transposed from x channel-major."""
    monkeypatch.setattr(dense_conv, "_reads_pixels", lambda *args: pixels)

    def grads():
        arts = gc.training.generate(model(batch, dtype), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
        rng = np.random.default_rng(1)
        feeds = {"x": rng.normal(size=(16, 3, 2, 2)).astype(dtype), "y": rng.normal(size=(16, C, 2, 2)).astype(dtype)}
        return arts, gc.Session(arts.gradients, backend=backend).run(feeds)

    rows, got = grads()
    with monkeypatch.context() as m:
        m.setattr(pixel_major, "keep", lambda *args: 0)
        columns, _ = grads()
    # the Relu, the SiLU and the sum between the convs moved: their Transposes (and their
    # gradients') gone, forward and backward
    assert transposes(rows) < transposes(columns)
    moved = forward_transposes(rows)
    if pixels:  # no columns transposed: x's pixels, the weights held taps outermost (no Transposes,
        # passes/training/taps_params); the channel-major form kept for the graph output alone
        assert sorted(moved) == [("dense_conv", (0, 2, 1)), ("pixel_major", (0, 3, 1, 2))]
        assert rows.manifest.orders == {"c0.weight": [0, 2, 3, 1], "c2.weight": [0, 2, 3, 1]}
        assert "ScatterElements" not in {n.op_type for n in rows.train_step.proto.graph.node}
    else:  # the 3x3 convs' columns; the SiLU's output and the graph output channel-major
        assert sorted(moved) == [("dense_conv", (0, 2, 1, 3))] * 2 + [("pixel_major", (0, 3, 1, 2))] * 2
    monkeypatch.setattr(dense_conv, "MAX_PIXELS", 0)
    convs, want = grads()
    assert "Conv" in {n.op_type for n in convs.gradients.proto.graph.node}
    assert got.keys() == want.keys() and {"bn1.mean.next", "bn2.var.next", "c1.weight_grad"} <= got.keys()
    for name in want:  # every gradient and running statistic
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * 1e-2, err_msg=name)


def test_only_cpu_graphs_move_to_rows(monkeypatch):
    """Measured on the CPU only: graphs for CUDA keep dense_conv's Transposes as they were."""
    moved = {}
    keep = pixel_major.keep

    def spy(e, graph, convs):
        moved[device] = keep(e, graph, convs)
        return moved[device]

    monkeypatch.setattr(pixel_major, "keep", spy)
    for device in ("cpu", "cuda"):
        gc.training.generate(model(16), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), device=device)
    assert moved == {"cpu": 7}  # 3 BatchNorms, Relu, Sigmoid, Mul, Add; not the output's Relu
