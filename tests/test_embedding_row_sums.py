"""An embedding's gradient at sizes where it sorts its rows (``scatters.sorted_row_sums``): each
row's sum of dy taken in float64 and rounded once, so it is within half a float32 ulp (plus 1e-12)
of torch's float64 embedding backward, on numpy and on onnxruntime with 2 threads; small sizes and
float64 tables keep the ScatterElements sum."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(0)
BACKENDS = [("numpy", {}), ("ort-cpu", {"threads": 2})]


class _Lookup(nn.Module):
    def __init__(self, rows: int, dim: int, padding_idx: int | None, dtype: str):
        super().__init__()
        self.table = nn.Embedding(rows, dim, padding_idx=padding_idx, dtype=dtype)

    def forward(self, tokens, w):
        return (self.table(tokens) * w).sum()


def _grad_model(rows: int, dim: int, length: int, padding_idx=None, dtype="float32", index="int64") -> gc.Model:
    model = gc.capture(_Lookup(rows, dim, padding_idx, dtype), tokens=gc.spec(index, ("N", length)),
                       w=gc.spec(dtype, ("N", length, dim)))
    return gc.grad(model, "output")


def _torch_grad(rows: int, tokens: np.ndarray, w: np.ndarray, padding_idx=None) -> np.ndarray:
    torch = pytest.importorskip("torch")
    table = torch.zeros(rows, w.shape[-1], dtype=torch.float64, requires_grad=True)
    looked_up = torch.nn.functional.embedding(torch.from_numpy(tokens.astype(np.int64)), table, padding_idx=padding_idx)
    (looked_up * torch.from_numpy(w.astype(np.float64))).sum().backward()
    return table.grad.numpy()


def _ops(model: gc.Model) -> set[str]:
    return {n.op_type for n in model.proto.graph.node}


def _assert_rounded_once(got: np.ndarray, want: np.ndarray, err_msg: str) -> None:
    """Each entry the float64 sum rounded once to got's dtype: within half its ulp, plus 1e-12."""
    bound = np.spacing(np.abs(want).astype(got.dtype)).astype(np.float64) / 2 + 1e-12
    miss = np.abs(got.astype(np.float64) - want) - bound
    assert miss.max() <= 0, f"{err_msg}: {int((miss > 0).sum())} entries off by more than half an ulp"


@pytest.mark.parametrize("padding_idx", [None, 7])
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_lm_embedding_gradient_is_torchs_sum_rounded_once(padding_idx, index):
    """The LSTM LM's embedding: 1000 rows of 256, 16 x 128 tokens drawn from 40 ids (each ~51 times),
    the padding row among them."""
    model = _grad_model(1000, 256, 128, padding_idx, index=index)
    assert {"TopK", "CumSum"} <= _ops(model) and "ScatterElements" not in _ops(model)
    tokens = RNG.choice(RNG.permutation(1000)[:40], (16, 128)).astype(index)
    tokens[0, :5] = 7
    w = RNG.standard_normal((16, 128, 256)).astype(np.float32)
    want = _torch_grad(1000, tokens, w, padding_idx)
    for backend, options in BACKENDS:
        for _ in range(3):
            got = gc.Session(model, backend=backend, **options).run({"tokens": tokens, "w": w})["table.weight_grad"]
            _assert_rounded_once(got, want, backend)
        if padding_idx is not None:
            assert not got[7].any()


@pytest.mark.parametrize("batch", [0, 1, 3])
def test_run_time_token_counts_sort_too(batch):
    """A symbolic batch sorts (its size unknown when the rule runs): no tokens, one row of them, and
    ids at both ends of the table (no lookup of row 0 or of the last row must give zeros there)."""
    model = _grad_model(64, 48, 700)
    assert "TopK" in _ops(model)
    tokens = RNG.integers(0, 64, (batch, 700))
    tokens[:, :2] = [0, 63]
    w = RNG.standard_normal((batch, 700, 48)).astype(np.float32)
    want = _torch_grad(64, tokens, w)
    for backend, options in BACKENDS:
        got = gc.Session(model, backend=backend, **options).run({"tokens": tokens, "w": w})["table.weight_grad"]
        _assert_rounded_once(got, want, backend)


def test_negative_ids_and_a_row_of_several_values_sort_like_any_other():
    """A plain ONNX Gather of a [512, 4, 8] table by ids from -512 to 511 (negative: from the end)."""
    table = RNG.standard_normal((512, 4, 8)).astype(np.float32)
    tokens = RNG.integers(-512, 512, (6, 200))
    w = RNG.standard_normal((6, 200, 4, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "tokens"], ["rows"], axis=0),
             helper.make_node("Mul", ["rows", "w"], ["prod"]), helper.make_node("ReduceSum", ["prod"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info("tokens", TensorProto.INT64, [6, 200]),
                                                helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 200, 4, 8])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              initializer=[numpy_helper.from_array(table, "table")])
    model = gc.grad(gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])), "loss")
    assert "TopK" in _ops(model)
    want = np.zeros(table.shape)
    np.add.at(want, tokens.reshape(-1) % 512, w.reshape(-1, 4, 8).astype(np.float64))
    for backend, options in BACKENDS:
        got = gc.Session(model, backend=backend, **options).run({"tokens": tokens, "w": w})["table_grad"]
        _assert_rounded_once(got, want, backend)


def test_float16_tables_sum_in_float64_and_round_once():
    model = _grad_model(300, 128, 256, dtype="float16")
    assert "TopK" in _ops(model)
    tokens = RNG.integers(0, 300, (2, 256))
    w = RNG.standard_normal((2, 256, 128)).astype(np.float16)
    want = _torch_grad(300, tokens, w)
    for backend, options in BACKENDS:
        got = gc.Session(model, backend=backend, **options).run({"tokens": tokens, "w": w})["table.weight_grad"]
        assert got.dtype == np.float16
        _assert_rounded_once(got, want, backend)


@pytest.mark.parametrize("rows, dim, length, dtype", [(100, 16, 64, "float32"), (1000, 256, 128, "float64")])
def test_small_sums_and_float64_tables_keep_scatter_elements(rows, dim, length, dtype):
    """Under 2**15 values of dy (1,024 a sample here, 2 samples) the ScatterElements sum is as fast;
    a float64 table has no wider type for its prefix sums."""
    tokens = RNG.integers(0, rows, (2, length))
    model = gc.capture(_Lookup(rows, dim, None, dtype), tokens=gc.spec("int64", (2, length)),
                       w=gc.spec(dtype, (2, length, dim)))
    model = gc.grad(model, "output")
    assert "ScatterElements" in _ops(model) and "TopK" not in _ops(model)
    w = RNG.standard_normal((2, length, dim)).astype(dtype)
    want = _torch_grad(rows, tokens, w)
    for backend, options in BACKENDS:
        got = gc.Session(model, backend=backend, **options).run({"tokens": tokens, "w": w})["table.weight_grad"]
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-13, atol=1e-6 if dtype == "float32" else 1e-13)
