"""Imported models train what the source framework trains (issue 14, item 1): the constants an
exporter makes (scalars, masks, zero states) are reported, not trained; overridable both ways.

The dynamo case reads tests/data/zoo/gpt_dynamo.onnx (a committed torch.onnx export of a
GPT-style block: NewGELU constants, a causal mask, attention scale), so no torch is needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc
from cli_util import run_cli
from graphc.passes.training.imports import retie_folded_copies

LOSS = gc.losses.cross_entropy("logits", label="y")
GPT = Path(__file__).parent / "data" / "zoo" / "gpt_dynamo.onnx"
BATCH = {"x": np.array([[3, 1, 4, 1, 5, 9]] * 4, np.int64), "y": np.array([0, 1, 2, 3], np.int64)}


def _initializer_holding(model: gc.Model, value: float) -> str:
    names = [n for n, v in model.ir.graph.initializers.items()
             if v.const_value is not None and v.const_value.size == 1 and np.isclose(v.const_value.numpy(), value)]
    assert len(names) == 1, names
    return names[0]


def test_dynamo_export_constants_are_reported_and_stay_constant():
    model = gc.load(GPT)
    gelu = _initializer_holding(model, 0.044715)
    arts = gc.training.generate(model, LOSS, gc.optim.AdamW(1e-2))
    m = arts.manifest
    assert gelu in m.constants and gelu not in m.trainable and gelu not in m.frozen
    assert "not a parameter" in m.constants[gelu] or "exporter" in m.constants[gelu]
    assert {"tok.weight", "ln1.weight", "head.bias"} <= set(m.trainable)
    kinds = {n: model.ir.graph.initializers[n].metadata_props.get("pkg.torch.export.graph_signature.InputSpec.kind")
             for n in m.trainable}
    # every trainable is a module PARAMETER or folded from one (a transposed weight)
    for n, kind in kinds.items():
        folded = model.ir.graph.initializers[n].metadata_props.get("pkg.onnxscript.optimizer.folded_from", "")
        assert kind == "PARAMETER" or "weight" in folded or "pos" in folded, (n, kind, folded)
    step_inputs = {e.name for e in m.graphs["train_step"].inputs}
    assert not step_inputs & set(m.constants)
    trainer = gc.Trainer(arts, backend="numpy")
    losses = [trainer.step(BATCH) for _ in range(5)]
    assert losses[-1] < losses[0] and gelu not in trainer.state_dict()
    assert float(arts.inference.params[gelu]) == np.float32(0.044715)


def test_constants_can_be_trained_and_params_frozen_by_pattern():
    model = gc.load(GPT)
    gelu = _initializer_holding(model, 0.044715)
    arts = gc.training.generate(model, LOSS, gc.optim.SGD(0.1), params=[gelu], frozen=["ln*"])
    assert gelu in arts.manifest.trainable and gelu not in arts.manifest.constants
    assert not [n for n in arts.manifest.trainable if n.startswith("ln")]
    assert {"ln1.weight", "lnf.bias"} <= set(arts.manifest.frozen)
    with pytest.raises(gc.GraphError, match="params: unknown parameter"):
        gc.training.generate(model, LOSS, gc.optim.SGD(0.1), params=["no_such_*"])
    # named both ways: frozen had silently won
    with pytest.raises(gc.GraphError, match=r"\['ln1.weight'\] matched by both frozen= \(--freeze\) and params="):
        gc.training.generate(model, LOSS, gc.optim.SGD(0.1), params=["ln1.weight"], frozen=["ln*"])


def _torchscript_like(producer: str) -> gc.Model:
    """fc.weight (a module path), onnx::MatMul_7 (a weight the exporter transposed), a scalar
    onnx::Mul_8, an all-zero onnx::Add_9, and a zero Constant [2, 4] (a recurrent initial state)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(4, 3)).astype(np.float32), "fc.weight"),
             nh.from_array(rng.normal(size=(4, 4)).astype(np.float32), "onnx::MatMul_7"),
             nh.from_array(np.array(0.5, np.float32), "onnx::Mul_8"),
             nh.from_array(np.zeros(4, np.float32), "onnx::Add_9")]
    nodes = [oh.make_node("Constant", [], ["h0"], value=nh.from_array(np.zeros((2, 4), np.float32))),
             oh.make_node("Gemm", ["x", "fc.weight"], ["a"], transB=1),
             oh.make_node("MatMul", ["a", "onnx::MatMul_7"], ["b"]),
             oh.make_node("Mul", ["b", "onnx::Mul_8"], ["c"]),
             oh.make_node("Add", ["c", "onnx::Add_9"], ["d"]),
             oh.make_node("Add", ["d", "h0"], ["logits"])]
    graph = oh.make_graph(nodes, "ts", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                          [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [2, 4])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], producer_name=producer))


