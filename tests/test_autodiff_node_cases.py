"""Every gradient rule against float64 finite differences on onnx's own node cases.

The generated checks (test_autodiff_rules.py) use inputs and attributes chosen here; onnx's
node cases bring the ones the operator authors chose: unusual attributes (dilations, negative
axes, allowzero, ignore_index with class weights, min > max, ...) and zero-size tensors. Each
one-node case whose op has a rule becomes a float64 model (its float inputs differentiated, the
others constants) with loss sum(Y * C) over its float outputs; the directional derivative of the
loss along a random direction must match central differences.

A few cases sit where the loss is not differentiable (a kink or tie in the case's data, or a NaN
domain); they are listed in ``NOT_DIFFERENTIABLE`` with the reason. An op configuration a rule
does not support must fail with a ``GraphError`` that names the op.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import graphc as gc
from graphc.backends.conformance import case_op_types, excluded, load_node_cases
from graphc.passes.autodiff import RULES, SETTING_INPUTS, gradient_model
from graphc.passes.autodiff.recurrent import UNROLLED
from graphc.passes.functions import has_function

try:
    from test_autodiff_rules import run_numpy
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy

NOT_DIFFERENTIABLE = {
    "test_elu_example": "input [-1, 0, 1] has an element on the kink at 0",
    "test_leakyrelu_example": "input [-1, 0, 1] has an element on the kink at 0",
    "test_selu_example": "input [-1, 0, 1] has an element on the kink at 0",
    "test_thresholdedrelu_example": "input 2.0 sits on the threshold alpha = 2.0 (a jump)",
    "test_floor_example": "integer inputs sit on Floor's jumps",
    "test_round": "inputs such as 0.5 and 2.0 sit on Round's jumps",
    "test_sign": "an input of 0 sits on Sign's jump",
    "test_maxpool_3d_dilations": "the four depth slices are equal: every window max is a tie",
    "test_maxpool_3d_dilations_use_ref_impl": "the four depth slices are equal: every window max is a tie",
    "test_reduce_min_default_axes_keepdims_example": "the minimum 1 occurs twice (a tie)",
    "test_pow": "negative bases with fractional exponents: the loss is NaN",
    "test_reduce_log_sum_exp_empty_set": "an empty reduction: the loss is +-inf and its differences NaN",
    "test_reduce_max_empty_set": "an empty reduction: the loss is +-inf and its differences NaN",
    "test_reduce_min_empty_set": "an empty reduction: the loss is +-inf and its differences NaN",
    "test_reduce_log_sum_empty_set": "an empty reduction: the loss is -inf and its differences NaN",
    "test_acosh_example": "x = 1 is the edge of acosh's domain: an infinite slope",
    "test_hardmax_one_hot": "equal entries in a row: the argmax is a tie, where Hardmax jumps",
    **{f"test_gridsample{suffix}": "grid points on pixel centres: bilinear sampling's kinks (nearest: its jumps)"
       for suffix in ("_bilinear", "_aligncorners_true", "_nearest", "_nearest_align_corners_0_additional_1",
                      "_nearest_align_corners_1_additional_1", "_bilinear_align_corners_1_additional_1",
                      "_volumetric_nearest_align_corners_0", "_volumetric_nearest_align_corners_1",
                      "_volumetric_bilinear_align_corners_0", "_volumetric_bilinear_align_corners_1")},
    "test_l2normalization_axis_0": "an all-zero column: the norm is 0 and its derivative undefined",
    "test_mod_float_edge_cases_fmod_0_float16": "inf and NaN operands: the loss is NaN",
    "test_mod_float_edge_cases_fmod_0_float32": "inf and NaN operands: the loss is NaN",
    "test_mod_float_edge_cases_fmod_0_float64": "inf and NaN operands: the loss is NaN",
    **{f"test_attention_4d_with_past_and_present_qk_matmul_bias_{rank}d_mask_causal":
       "the qk_matmul_output it asks for (mode 2) holds the causal mask's -inf: the loss is not finite"
       for rank in (3, 4)},
    "test_batchnorm_example_training_mode": "the running mean/var outputs carry no gradient (PyTorch's "
                                            "convention) and this case's loss uses them",
    "test_batchnorm_epsilon_training_mode": "the running mean/var outputs carry no gradient (PyTorch's "
                                            "convention) and this case's loss uses them",
}
FLOATS = (np.float16, np.float32, np.float64)
NO_GRADIENT = {"Resize": {1, 2}, "Dropout": {1},  # roi/scales, ratio: settings without a gradient
               "OneHot": {0, 1}}  # indices and depth, float in some cases: the output steps with them


def _runnable(case) -> bool:
    """One node, no subgraph, every input a plain tensor or numpy scalar and every output a
    tensor (no sequence or optional: the loss here multiplies each output; sequence gradients
    are checked in tests/autodiff_cases.py)."""
    graph = case.model.graph
    if len(graph.node) != 1 or "_expanded" in case.name or excluded(case.name):
        return False
    if any(not o.type.HasField("tensor_type") for o in graph.output):
        return False
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in graph.node[0].attribute):
        return False
    inputs = case.data_sets[0][0]
    return len(inputs) == len(graph.input) and all(
        isinstance(v, (np.ndarray, np.generic)) and v.dtype != object for v in inputs)


@functools.lru_cache(maxsize=1)
def _cases_by_op() -> dict[str, list]:
    cases = load_node_cases()
    ops = case_op_types(cases)
    by_op: dict[str, list] = {}
    for case in cases:
        if _runnable(case) and (ops[case.name] in RULES or ops[case.name] in UNROLLED or _is_function(case)):
            by_op.setdefault(ops[case.name], []).append(case)
    return by_op


def _is_function(case) -> bool:
    """An op without a rule that ONNX defines as a function: autodiff goes through its body."""
    node = case.model.graph.node[0]
    opset = next((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), None)
    return opset is not None and node.domain in ("", "ai.onnx") and has_function(node, opset)


FUNCTION_OPS = sorted({"Attention", "RMSNormalization", "RotaryEmbedding", "Mish", "SwiGLU", "ReduceL1", "ReduceLogSum",
                       "MeanVarianceNormalization", "Shrink", "CenterCropPad", "Celu",
                       "Swish", "LinearAttention", "CausalConvWithState"} - set(RULES))


def _takes_double(node: onnx.NodeProto, opset: int, index: int) -> bool:
    """Whether the op's schema lets input ``index`` be a double (Resize's scales must be float)."""
    schema = onnx.defs.get_schema(node.op_type, opset)
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == formal.type_str),
                   [formal.type_str])
    return "tensor(double)" in allowed


def _float64_model(case) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """The case's node over initializers: float inputs in float64 (the params) where the op
    allows, others as given; outputs are the node's float ones."""
    graph = case.model.graph
    opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
    inits, params = [], []
    node = graph.node[0]
    for info, value in zip(graph.input, case.data_sets[0][0]):
        value = np.asarray(value)
        if value.dtype in FLOATS and _takes_double(node, opset, list(node.input).index(info.name)):
            value = value.astype(np.float64)
            params.append(info.name)
        inits.append(numpy_helper.from_array(value, info.name))
    node = onnx.NodeProto()
    node.CopyFrom(graph.node[0])
    for precision in ("stash_type", "softmax_precision"):
        # the normalizations' and Attention's softmax compute precision: float64 here too
        if precision in onnx.defs.get_schema(node.op_type, opset).attributes and \
                (precision == "stash_type" or any(a.name == precision for a in node.attribute)):
            kept = [a for a in node.attribute if a.name != precision]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute(precision, onnx.TensorProto.DOUBLE)])
    outs = [o for o in node.output if o]
    model = helper.make_model(
        helper.make_graph([node], case.name, [], [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
                          initializer=inits),
        opset_imports=list(case.model.opset_import))
    values = run_numpy(model, {})
    floats = [o for o in outs if np.asarray(values[o]).dtype == np.float64]
    rng = np.random.default_rng(1)
    g = model.graph
    del g.output[:]
    for i, name in enumerate(floats):
        g.initializer.append(numpy_helper.from_array(rng.standard_normal(np.shape(values[name])), f"c{i}"))
        g.node.extend([helper.make_node("Mul", [name, f"c{i}"], [f"p{i}"]),
                       helper.make_node("ReduceSum", [f"p{i}"], [f"s{i}"], keepdims=0)])
    g.node.append(helper.make_node("Sum", [f"s{i}" for i in range(len(floats))], ["sum_of_outputs"]))
    g.output.append(helper.make_tensor_value_info("sum_of_outputs", onnx.TensorProto.DOUBLE, []))
    return model, params, floats


def _check(case) -> str | None:
    """None when the gradient matches (or the configuration is refused with a clear error)."""
    model, params, floats = _float64_model(case)
    if not params or not floats:
        return None  # nothing differentiable: integer inputs or outputs only
    node = case.model.graph.node[0]
    # inputs whose gradient a rule leaves out by convention (the rules' docs): not compared
    params = [p for p in params if list(node.input).index(p) not in NO_GRADIENT.get(node.op_type, ())]
    data = [p for p in params if list(node.input).index(p) not in SETTING_INPUTS.get(node.op_type, ())]
    for wrt in (params, data):  # a rule may refuse a setting input: check the data inputs then
        try:
            proto = gc.Model(gradient_model(ir.serde.deserialize_model(model), "sum_of_outputs", wrt)).proto
            break
        except gc.GraphError as exc:
            error = exc
    else:
        return None if node.op_type in str(error) else f"refused without naming {node.op_type}: {error}"
    params = wrt
    grads = run_numpy(proto, {})
    base = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng, eps, bad = np.random.default_rng(2), 1e-6, []
    for name in params:
        direction = rng.standard_normal(base[name].shape)
        plus = run_numpy(proto, {name: base[name] + eps * direction})["sum_of_outputs"]
        minus = run_numpy(proto, {name: base[name] - eps * direction})["sum_of_outputs"]
        numeric = (plus - minus) / (2 * eps)
        analytic = float(np.sum(grads[f"{name}_grad"] * direction))
        if not np.isclose(analytic, numeric, rtol=1e-4, atol=1e-6):
            bad.append(f"d loss/d {name}: {analytic:.6g} vs finite differences {numeric:.6g}")
    return "; ".join(bad) or None


@pytest.mark.parametrize("op_type", sorted(RULES) + FUNCTION_OPS + sorted(UNROLLED))
def test_node_case_gradients_match_finite_differences(op_type):
    cases = [c for c in _cases_by_op().get(op_type, []) if c.name not in NOT_DIFFERENTIABLE]
    if not cases:
        pytest.skip(f"onnx ships no one-node case for {op_type} that can be differentiated here")
    with np.errstate(all="ignore"):
        problems = [f"{c.name}: {p}" for c in cases if (p := _check(c)) is not None]
    assert not problems, "\n".join(problems)


def test_not_differentiable_list_is_current():
    """Every listed case exists and still fails the check (a fixed rule or changed data must
    take it off the list)."""
    by_name = {c.name: c for cases in _cases_by_op().values() for c in cases}
    assert set(NOT_DIFFERENTIABLE) <= set(by_name)
    with np.errstate(all="ignore"):
        assert all(_check(by_name[name]) is not None for name in NOT_DIFFERENTIABLE)
