"""Sums into repeated indices on onnxruntime's CPU provider with several threads, where its
ScatterND with a reduction loses updates (``graphc.passes.scatters``): gradients that sum into an
embedding's rows or GatherND's tuples, and a model's own reducing ScatterND nodes, equal numpy's
``np.add.at`` (and its kin) in every run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc


def _model(nodes, inputs, table: np.ndarray, opset: int = 17) -> gc.Model:
    graph = helper.make_graph(nodes, "indexing", inputs, [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              initializer=[numpy_helper.from_array(table, "table")])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _weighted_sum(gathered: str) -> list:
    """loss = sum(gathered * w): the gradient reaching ``gathered`` is w itself."""
    return [helper.make_node("Mul", [gathered, "w"], ["prod"]), helper.make_node("ReduceSum", ["prod"], ["loss"], keepdims=0)]


def _runs(model: gc.Model, feeds: dict, runs: int = 12) -> list[np.ndarray]:
    grads = gc.grad(model, "loss")
    assert not any(n.op_type == "ScatterND" and any(a.name == "reduction" and a.s != b"none" for a in n.attribute)
                   for n in grads.proto.graph.node)
    session = gc.Session(grads, backend="ort-cpu", threads=2)
    return [session.run(feeds)["table_grad"] for _ in range(runs)]


def test_embedding_gradient_sums_every_repeated_row():
    """4,096 tokens over a [2048, 256] table (the size at which onnxruntime's ScatterND split the
    updates between its threads and lost some in about half of the runs)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((2048, 256)).astype(np.float32)
    tokens = rng.integers(-2048, 2048, (32, 128)).astype(np.int64)  # negative ids count from the end
    w = rng.standard_normal((32, 128, 256)).astype(np.float32)
    model = _model([helper.make_node("Gather", ["table", "tokens"], ["rows"], axis=0), *_weighted_sum("rows")],
                   [helper.make_tensor_value_info("tokens", TensorProto.INT64, [32, 128]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [32, 128, 256])], table)
    expected = np.zeros(table.shape)
    np.add.at(expected, tokens.reshape(-1) % 2048, w.reshape(-1, 256).astype(np.float64))
    for got in _runs(model, {"tokens": tokens, "w": w}):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("batch", ["N", 4])