def test_torchscript_rule_and_zero_constants():
    m = gc.training.generate(_torchscript_like("pytorch"), LOSS, gc.optim.SGD(0.1)).manifest
    assert m.trainable == ["fc.weight", "onnx::MatMul_7"]
    assert set(m.constants) == {"onnx::Mul_8", "onnx::Add_9"} and "scalar" in m.constants["onnx::Mul_8"]
    assert "h0" not in m.trainable and "h0" not in m.frozen  # a zero Constant is never promoted
    other = gc.training.generate(_torchscript_like("another exporter"), LOSS, gc.optim.SGD(0.1)).manifest
    assert other.constants == {} and "onnx::Mul_8" in other.trainable  # no evidence: every initializer
    assert "h0" not in other.trainable


def test_only_exact_folded_copies_of_a_weight_are_computed_from_it_again():
    """TorchScript ``onnx::`` initializers: one equal to w transposed becomes Transpose(w), one
    equal to w an Identity of it; a separate weight of w's shape and an identity matrix equal to
    another param's (equal by construction) stay initializers, and another producer's names mean
    nothing."""
    rng = np.random.default_rng(0)
    w, other = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)
    arrays = {"w": w, "eye": np.eye(3, dtype=np.float32), "onnx::MatMul_1": w.T, "onnx::Add_2": w,
              "onnx::MatMul_3": other, "onnx::MatMul_4": np.eye(3, dtype=np.float32)}
    nodes = [oh.make_node("MatMul", ["x", "w"], ["a"]), oh.make_node("MatMul", ["a", "onnx::MatMul_1"], ["b"]),
             oh.make_node("MatMul", ["b", "w"], ["c"]), oh.make_node("Add", ["c", "onnx::Add_2"], ["d"]),
             oh.make_node("MatMul", ["d", "onnx::MatMul_3"], ["e"]), oh.make_node("MatMul", ["e", "eye"], ["f"]),
             oh.make_node("MatMul", ["f", "onnx::MatMul_4"], ["logits"])]

    def model(producer):
        graph = oh.make_graph(nodes, "ts", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 3])],
                              [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [3, 3])],
                              [nh.from_array(a, n) for n, a in arrays.items()])
        return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], producer_name=producer))

    ts = model("pytorch").ir
    assert retie_folded_copies(ts) == ["onnx::MatMul_1", "onnx::Add_2"]
    assert set(ts.graph.initializers) == {"w", "eye", "onnx::MatMul_3", "onnx::MatMul_4"}
    assert [n.op_type for n in ts.graph][:2] == ["Identity", "Transpose"]
    x = rng.normal(size=(3, 3)).astype(np.float32)
    np.testing.assert_allclose(gc.Session(gc.Model(ts), backend="numpy").run({"x": x})["logits"],
                               gc.Session(model("pytorch"), backend="numpy").run({"x": x})["logits"], rtol=1e-6)
    with pytest.warns(UserWarning, match="'onnx::MatMul_4'"):  # its repeated values: a gathered table?
        arts = gc.training.generate(model("pytorch"), gc.losses.mse("logits", label="y"), gc.optim.SGD(0.1))
    assert arts.manifest.trainable == ["w", "eye", "onnx::MatMul_3", "onnx::MatMul_4"]
    assert retie_folded_copies(model("another exporter").ir) == []


def test_grad_command_reports_params_and_constants(capsys, tmp_path):
    result = run_cli(capsys, "grad", GPT, "--loss", "cross_entropy:logits:y", "--optimizer", "adamw", "-o",
                     tmp_path / "arts")
    assert result.code == 0, result.err
    assert "exporter constants" in result.out and "trainable:" in result.out and "tok.weight" in result.out
    manifest = gc.training.read_manifest(tmp_path / "arts")
    assert manifest.constants and manifest.batchnorm == "train"


class _Shifted(gc.nn.Module):
    """A Linear whose output is shifted by a buffer, as torch's register_buffer: state, not trained."""

    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 2)
        self.register_buffer("shift", np.array([0.5, -1.0], np.float32))

    def forward(self, x):
        return self.fc(x) + self.shift


def test_module_buffers_are_not_trained_unless_named():
    """A gc.nn buffer is a constant of the training graphs (torch.optim never sees it); it was
    trained as a parameter. ``params=`` trains it anyway."""
    model = gc.capture(_Shifted(), x=gc.spec("float32", ("N", 3)))
    spec = gc.losses.mse("output", label="t")
    arts = gc.training.generate(model, spec, gc.optim.SGD(0.5))
    assert arts.manifest.trainable == ["fc.weight", "fc.bias"] and arts.manifest.frozen == []
    assert arts.manifest.constants == {"shift": "a buffer of a gc.nn module, not a parameter"}
    trainer = gc.Trainer(arts, backend="numpy")
    rng = np.random.default_rng(0)
    trainer.step({"x": rng.normal(size=(4, 3)).astype(np.float32), "t": rng.normal(size=(4, 2)).astype(np.float32)})
    assert "shift" not in trainer.state_dict()
    np.testing.assert_array_equal(arts.inference.params["shift"], [0.5, -1.0])
    forced = gc.training.generate(model, spec, gc.optim.SGD(0.5), params=["shift"])
    assert forced.manifest.trainable == ["fc.weight", "fc.bias", "shift"] and forced.manifest.constants == {}
