"""An audit of gc.optimize where tests/test_random_graphs.py and test_optimize_models.py do not reach:
torch exports of both exporters (float32 and float64), subgraphs, local functions, initializers a caller may
feed, float16/bfloat16/float64 fusions at opsets 13..23, exported inference models. At each level: a model
that passes ``check_model(full_check=True)``, the same interface and model metadata, the same outputs on
ort-cpu and the numpy backend, and optimizing twice gives the same nodes and once the same bytes."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc.passes.values import INFERENCE_ONLY_KEY
from optimize_util import interface, random_feeds

ZOO = Path(__file__).parent / "data" / "zoo"
# ort-cpu runs each of these (HardSigmoid and Conv of symbolic spatial dims have no float64 lowering yet)
EXPORTS = ["resnet_dynamo", "resnet_torchscript_float64", "gpt_dynamo_float64", "gpt_torchscript",
           "bert_dynamo_float64", "bert_torchscript", "lstm_gru_lm_torchscript_float64", "mobilenet_torchscript",
           "shufflenet_dynamo"]


def _plain(outputs: dict) -> dict:
    return {k: v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v for k, v in outputs.items()}


def _run(model: gc.Model, feeds: dict, backend: str) -> dict:
    return _plain(gc.Session(model, backend=backend, threads=1).run(feeds))


def _close(want: dict, got: dict, tol: float, what: str) -> None:
    assert want.keys() == got.keys(), what
    for name in want:
        assert want[name].dtype == got[name].dtype and want[name].shape == got[name].shape, f"{what} {name}"
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=f"{what} {name}")


def _header(model: gc.Model) -> tuple:
    p = model.proto
    return (p.ir_version, p.producer_name, p.doc_string, [(o.domain, o.version) for o in p.opset_import],
            [(m.key, m.value) for m in p.metadata_props if m.key != INFERENCE_ONLY_KEY],  # level 3's mark
            [f.name for f in p.functions])


def _audit(model: gc.Model, tol: float, feeds: dict | None = None, levels=(1, 2, 3)) -> None:
    feeds = feeds if feeds is not None else random_feeds(model, 2, seed=2)
    want = {b: _run(model, feeds, b) for b in ("ort-cpu", "numpy")}
    for level in levels:
        out = gc.optimize(model, level)
        onnx.checker.check_model(out.proto, full_check=True)
        assert interface(out) == interface(model), f"level {level}"
        assert _header(out)[:3] == _header(model)[:3] and _header(out)[3:5] == _header(model)[3:5], f"level {level}"
        for backend, expected in want.items():
            _close(expected, _run(out, feeds, backend), tol, f"level {level} {backend}")
        again = gc.optimize(out, level)
        assert Counter(n.op_type for n in again.ir.graph) == Counter(n.op_type for n in out.ir.graph), \
            f"level {level}: optimizing twice changed the graph"
        assert gc.optimize(model, level).proto.SerializeToString() == out.proto.SerializeToString(), \
            f"level {level}: two runs gave different bytes"


@pytest.mark.parametrize("name", EXPORTS)
def test_torch_exports_keep_their_outputs_at_every_level(name):
    _audit(gc.load(ZOO / f"{name}.onnx"), 1e-10 if name.endswith("float64") else 1e-4)


def _model(nodes, inputs, outputs, inits=(), opset=21, functions=()) -> gc.Model:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    proto = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    proto.ir_version = 8 if opset <= 18 else 10
    return gc.load(proto)


def _init(name: str, value, elem=None) -> onnx.TensorProto:
    array = np.asarray(value)
    if elem == TensorProto.BFLOAT16:
        return helper.make_tensor(name, elem, array.shape, array.astype(np.float32).ravel().tolist())
    return numpy_helper.from_array(array, name)


def _gelu_of_layer_norm(elem: int, dtype, opset: int, sqrt2: float = math.sqrt(2), eps: float = 1e-5) -> gc.Model:
    """x @ W + B, layer-normalized over the last axis, then x/2 (1 + erf(x / sqrt2)), written out."""
    axes = {} if opset >= 18 else {"axes": [-1]}
    mean_in = (lambda v: [v, "ax"]) if opset >= 18 else (lambda v: [v])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("ReduceMean", mean_in("a"), ["mu"], **axes), helper.make_node("Sub", ["a", "mu"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]), helper.make_node("ReduceMean", mean_in("d2"), ["var"], **axes),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "bb"], ["o"]), helper.make_node("Div", ["o", "sq2"], ["q"]),
             helper.make_node("Erf", ["q"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["o", "e1"], ["oe"]), helper.make_node("Mul", ["oe", "half"], ["y"])]
    rng = np.random.default_rng(1)
    values = {"W": rng.standard_normal((8, 8)) * 0.3, "B": rng.standard_normal(8), "eps": eps,
              "g": rng.standard_normal(8), "bb": rng.standard_normal(8), "sq2": sqrt2, "one": 1.0, "half": 0.5}
    inits = [_init(k, np.asarray(v, np.float64).astype(dtype), elem) for k, v in values.items()]
    inits.append(_init("ax", np.array([-1], np.int64)))
    return _model(nodes, [("x", elem, ["N", 8])], [("y", elem, ["N", 8])], inits, opset)


@pytest.mark.parametrize("elem, dtype, tol", [(TensorProto.FLOAT16, np.float16, 2e-2),
                                              (TensorProto.BFLOAT16, ml_dtypes.bfloat16, 6e-2),
                                              (TensorProto.DOUBLE, np.float64, 1e-12)],
                         ids=["float16", "bfloat16", "float64"])
def test_fusions_in_low_and_double_precision_at_opsets_13_to_23(elem, dtype, tol):
    """LayerNormalization (opset 17+) and Gelu (20+) fused from their written-out forms, in float16,
    bfloat16 and float64 (a fused float64 Gelu failed to load on ort-cpu: no double Erf in its body)."""
    for opset in (13, 17, 18, 20, 23):
        model = _gelu_of_layer_norm(elem, dtype, opset)
        _audit(model, tol, levels=(2,))
        fused = {n.op_type for n in gc.optimize(model, 2).ir.graph}
        # float64's 1e-5 is no float32, which the op's epsilon is: see the test below
        assert ("Gelu" in fused) == (opset >= 20), opset
        assert ("LayerNormalization" in fused) == (opset >= 17 and dtype != np.float64), opset


def test_gelu_fusion_needs_sqrt2_to_the_dtypes_rounding():
    """A float64 model dividing by float32's sqrt(2) (a float32 model cast to double) was fused into a Gelu,
    which divides by the exact one: outputs 5e-9 off, where float64 holds 1e-16. So was 1.4142 in float32."""
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8))}
    for dtype, sqrt2, fused in ((np.float64, float(np.float32(math.sqrt(2))), False),
                                (np.float32, 1.4142, False), (np.float64, math.sqrt(2), True)):
        model = _gelu_of_layer_norm(TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT, dtype, 21, sqrt2)
        out = gc.optimize(model, 2)
        assert ("Gelu" in {n.op_type for n in out.ir.graph}) == fused, (dtype, sqrt2)
        f = {"x": feeds["x"].astype(dtype)}
        want = gc.Session(model, backend="numpy").run(f)["y"]
        np.testing.assert_allclose(gc.Session(out, backend="numpy").run(f)["y"], want,
                                   rtol=1e-14 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("eps, fused", [(1e-5, False), (2.0**-17, True)])
def test_float64_layer_norm_is_fused_only_with_an_epsilon_float32_holds(eps, fused):
    """LayerNormalization's epsilon is a float32 attribute: fusing a float64 model's 1e-5 rounded it, and the
    outputs moved by 1e-12 relative (float64 holds 1e-16)."""
    model = _gelu_of_layer_norm(TensorProto.DOUBLE, np.float64, 18, eps=eps)
    out = gc.optimize(model, 2)
    assert ("LayerNormalization" in {n.op_type for n in out.ir.graph}) == fused
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8))}
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(out, backend=backend).run(feeds)["y"],
                                   gc.Session(model, backend=backend).run(feeds)["y"], rtol=1e-14, atol=1e-15)


def _vi(name, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def test_if_branch_reads_a_graph_input_with_a_default_and_the_fed_value_wins():
    """``w`` is an initializer and a graph input (ir 8): no level folds ``w * 2`` in the branch, nor the
    Identity or Shape of it in the main graph; a fed ``w`` reaches every use."""
    then = helper.make_graph([helper.make_node("Mul", ["w", "two"], ["t0"]), helper.make_node("Add", ["x", "t0"], ["to"])],
                             "then", [], [_vi("to")])
    other = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["eo"])], "else", [], [_vi("eo")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Identity", ["w"], ["wi"]), helper.make_node("Shape", ["w"], ["ws"])]
    inits = [_init("w", np.ones(3, np.float32)), _init("two", np.float32(2)), _init("zero", np.float32(0))]
    model = _model(nodes, [("x", TensorProto.FLOAT, ["N", 3]), ("w", TensorProto.FLOAT, [3])],
                   [("y", TensorProto.FLOAT, ["N", 3]), ("wi", TensorProto.FLOAT, [3]), ("ws", TensorProto.INT64, [1])],
                   inits, opset=17)
    fed = {"x": np.ones((2, 3), np.float32), "w": np.full(3, 5, np.float32)}
    _audit(model, 1e-6, fed)
    for level in (1, 2, 3):
        for backend in ("ort-cpu", "numpy"):
            got = _run(gc.optimize(model, level), fed, backend)
            np.testing.assert_array_equal(got["y"], np.full((2, 3), 11, np.float32))
            np.testing.assert_array_equal(got["wi"], fed["w"])


def test_loop_scan_and_local_function_bodies():
    """Rewrites inside a Loop body (MatMul+Add, a Transpose pair, x*1), a Scan body and a local function keep
    the outputs, symbolic dims and the function list."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["hm"]), helper.make_node("Add", ["hm", "B"], ["ha"]),
         helper.make_node("Transpose", ["ha"], ["t1"], perm=[1, 0]), helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
         helper.make_node("Tanh", ["t2"], ["hn"]), helper.make_node("Identity", ["cond"], ["co"]),
         helper.make_node("Mul", ["hn", "one"], ["sc"])], "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("h", shape=["N", 4])],
        [_vi("co", TensorProto.BOOL, []), _vi("hn", shape=["N", 4]), _vi("sc", shape=["N", 4])], [_init("one", np.float32(1))])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["acc", "xi"], ["a1"]), helper.make_node("Mul", ["a1", "half"], ["a2"]),
         helper.make_node("Identity", ["a2"], ["yo"])], "scan",
        [_vi("acc", shape=[4]), _vi("xi", shape=[4])], [_vi("a2", shape=[4]), _vi("yo", shape=[4])],
        [_init("half", np.float32(0.5))])
    fn = helper.make_function("local", "Sq", ["a", "b"], ["c"], [helper.make_node("MatMul", ["a", "b"], ["m"]),
                              helper.make_node("Mul", ["m", "m"], ["c"])], opset_imports=[helper.make_opsetid("", 19)])
    nodes = [helper.make_node("Loop", ["n", "t", "x"], ["hf", "ys"], body=body),
             helper.make_node("Scan", ["init", "seq"], ["fin", "ss"], body=scan_body, num_scan_inputs=1),
             helper.make_node("Sq", ["hf", "W"], ["f1"], domain="local")]
    inits = [_init("n", np.int64(3)), _init("t", np.bool_(True)), _init("W", w), _init("B", np.ones(4, np.float32)),
             _init("init", np.zeros(4, np.float32))]
    model = _model(nodes, [("x", TensorProto.FLOAT, ["N", 4]), ("seq", TensorProto.FLOAT, ["T", 4])],
                   [("f1", TensorProto.FLOAT, ["N", 4]), ("ys", TensorProto.FLOAT, [3, "N", 4]),
                    ("fin", TensorProto.FLOAT, [4]), ("ss", TensorProto.FLOAT, ["T", 4])], inits, 19, [fn])
    _audit(model, 1e-5)
    assert all(_header(gc.optimize(model, level))[5] == ["Sq"] for level in (1, 2, 3))


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_export_inference_matches_the_trainers_predictions(tmp_path, name):
    """``Trainer.export_inference`` (trained params folded in, level 3: Conv+BatchNormalization folded,
    Dropout dropped) against the trainer's own eval-mode outputs after a few steps."""
    from graphc.models import EXAMPLES

    factory, inputs = EXAMPLES[name]
    arts = gc.training.generate(gc.capture(factory(), **inputs(), training=True),
                                gc.losses.cross_entropy("output", label="y"), gc.optim.Adam(1e-2))
    trainer = gc.Trainer(arts, backend="ort-cpu")
    rng = np.random.default_rng(0)

    def batch(n):
        out = {}
        for spec in trainer.batch_specs:
            shape = [n if not isinstance(d, int) else d for d in spec.shape]
            integer = np.issubdtype(np.dtype(spec.dtype), np.integer)
            out[spec.name] = (rng.integers(0, 2, shape) if integer else rng.standard_normal(shape)).astype(spec.dtype)
        return out

    for _ in range(3):
        trainer.step(batch(4))
    data = {k: v for k, v in batch(3).items() if k != "y"}
    want = trainer.predict(data)["output"]
    exported = gc.load(trainer.export_inference(tmp_path / "m.onnx"))
    onnx.checker.check_model(exported.proto, full_check=True)
    assert not {"BatchNormalization", "Dropout"} & {n.op_type for n in exported.ir.graph}
    for backend in ("ort-cpu", "numpy"):
        np.testing.assert_allclose(_run(exported, data, backend)["output"], want, rtol=1e-5, atol=1e-5)