def test_gather_on_a_middle_axis_with_a_symbolic_batch(batch):
    """Gather along axis 1 of [N, 64, 96] by a [T, 16] index (merged into one axis for the scatter);
    the batch read at run time when symbolic."""
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 64, (8, 16)).astype(np.int64)
    x = rng.standard_normal((4, 64, 96)).astype(np.float32)
    w = rng.standard_normal((4, 8, 16, 96)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "table"], ["xt"]), helper.make_node("Gather", ["xt", "idx"], ["g"], axis=1),
             *_weighted_sum("g")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64, 96]),
                           helper.make_tensor_value_info("idx", TensorProto.INT64, [8, 16]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [batch, 8, 16, 96])],
                   np.zeros((1, 64, 96), np.float32))
    expected = np.zeros((4, 64, 96))
    for i in range(4):
        np.add.at(expected[i], idx.reshape(-1), w[i].reshape(-1, 96).astype(np.float64))
    for got in _runs(model, {"x": x, "idx": idx, "w": w}, runs=3):
        np.testing.assert_allclose(got, expected.sum(0, keepdims=True), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_gradient_sums_every_repeated_tuple(batch_dims):
    """GatherND of 2-tuples (negative entries among them) over [B, 64, 32, 128] rows, 4,096 tuples
    per batch entry, many repeated."""
    rng = np.random.default_rng(2)
    table = rng.standard_normal((2, 64, 32, 128)).astype(np.float32)
    if batch_dims:
        idx = np.stack([rng.integers(-64, 64, (2, 4096)), rng.integers(-32, 32, (2, 4096))], -1).astype(np.int64)
        w = rng.standard_normal((2, 4096, 128)).astype(np.float32)
    else:
        table = table[0]
        idx = np.stack([rng.integers(-64, 64, 4096), rng.integers(-32, 32, 4096)], -1).astype(np.int64)
        w = rng.standard_normal((4096, 128)).astype(np.float32)
    model = _model([helper.make_node("GatherND", ["table", "idx"], ["g"], batch_dims=batch_dims), *_weighted_sum("g")],
                   [helper.make_tensor_value_info("idx", TensorProto.INT64, list(idx.shape)),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))], table)
    expected = np.zeros(table.shape)
    for b in range(2 if batch_dims else 1):
        out, tuples, rows = (expected[b], idx[b], w[b]) if batch_dims else (expected, idx, w)
        np.add.at(out, (tuples[:, 0] % 64, tuples[:, 1] % 32), rows.astype(np.float64))
    for got in _runs(model, {"idx": idx, "w": w}, runs=6):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_gather_nd_gradient_with_a_symbolic_leading_dim():
    """Tuples over [N, 32] of x + table, N known only at run time (the tuple strides read off Shape)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 32, 16)).astype(np.float32)
    idx = np.stack([rng.integers(-3, 3, 500), rng.integers(0, 32, 500)], -1).astype(np.int64)
    w = rng.standard_normal((500, 16)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "table"], ["xt"]), helper.make_node("GatherND", ["xt", "idx"], ["g"]),
             *_weighted_sum("g")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32, 16]),
                           helper.make_tensor_value_info("idx", TensorProto.INT64, [500, 2]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [500, 16])],
                   np.zeros((1, 32, 16), np.float32))
    expected = np.zeros((3, 32, 16))
    np.add.at(expected, (idx[:, 0] % 3, idx[:, 1]), w.astype(np.float64))
    for got in _runs(model, {"x": x, "idx": idx, "w": w}, runs=2):
        np.testing.assert_allclose(got, expected.sum(0, keepdims=True), rtol=1e-5, atol=1e-4)


def _scatter_nd_model(reduction: str, data_shape, idx_shape, upd_shape, in_loop: bool = False) -> gc.Model:
    """out = ScatterND(data, idx, upd, reduction), in the main graph or inside a one-trip Loop."""
    ins = [helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape),
           helper.make_tensor_value_info("idx", TensorProto.INT64, idx_shape),
           helper.make_tensor_value_info("upd", TensorProto.FLOAT, upd_shape)]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, data_shape)
    scatter = helper.make_node("ScatterND", ["data", "idx", "upd"], ["out" if not in_loop else "s"], reduction=reduction)
    if not in_loop:
        graph = helper.make_graph([scatter], "scatter", ins, [out])
    else:
        body = helper.make_graph(
            [scatter, helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
        trips = helper.make_tensor("trips", TensorProto.INT64, [], [1])
        graph = helper.make_graph([helper.make_node("Loop", ["trips", ""], ["stacked"], body=body),
                                   helper.make_node("Squeeze", ["stacked", "zero"], ["out"])], "looped", ins, [out],
                                  initializer=[trips, helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


@pytest.mark.parametrize(("reduction", "reduce_at"), [("add", np.add.at), ("mul", np.multiply.at),
                                                      ("max", np.maximum.at), ("min", np.minimum.at)])
def test_a_models_reducing_scatter_nd_runs_race_free(reduction, reduce_at):
    """A model's own ScatterND with a reduction (torch.onnx writes index_put_(accumulate=True) so):
    2-tuples, negative entries among them, into [64, 32, 128] rows, on a symbolic row count."""
    rng = np.random.default_rng(3)
    data = rng.uniform(0.5, 1.5, (64, 32, 128)).astype(np.float32)
    idx = np.stack([rng.integers(-64, 64, 4096), rng.integers(-32, 32, 4096)], -1).astype(np.int64)
    upd = rng.uniform(0.99, 1.01, (4096, 128)).astype(np.float32)
    model = _scatter_nd_model(reduction, [64, 32, 128], ["T", 2], ["T", 128])
    expected = data.astype(np.float64)
    reduce_at(expected, (idx[:, 0] % 64, idx[:, 1] % 32), upd.astype(np.float64))
    session = gc.Session(model, backend="ort-cpu", threads=2)
    for _ in range(8):
        np.testing.assert_allclose(session.run({"data": data, "idx": idx, "upd": upd})["out"], expected, rtol=1e-4)
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"data": data, "idx": idx, "upd": upd})["out"],
                               expected, rtol=1e-4)


def test_a_scatter_nd_inside_a_loop_makes_the_session_single_threaded():
    """A reducing ScatterND in a subgraph is not rewritten: the session runs on one thread."""
    rng = np.random.default_rng(4)
    data, upd = np.zeros((2048, 256), np.float32), rng.standard_normal((4096, 256)).astype(np.float32)
    idx = rng.integers(0, 2048, (4096, 1)).astype(np.int64)
    expected = np.zeros((2048, 256))
    np.add.at(expected, idx[:, 0], upd.astype(np.float64))
    session = gc.Session(_scatter_nd_model("add", [2048, 256], [4096, 1], [4096, 256], in_loop=True),
                         backend="ort-cpu", threads=2)
    for _ in range(8):
        np.testing.assert_allclose(session.run({"data": data, "idx": idx, "upd": upd})["out"], expected,
                                   rtol=1e-5, atol=1e-4)
