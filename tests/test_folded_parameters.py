"""Parameters an exporter's constant folding merged with other tensors (issue 14, item 5): a
BatchNorm fused into the Conv before it, a relative position bias table gathered by constant
indices. Training such an export updates the merged tensors, not the source model's
parameters: ``generate`` warns, naming them; an export without the folding trains silently."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc

LOSS = gc.losses.cross_entropy("logits", label="y")
ZOO = Path(__file__).parent / "data" / "zoo"
RNG = np.random.default_rng(0)
SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"


def _dynamo_like(bias: np.ndarray) -> gc.Model:
    """Conv (its weight keeps conv.weight, its BatchNorm folded in, bn.* gone) then an Add of a
    [1, 2, 2, 2] bias folded from ``table`` (a PARAMETER) and constants, recorded as the dynamo
    exporter and onnxscript's optimizer record them."""
    inits = [nh.from_array(RNG.standard_normal((2, 3, 1, 1)).astype(np.float32), "conv.weight"),
             nh.from_array(RNG.standard_normal(2).astype(np.float32), "conv.weight_bias"),
             nh.from_array(bias.astype(np.float32), "unsqueeze"),
             nh.from_array(RNG.standard_normal((2, 5)).astype(np.float32), "fc.weight")]
    nodes = [oh.make_node("Conv", ["x", "conv.weight", "conv.weight_bias"], ["c"]),
             oh.make_node("Add", ["c", "unsqueeze"], ["a"]),
             oh.make_node("ReduceMean", ["a"], ["m"], axes=[2, 3], keepdims=0),
             oh.make_node("MatMul", ["m", "fc.weight"], ["logits"])]
    graph = oh.make_graph(nodes, "dynamo", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 2, 2])],
                          [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [2, 5])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], producer_name="pytorch")
    model.graph.metadata_props.add(key=SIGNATURE, value=" ".join(
        f"InputSpec(kind=<InputKind.PARAMETER: 2>, arg=..., PARAMETER target='{t}')"
        for t in ("conv.weight", "bn.weight", "bn.bias", "table", "fc.weight")) + " BUFFER target='rel_index'")
    folded = oh.make_tensor_value_info("unsqueeze", onnx.TensorProto.FLOAT, [1, 2, 2, 2])
    # where torch writes it, as torch 2.13 records a gather (``index``) of a buffer's indices
    folded.metadata_props.add(key=FOLDED_FROM, value="['index', 'rel_index', 'table', 'view_2']")
    model.graph.value_info.append(folded)
    return gc.load(model)


def _warnings(model: gc.Model) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.training.generate(model, LOSS, gc.optim.SGD(0.1))
    return [str(w.message) for w in caught if "folded parameters" in str(w.message)]


def test_dynamo_fused_batchnorm_and_a_gathered_table_are_named():
    table = RNG.standard_normal(3)
    gathered = table[[0, 1, 2, 1, 0, 2, 1, 0]].reshape(1, 2, 2, 2)  # each table entry in several places
    [message] = _warnings(_dynamo_like(gathered))
    assert "'unsqueeze' (copies of table)" in message and "bn.bias, bn.weight" in message
    assert "optimize=False" in message and "do_constant_folding=False" in message


def test_a_sliced_or_reordered_parameter_is_not_a_merge():
    """Folded from a parameter with constants, but each value once (a position table sliced):
    it trains as the source model's parameter does; only the fused BatchNorm is named."""
    [message] = _warnings(_dynamo_like(RNG.standard_normal((1, 2, 2, 2))))
    assert "unsqueeze" not in message and "bn.weight" in message


def test_torchscript_conv_weight_computed_by_the_exporter_is_named():
    inits = [nh.from_array(RNG.standard_normal((2, 3, 1, 1)).astype(np.float32), "onnx::Conv_7"),
             nh.from_array(RNG.standard_normal(2).astype(np.float32), "onnx::Conv_8"),
             nh.from_array(RNG.standard_normal((2, 5)).astype(np.float32), "onnx::MatMul_9")]
    nodes = [oh.make_node("Conv", ["x", "onnx::Conv_7", "onnx::Conv_8"], ["c"], name="/stem/stem.0/Conv"),
             oh.make_node("ReduceMean", ["c"], ["m"], axes=[2, 3], keepdims=0),
             oh.make_node("MatMul", ["m", "onnx::MatMul_9"], ["logits"], name="/fc/MatMul")]
    graph = oh.make_graph(nodes, "ts", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 2, 2])],
                          [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [2, 5])], inits)
    [message] = _warnings(gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], producer_name="pytorch")))
    assert "'onnx::Conv_7' (read by '/stem/stem.0/Conv')" in message and "MatMul" not in message


@pytest.mark.parametrize("path", sorted(ZOO.glob("*.onnx")), ids=lambda p: p.stem)
def test_exports_without_folding_train_silently(path):
    """The zoo's exports keep every parameter (BatchNorm and Swin models are exported without
    constant folding): no warning."""
    from graphc.passes.training import imports

    model = gc.load(path)
    params = [n for n, v in model.ir.graph.initializers.items() if imports.is_float(v)]
    assert imports.folded_parameters(model.ir, params) == []

