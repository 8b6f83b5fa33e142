"""Transposes of few rows as Einsums in ort-cpu sessions (``graphc.backends.transposes``): which
ones, the same values bit for bit (numpy and onnxruntime's own Transpose as oracles), and the
sessions that take the rewrite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import graphc as gc
from graphc.backends import transposes
from graphc.model.file import tensor_types
from onnx_graphs import model, node, vi

REWRITTEN = {  # name: (input shape, perm, element type)
    "a dense conv's dW taps back, [9, Co*Ci]": ([9, 4096], [1, 0], TensorProto.FLOAT),
    "the same as 4-D": ([3, 3, 64, 64], [2, 3, 0, 1], TensorProto.FLOAT),
    "size-1 axes around it": ([1, 9, 1, 2048], [0, 3, 2, 1], TensorProto.FLOAT),
    "a batch of 2 innermost": ([2, 64, 16, 16], [1, 2, 3, 0], TensorProto.FLOAT),
    "16 float32 rows: a cache line each": ([16, 4096], [1, 0], TensorProto.FLOAT),
    "float64, 8 rows": ([8, 4096], [1, 0], TensorProto.DOUBLE),
    "a batch of them, [32, 9, 512] -> [32, 512, 9]": ([32, 9, 512], [0, 2, 1], TensorProto.FLOAT),
    "pixel-major rows of 4 pixels back to channels": ([32, 2, 2, 512], [0, 3, 1, 2], TensorProto.FLOAT),
    "a batch of them to few rows, [32, 440, 4] -> [32, 4, 440]": ([32, 440, 4], [0, 2, 1], TensorProto.FLOAT),
    "a batch of them to 64 rows": ([4, 440, 64], [0, 2, 1], TensorProto.FLOAT),
}
KEPT = {
    "17 float32 rows: past a cache line": ([17, 4096], [1, 0], TensorProto.FLOAT),
    "9 float64 rows: past a cache line": ([9, 4096], [1, 0], TensorProto.DOUBLE),
    "a batch of 17-row ones to 512 rows": ([32, 17, 512], [0, 2, 1], TensorProto.FLOAT),
    "one matrix to few rows: onnxruntime's fast direction": ([4096, 9], [1, 0], TensorProto.FLOAT),
    "a batch of them to 65 rows of 440": ([4, 440, 65], [0, 2, 1], TensorProto.FLOAT),
    "leading axes swapped: blocks moved": ([32, 64, 32], [1, 0, 2], TensorProto.FLOAT),
    "too small to matter": ([9, 1024], [1, 0], TensorProto.FLOAT),
    "not one 2-D transpose": ([32, 4, 64, 9], [0, 2, 1, 3], TensorProto.FLOAT),
    "the identity": ([9, 4096], [0, 1], TensorProto.FLOAT),
    "int64 (no Einsum kernel)": ([9, 4096], [1, 0], TensorProto.INT64),
    "a symbolic dim": ([9, "N"], [1, 0], TensorProto.FLOAT),
}


def transpose_model(shape, perm, elem, opset: int = 17) -> onnx.ModelProto:
    return model([node("Transpose", ["x"], ["y"], "transpose_3", "net.py:3", perm=perm)],
                 [vi("x", elem, shape)], [vi("y", elem, [shape[p] for p in perm])], opset=opset)


def rewritten(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    return transposes.rewrite(proto, tensor_types(proto))


@pytest.mark.parametrize("case", list(REWRITTEN))
def test_few_row_transposes_become_einsums_of_the_same_values(case):
    shape, perm, elem = REWRITTEN[case]
    proto = transpose_model(shape, perm, elem)
    out, count = rewritten(proto)
    assert count == 1 and [(n.op_type, n.name) for n in out.graph.node] == [("Einsum", "transpose_3")]
    assert out.graph.node[0].metadata_props == proto.graph.node[0].metadata_props  # its source line
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(0).normal(size=shape).astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    as_einsum = gc.Session(proto, backend="ort-cpu").run({"x": x})["y"]
    as_transpose = gc.Session(proto, backend="ort-cpu", graph_optimization_level="disable").run({"x": x})["y"]
    np.testing.assert_array_equal(as_einsum, x.transpose(perm))
    np.testing.assert_array_equal(as_transpose, x.transpose(perm))


@pytest.mark.parametrize("case", list(KEPT))
def test_other_transposes_stay(case):
    proto = transpose_model(*KEPT[case])
    assert rewritten(proto) == (proto, 0), case


def test_a_transpose_a_product_reads_stays():
    """onnxruntime folds a Transpose into the MatMul or Gemm that reads it: no copy to speed up."""
    proto = model([node("Transpose", ["x"], ["xt"], "transpose_3", perm=[0, 2, 1]),
                   node("MatMul", ["xt", "w"], ["y"], "matmul_4")],
                  [vi("x", shape=[32, 9, 512]), vi("w", shape=[9, 4])], [vi("y", shape=[32, 512, 4])], opset=17)
    assert rewritten(proto) == (proto, 0)
    alone = model([node("Transpose", ["x"], ["y"], "transpose_3", perm=[0, 2, 1])],
                  [vi("x", shape=[32, 9, 512])], [vi("y", shape=[32, 512, 9])], opset=17)
    assert rewritten(alone)[1] == 1


def test_before_opset_12_there_is_no_einsum():
    proto = transpose_model([9, 4096], [1, 0], TensorProto.FLOAT, opset=11)
    assert rewritten(proto) == (proto, 0)


@pytest.mark.parametrize(("dims", "perm", "expected"), [
    ([9, 4096], [1, 0], (1, 9, 4096)),
    ([3, 3, 64, 64], [2, 3, 0, 1], (1, 9, 4096)),
    ([2, 16, 8, 8], [1, 2, 3, 0], (1, 2, 1024)),
    ([1, 9, 1, 2048], [0, 3, 2, 1], (1, 9, 2048)),
    ([32, 9, 512], [0, 2, 1], (32, 9, 512)),
    ([32, 2, 2, 512], [0, 3, 1, 2], (32, 4, 512)),
    ([2, 3, 4, 5, 6], [0, 1, 4, 2, 3], (6, 20, 6)),
    ([32, 4, 64, 9], [0, 2, 1, 3], None),
    ([32, 64, 32], [1, 0, 2], None),
    ([4, 5, 6], [2, 1, 0], None),
    ([9, 4096], [0, 1], None),
])
def test_batched_rows_and_columns_merge_the_axes_that_move_together(dims, perm, expected):
    assert transposes.batched_rows_and_columns(dims, perm) == expected


def test_sessions_take_the_rewrite_unless_optimization_is_off(monkeypatch):
    """ort-cpu at every level but "disable" builds its session from the rewritten graph (one shape
    inference shared with the NCHWc rewrite); the model given is not changed."""
    counts = []

    def spy(proto, types):
        out, count = rewrite(proto, types)
        counts.append(count)
        return out, count

    rewrite = transposes.rewrite
    monkeypatch.setattr(transposes, "rewrite", spy)
    proto = transpose_model([9, 4096], [1, 0], TensorProto.FLOAT)
    before = proto.SerializeToString()
    for level in ("basic", "extended", "all"):
        gc.Session(proto, backend="ort-cpu", graph_optimization_level=level)
    gc.Session(proto, backend="ort-cpu", graph_optimization_level="disable")
    assert counts == [1, 1, 1] and proto.SerializeToString() == before
