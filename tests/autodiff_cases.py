"""The gradient-check case table: one or more one-node models per rule in ``RULES``.

Each case builds a model whose float tensors are initializers (so ``gradient_model`` with its
default ``wrt`` differentiates all of them) and whose loss is ``sum(Y_i * C_i)`` over the
node's outputs with fixed random ``C_i`` (the dot-product test of a VJP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

# domains of random float inputs
NORMAL, POSITIVE, AWAY, WIDE = "normal", "positive", "away", "wide"  # AWAY: |x| in [0.5, 1.5]; WIDE: 4 x NORMAL
UNIT, ABOVE_ONE = "unit", "above_one"  # UNIT: |x| < 0.9 (asin, acos, atanh); ABOVE_ONE: x in [1.2, 3] (acosh)
SPARSE = "sparse"  # NORMAL with every third element exactly 0 (products with zeros)
GRID = "grid"  # uniform in [-1.15, 1.15]: GridSample coordinates, a few outside the image
WIDE_GRID = "wide_grid"  # uniform in [-3.5, 3.5]: coordinates mirrored or clamped several times over


@dataclass
class T:
    """A float tensor input (differentiated), drawn from ``domain``."""
    shape: tuple
    domain: str = NORMAL


@dataclass
class Seq:
    """A sequence input: ``SequenceConstruct`` of float tensors (each differentiated, named
    ``in<i>_<j>``), or with ``sizes`` one float tensor split by ``SplitToSequence`` into parts of
    ``sizes`` along axis 0, the sizes fed at run time, so the count is known only then."""
    items: tuple
    sizes: tuple = ()


@dataclass
class Fed:
    """An integer input fed at run time (a graph input, not a constant): sequence positions and
    split sizes that ``lower_sequences`` cannot resolve before run time."""
    value: np.ndarray


@dataclass
class GradCase:
    op: str
    inputs: list  # T (float, differentiated), np.ndarray (constant, e.g. indices/axes), None (omitted)
    attrs: dict | Callable = field(default_factory=dict)  # or dtype -> dict
    n_out: int = 1
    opset: int = 21
    tag: str = ""
    use_outputs: tuple | None = None  # which outputs feed the loss (default: all)
    rtol: float = 1e-5  # finite-difference check tolerance
    ort: bool = True  # also check numpy vs onnxruntime (float32)
    captures: tuple = ()  # T inputs read by subgraphs only (named after the node inputs)
    seq_out: tuple = ()  # outputs that are sequences: the loss reads ConcatFromSequence(axis 0) of each
    full_check: bool = True  # onnx's full checker accepts the gradient graph (not where its inference miscounts)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.tag}" if self.tag else self.op


def draw(t: T, rng: np.random.Generator, dtype) -> np.ndarray:
    x = rng.standard_normal(t.shape)
    if t.domain == POSITIVE:
        x = rng.uniform(0.5, 2.0, t.shape)
    elif t.domain == WIDE:
        x = 4 * x
    elif t.domain == AWAY:
        x = rng.uniform(0.5, 1.5, t.shape) * rng.choice([-1.0, 1.0], t.shape)
    elif t.domain == GRID:
        x = rng.uniform(-1.15, 1.15, t.shape)
    elif t.domain == WIDE_GRID:
        x = rng.uniform(-3.5, 3.5, t.shape)
    elif t.domain == SPARSE:
        x.reshape(-1)[::3] = 0.0
    elif t.domain == UNIT:
        x = rng.uniform(-0.9, 0.9, t.shape)
    elif t.domain == ABOVE_ONE:
        x = rng.uniform(1.2, 3.0, t.shape)
    return np.asarray(x, dtype=dtype)


def param_names(case: GradCase) -> list[str]:
    """The names of the case's differentiated float tensors."""
    names = []
    for i, spec in enumerate([*case.inputs, *case.captures]):
        if isinstance(spec, T):
            names.append(f"in{i}")
        elif isinstance(spec, Seq):
            names.extend(f"in{i}_{j}" for j in range(len(spec.items)))
    return names


def feeds(case: GradCase) -> dict[str, np.ndarray]:
    """The run-time integer inputs of the case (``Fed`` values, ``Seq`` split sizes)."""
    out = {f"in{i}": np.asarray(spec.value) for i, spec in enumerate(case.inputs) if isinstance(spec, Fed)}
    out.update({f"in{i}_sizes": np.asarray(spec.sizes, np.int64) for i, spec in enumerate(case.inputs)
                if isinstance(spec, Seq) and spec.sizes})
    return out


def build(case: GradCase, dtype=np.float64, seed: int = 0) -> onnx.ModelProto:
    """The one-node model (no loss yet): inputs are initializers named in0, in1, ... (``Fed``
    values graph inputs, ``Seq`` inputs built by a node in front)."""
    rng = np.random.default_rng(seed)
    inits, names, front, fed = [], [], [], []
    for i, spec in enumerate(case.inputs):
        if spec is None:
            names.append("")
            continue
        if isinstance(spec, Fed | Seq):
            names.append(f"in{i}")
            front.extend(_runtime_input(f"in{i}", spec, rng, dtype, inits, fed))
            continue
        arr = draw(spec, rng, dtype) if isinstance(spec, T) else np.asarray(spec)
        if isinstance(spec, np.ndarray) and spec.dtype == np.float64:  # float32 stays (Resize scales)
            arr = spec.astype(dtype)
        inits.append(onnx.numpy_helper.from_array(arr, f"in{i}"))
        names.append(f"in{i}")
    outs = [f"y{i}" for i in range(case.n_out)]
    for j, spec in enumerate(case.captures):  # read by subgraphs, not node inputs
        inits.append(onnx.numpy_helper.from_array(draw(spec, rng, dtype), f"in{len(case.inputs) + j}"))
    attrs = case.attrs(dtype) if callable(case.attrs) else case.attrs
    node_outs = [f"seq{i}" if i in case.seq_out else o for i, o in enumerate(outs)]
    node = helper.make_node(case.op, names, node_outs, name=f"{case.op}_0", **attrs)
    back = [helper.make_node("ConcatFromSequence", [f"seq{i}"], [f"y{i}"], axis=0) for i in case.seq_out]
    graph = helper.make_graph([*front, node, *back], case.id, fed,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])


def _runtime_input(name: str, spec, rng, dtype, inits: list, fed: list) -> list:
    """The nodes making input ``name`` of a ``Fed`` or ``Seq`` spec; appends to ``inits`` and
    ``fed`` (graph inputs) what they read."""
    if isinstance(spec, Fed):
        fed.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(spec.value.dtype),
                                                 spec.value.shape))
        return []
    items = [f"{name}_{j}" for j in range(len(spec.items))]
    inits.extend(onnx.numpy_helper.from_array(draw(t, rng, dtype), n) for t, n in zip(spec.items, items))
    if not spec.sizes:
        return [helper.make_node("SequenceConstruct", items, [name])]
    fed.append(helper.make_tensor_value_info(f"{name}_sizes", onnx.TensorProto.INT64, [len(spec.sizes)]))
    return [helper.make_node("SplitToSequence", [items[0], f"{name}_sizes"], [name], axis=0)]


def with_loss(model: onnx.ModelProto, shapes: dict, case: GradCase, dtype, seed: int = 1) -> onnx.ModelProto:
    """Append loss = sum_i ReduceSum(y_i * c_i) for the used outputs; ``shapes`` gives y_i shapes."""
    rng = np.random.default_rng(seed)
    g = model.graph
    used = case.use_outputs if case.use_outputs is not None else range(case.n_out)
    terms = []
    for i in used:
        c = onnx.numpy_helper.from_array(rng.standard_normal(shapes[f"y{i}"]).astype(dtype), f"c{i}")
        g.initializer.append(c)
        g.node.append(helper.make_node("Mul", [f"y{i}", f"c{i}"], [f"p{i}"]))
        g.node.append(helper.make_node("ReduceSum", [f"p{i}"], [f"s{i}"], keepdims=0))
        terms.append(f"s{i}")
    g.node.append(helper.make_node("Sum", terms, ["loss"]))
    del g.output[:]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g.output.append(helper.make_tensor_value_info("loss", elem, []))
    return model


def i64(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def if_branches(dtype):
    """then: (tanh(in1 * in2), in1); else: (in1 + in2 * in1, in1 * 3); in1, in2 are outer values."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    three = onnx.numpy_helper.from_array(np.array(3.0, dtype=dtype), "three")

    def out(name):
        return helper.make_tensor_value_info(name, elem, None)

    then = helper.make_graph(
        [helper.make_node("Mul", ["in1", "in2"], ["t0"]), helper.make_node("Tanh", ["t0"], ["t1"])],
        "then", [], [out("t1"), out("in1")])
    other = helper.make_graph(
        [helper.make_node("Mul", ["in2", "in1"], ["e0"]), helper.make_node("Add", ["in1", "e0"], ["e1"]),
         helper.make_node("Mul", ["in1", "three"], ["e2"])],
        "else", [], [out("e1"), out("e2")], initializer=[three])
    return {"then_branch": then, "else_branch": other}


def loop_body(dtype):
    """carry c: c <- tanh(c * in3 + iter); scan output c * c (in3 is an outer value)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Cast", ["iter"], ["iter_f"], to=elem),
         helper.make_node("Mul", ["c", "in3"], ["m"]),
         helper.make_node("Add", ["m", "iter_f"], ["a"]),
         helper.make_node("Tanh", ["a"], ["c_next"]),
         helper.make_node("Mul", ["c_next", "c_next"], ["sq"])],
        "loop_body",
        [helper.make_tensor_value_info("iter", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("c", elem, [3, 4])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("c_next", elem, [3, 4]),
         helper.make_tensor_value_info("sq", elem, [3, 4])])
    return {"body": body}


def scan_body(dtype, **attrs):
    """state s, element x: s <- tanh(s + x * in2); output s * x (in2 is an outer value)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    body = helper.make_graph(
        [helper.make_node("Mul", ["x", "in2"], ["xw"]),
         helper.make_node("Add", ["s", "xw"], ["a"]),
         helper.make_node("Tanh", ["a"], ["s_next"]),
         helper.make_node("Mul", ["s_next", "x"], ["y"])],
        "scan_body",
        [helper.make_tensor_value_info("s", elem, [4]), helper.make_tensor_value_info("x", elem, [4])],
        [helper.make_tensor_value_info("s_next", elem, [4]), helper.make_tensor_value_info("y", elem, [4])])
    return {"body": body, "num_scan_inputs": 1, **attrs}


def _cases() -> list[GradCase]:
    c = GradCase
    cases = [
        # elementwise, with broadcasting
        c("Add", [T((3, 4)), T((4,))], tag="bcast"),
        c("Add", [T((2, 1, 4)), T((3, 1))], tag="bcast2"),
        c("Sub", [T((3, 4)), T((3, 1))]),
        c("Mul", [T((2, 3, 4)), T((1, 3, 1))]),
        c("Div", [T((3, 4)), T((4,), AWAY)]),
        c("Neg", [T((3, 4))]),
        c("Pow", [T((3, 4), POSITIVE), T((4,))]),
        c("Pow", [T((3, 4), POSITIVE), np.array(2.0)], tag="square"),
        c("Sqrt", [T((3, 4), POSITIVE)]),
        c("Exp", [T((3, 4))]),
        c("Log", [T((3, 4), POSITIVE)]),
        c("Abs", [T((3, 4), AWAY)]),
        c("Reciprocal", [T((3, 4), AWAY)]),
        c("Relu", [T((3, 4), AWAY)]),
        c("LeakyRelu", [T((3, 4), AWAY)], {"alpha": 0.1}),
        c("Sigmoid", [T((3, 4))]),
        c("Tanh", [T((3, 4))]),
        c("Erf", [T((3, 4))]),
        c("Gelu", [T((3, 4))], opset=20),
        c("Gelu", [T((3, 4))], {"approximate": "tanh"}, opset=20, tag="tanh"),
        c("Identity", [T((3, 4))]),
        c("Cast", [T((3, 4))], {"to": onnx.TensorProto.DOUBLE}, ort=False),
        c("CastLike", [T((3, 4)), np.zeros(2)], ort=False),
        c("Where", [np.array([[True, False, True, False]]), T((3, 4)), T((3, 1))]),
        c("Clip", [T((3, 4)), np.array(-0.5), np.array(0.5)], tag="const_bounds"),
        c("Clip", [T((3, 4)), T((), AWAY), None], tag="min_only"),
        c("Sum", [T((3, 4)), T((4,)), T((3, 1))]),
        c("Max", [T((3, 4)), T((4,))]),
        c("Min", [T((3, 4)), T((3, 1)), T((3, 4))]),
        c("Mean", [T((3, 4)), T((4,))]),
        c("Softplus", [T((3, 4))]),
        c("Elu", [T((3, 4), AWAY)], {"alpha": 0.7}),
        c("Selu", [T((3, 4), AWAY)]),
        c("HardSigmoid", [T((3, 4))], {"alpha": 0.3}),
        c("HardSwish", [T((4, 5), WIDE)]),
        c("PRelu", [T((3, 4), AWAY), T((4,))]),
        c("Sin", [T((3, 4))]),
        c("Hardmax", [T((3, 4))], {"axis": 1}),
        c("Cos", [T((3, 4))]),
        c("Tan", [T((3, 4), UNIT)]),
        c("Sinh", [T((3, 4))]),
        c("Cosh", [T((3, 4))]),
        c("Atan", [T((3, 4), WIDE)]),
        c("Asin", [T((3, 4), UNIT)]),
        c("Acos", [T((3, 4), UNIT)]),
        c("Atanh", [T((3, 4), UNIT)]),
        c("Asinh", [T((3, 4), WIDE)]),
        c("Acosh", [T((3, 4), ABOVE_ONE)]),
        c("Mod", [T((3, 4), WIDE), T((3, 4), AWAY)], {"fmod": 1}, tag="fmod"),
        c("Mod", [T((3, 4), WIDE), T((4,), AWAY)], {"fmod": 0}, tag="floor_broadcast",
          ort=False),  # onnxruntime runs float Mod only with fmod=1
        c("Softsign", [T((3, 4))]),
        c("ThresholdedRelu", [T((3, 4), AWAY)], {"alpha": 0.2}),
        c("Floor", [T((3, 4))]),
        c("Ceil", [T((3, 4))]),
        c("Round", [T((3, 4))]),
        c("Sign", [T((3, 4))]),
        # linear algebra
        c("MatMul", [T((3, 4)), T((4, 5))]),
        c("MatMul", [T((2, 3, 4)), T((4, 5))], tag="batched_weight"),
        c("MatMul", [T((2, 1, 3, 4)), T((3, 4, 2))], tag="broadcast"),
        c("MatMul", [T((4,)), T((2, 4, 3))], tag="vec_left"),
        c("MatMul", [T((2, 3, 4)), T((4,))], tag="vec_right"),
        c("MatMul", [T((4,)), T((4,))], tag="dot"),
        c("Gemm", [T((3, 4)), T((4, 5)), T((5,))]),
        c("Gemm", [T((4, 3)), T((5, 4)), T((3, 1))], {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3}, tag="tt"),
        c("Gemm", [T((4, 3)), T((4, 5))], {"transA": 1}, tag="ta"),
        c("Gemm", [T((3, 4)), T((5, 4)), T(())], {"transB": 1, "alpha": 2.0}, tag="tb"),
        c("Einsum", [T((3, 4)), T((4, 5))], {"equation": "ij,jk->ik"}),
        c("Einsum", [T((2, 3, 4)), T((2, 4, 5))], {"equation": "bij,bjk->bik"}, tag="batched"),
        c("Einsum", [T((3, 4))], {"equation": "ij->ji"}, tag="transpose"),
        c("Einsum", [T((3, 4)), T((3, 4))], {"equation": "ij,ij->i"}, tag="rowdot"),
        c("Einsum", [T((3,)), T((4,))], {"equation": "i,j->ij"}, tag="outer"),
        c("Einsum", [T((3, 4)), T((5,))], {"equation": "ij,k->i"}, tag="summed_away"),
        c("Einsum", [T((3, 4)), T((4, 5))], {"equation": "ij,jk"}, tag="implicit"),
        c("Einsum", [T((2, 3, 4)), T((4, 5))], {"equation": "...ij,jk->...ik"}, tag="ellipsis"),
        c("Einsum", [T((1, 3, 4)), T((2, 4, 5))], {"equation": "...ij,...jk->...ik"}, tag="ellipsis_broadcast"),
        c("Einsum", [T((2, 3, 4)), T((2, 4, 5))], {"equation": "...ij,...jk"}, tag="ellipsis_implicit"),
        c("Einsum", [T((2, 3, 4)), T((2, 4))], {"equation": "...ij,...j->...i"}, tag="ellipsis_matvec"),
        # a labelled dim of 1 broadcast against a larger one, as numpy does (onnx's inference keeps the 1)
        c("Einsum", [T((1, 2, 3)), T((2, 3, 2))], {"equation": "bij,bjk->bki"}, tag="label_broadcast",
          full_check=False),
        c("Einsum", [T((2, 1)), T((3, 4))], {"equation": "ij,kj->ik"}, tag="label_broadcast_summed",
          full_check=False),
        c("Einsum", [T((2, 1)), T((2, 3))], {"equation": "ij,ij->ij"}, tag="label_broadcast_kept", full_check=False),
        # diagonals: a letter repeated within one operand (read through identity matrices)
        c("Einsum", [T((3, 3))], {"equation": "ii->i"}, tag="diagonal"),
        c("Einsum", [T((3, 3))], {"equation": "ii"}, tag="trace_implicit"),
        c("Einsum", [T((3, 2, 3))], {"equation": "iji->j"}, tag="diagonal_apart"),
        c("Einsum", [T((2, 2, 3)), T((3,))], {"equation": "iij,j->i"}, tag="diagonal_contracted"),
        c("Einsum", [T((3, 3, 3))], {"equation": "iii->i"}, tag="diagonal_of_three"),
        c("Einsum", [T((3, 2, 4, 3))], {"equation": "i...i->..."}, tag="diagonal_around_ellipsis"),
        # reductions and softmax
        c("ReduceSum", [T((2, 3, 4)), i64(1)], {"keepdims": 0}),
        c("ReduceSum", [T((2, 3, 4))], {"keepdims": 1}, tag="all"),
        c("ReduceSum", [T((2, 3, 4))], {"axes": [0, 2], "keepdims": 0}, opset=11, tag="opset11"),
        c("ReduceMean", [T((2, 3, 4)), i64(-1, 0)], {"keepdims": 0}),
        c("ReduceProd", [T((3, 4)), i64(1)], {"keepdims": 0}, opset=18),
        c("ReduceProd", [T((3, 4), SPARSE)], {"keepdims": 1}, opset=18, tag="zeros_all_axes"),
        c("ReduceProd", [T((3, 4), SPARSE), i64(1)], opset=18, tag="one_zero_per_row"),  # rows 1, 2: one zero
        c("ReduceProd", [T((2, 3, 4), SPARSE), i64(0, 2)], opset=18, tag="zeros_two_axes"),
        c("ReduceMean", [T((2, 3, 4))], {"axes": [1], "keepdims": 1}, opset=17, tag="opset17"),
        c("ReduceL2", [T((3, 4))], {"axes": [1], "keepdims": 0}, opset=11, tag="opset11"),
        c("LpNormalization", [T((3, 4))], {"p": 2, "axis": 1}, opset=11, tag="opset11"),
        c("CumProd", [T((3, 5), SPARSE), i64(1)], opset=26, tag="zeros"),
        c("CumProd", [T((4, 3), SPARSE), i64(0)], {"exclusive": 1}, opset=26, tag="exclusive"),
        c("CumProd", [T((2, 4, 3)), i64(-2)], {"reverse": 1}, opset=26, tag="reverse"),
        c("CumProd", [T((2, 5, 2), SPARSE), i64(1)], {"reverse": 1, "exclusive": 1}, opset=26,
          tag="reverse_exclusive"),
        c("ReduceMax", [T((2, 3, 4)), i64(1)], {"keepdims": 0}),
        c("ReduceMin", [T((2, 3, 4))], {"keepdims": 1}),
        c("ReduceMax", [T((2, 3, 4))], {"axes": [-1], "keepdims": 0}, opset=17, tag="opset17"),
        c("ReduceL2", [T((2, 3, 4))], {"axes": [0, 1], "keepdims": 1}, opset=13, tag="opset13"),
        c("ReduceSumSquare", [T((2, 3, 4)), i64(2)], {"keepdims": 0}),
        c("ReduceL2", [T((2, 3, 4)), i64(1)], {"keepdims": 0}),
        c("ReduceLogSumExp", [T((2, 3, 4)), i64(0, 2)], {"keepdims": 1}),
        # rules, not function bodies (which ONNX gives them from opset 18 only)
        c("ReduceL1", [T((2, 3, 4), AWAY)], {"axes": [1], "keepdims": 0}, opset=13, tag="opset13"),
        c("ReduceL1", [T((2, 3, 4), AWAY)], {"keepdims": 1}, opset=17, tag="all"),
        c("ReduceL1", [T((2, 3, 4), AWAY), np.zeros(0, np.int64)], {"noop_with_empty_axes": 1}, opset=18, tag="noop"),
        c("ReduceLogSum", [T((2, 3, 4), POSITIVE)], {"axes": [0, -1], "keepdims": 0}, opset=13, tag="opset13"),
        c("ReduceLogSum", [T((2, 3, 4), POSITIVE), i64(1)], opset=18),
        c("ReduceLogSum", [T((2, 3, 4), POSITIVE), np.zeros(0, np.int64)], {"noop_with_empty_axes": 1}, opset=18,
          tag="noop"),
        # axes fed at run time: keepdims=0 unsqueezes dy back at them; empty ones follow noop_with_empty_axes
        c("ReduceSum", [T((2, 3, 4)), Fed(i64(-1, 0))], {"keepdims": 0}, tag="fed_axes"),
        c("ReduceMean", [T((2, 3, 4)), Fed(i64(1))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceMax", [T((2, 3, 4)), Fed(i64(2, 0))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceMin", [T((2, 3, 4)), Fed(i64(-2))], {"keepdims": 1}, opset=18, tag="fed_axes"),
        c("ReduceMax", [T((2, 3, 4)), Fed(np.zeros(0, np.int64))], {"keepdims": 0, "noop_with_empty_axes": 1},
          opset=18, tag="fed_empty_axes_noop"),
        c("ReduceMin", [T((2, 3, 4)), Fed(np.zeros(0, np.int64))], {"keepdims": 0}, opset=18, tag="fed_empty_axes"),
        c("ReduceProd", [T((2, 3, 4), SPARSE), Fed(i64(0, 2))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceProd", [T((2, 3, 4), SPARSE), Fed(np.zeros(0, np.int64))], {"keepdims": 0, "noop_with_empty_axes": 1},
          opset=18, tag="fed_empty_axes_noop"),
        c("ReduceL1", [T((2, 3, 4), AWAY), Fed(i64(1))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceL2", [T((2, 3, 4)), Fed(i64(-1))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceLogSum", [T((2, 3, 4), POSITIVE), Fed(i64(0, 1))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceLogSumExp", [T((2, 3, 4)), Fed(i64(1))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("ReduceSumSquare", [T((2, 3, 4)), Fed(i64(0))], {"keepdims": 0}, opset=18, tag="fed_axes"),
        c("Softmax", [T((2, 3, 4))], {"axis": 1}),
        c("Softmax", [T((2, 3, 4))], {"axis": 1}, opset=11, tag="opset11"),
        c("LogSoftmax", [T((3, 5))]),
        c("GlobalAveragePool", [T((2, 3, 4, 5))]),
        c("GlobalMaxPool", [T((2, 3, 4, 5))]),
        c("GlobalLpPool", [T((2, 3, 4, 5))]),
        c("GlobalLpPool", [T((2, 2, 3, 4), AWAY)], {"p": 3}, tag="p3"),
        c("GlobalLpPool", [T((2, 3, 5), AWAY)], {"p": 1}, tag="p1_1d"),
        # shapes
        c("Reshape", [T((2, 3, 4)), i64(6, -1)]),
        c("Flatten", [T((2, 3, 4))], {"axis": 2}),
        c("Transpose", [T((2, 3, 4))], {"perm": [1, 2, 0]}),
        c("Transpose", [T((2, 3, 4))], tag="default"),
        c("Squeeze", [T((2, 1, 4)), i64(1)]),
        c("Squeeze", [T((2, 1, 4))], {"axes": [1]}, opset=11, tag="opset11"),
        c("Unsqueeze", [T((2, 4)), i64(0, 3)]),
        c("Expand", [T((3, 1)), i64(2, 3, 4)]),
        c("Concat", [T((2, 3)), T((2, 1)), T((2, 2))], {"axis": 1}),
        c("Concat", [T((2, 3)), T((1, 3))], {"axis": 0}, opset=11, tag="opset11"),
        c("Split", [T((5, 3)), i64(2, 3)], {"axis": 0}, n_out=2),
        c("Split", [T((4, 6))], {"axis": 1, "num_outputs": 3}, n_out=3, opset=18, use_outputs=(0, 2), tag="unused"),
        c("Slice", [T((4, 5)), i64(1, -4), i64(3, 100), i64(0, 1)]),
        c("Slice", [T((4, 6)), i64(3, 0), i64(0, 6), i64(0, 1), i64(-2, 2)], tag="steps"),
        c("Gather", [T((5, 3)), i64(0, 2, 2, -1)], {"axis": 0}, tag="embedding"),
        c("Gather", [T((2, 4, 3)), np.array([[1, 3], [0, 1]], dtype=np.int64)], {"axis": 1}, tag="axis1"),
        c("Gather", [T((2, 4)), np.array(2, dtype=np.int64)], {"axis": 1}, tag="scalar"),
        c("GatherElements", [T((3, 4)), np.array([[0, 2], [1, 1], [3, 0]], dtype=np.int64)], {"axis": 1}),
        c("GatherND", [T((3, 4, 2)), np.array([[1, 2], [1, 2], [0, 3]], dtype=np.int64)], tag="repeated_tuples"),
        c("GatherND", [T((3, 4)), np.array([[[2]], [[0]]], dtype=np.int64)], tag="slices"),
        c("GatherND", [T((2, 3, 4)), np.array([[[1, 3], [2, 0]], [[0, 0], [1, 1]]], dtype=np.int64)], {"batch_dims": 1},
          tag="batch_dims"),
        c("GatherND", [T((3, 4, 2)), np.array([[-1, 2], [2, -4], [-1, 2]], dtype=np.int64)], tag="negative"),
        c("GatherND", [T((2, 3, 4, 2)), np.array([[[1, 3]], [[2, 0]]], dtype=np.int64)], {"batch_dims": 1},
          tag="rows"),
        # empty tuples: every one names all of data (with batch_dims, all of its batch's slice)
        c("GatherND", [T((2, 3)), np.zeros((2, 2, 0), dtype=np.int64)], tag="empty_tuples"),
        c("GatherND", [T((2, 3, 4)), np.zeros((2, 3, 0), dtype=np.int64)], {"batch_dims": 1},
          tag="empty_tuples_batch_dims"),
        c("Gather", [T((2, 5, 3)), np.array([[4, -1], [0, 4]], dtype=np.int32)], {"axis": 1}, tag="int32_negative"),
        # each position once (a layout change): the gradient gathers dy back by the inverse
        c("Gather", [T((2, 6, 3)), np.array([[4, -1], [0, 2], [1, 3]], dtype=np.int64)], {"axis": 1},
          tag="permutation"),
        c("Gather", [T((5, 3)), np.array([3, 0, 4, 2, 1], dtype=np.int32)], tag="permutation_rows"),
        c("Col2Im", [T((1, 6, 12)), i64(4, 5), i64(1, 3)], {"strides": [1, 2], "pads": [0, 1, 0, 2]}, opset=18),
        c("Col2Im", [T((2, 8, 6)), i64(4, 3), i64(2, 2)], {"dilations": [2, 1], "strides": [1, 1], "pads": [1, 0, 0, 0]},
          opset=18, tag="dilated"),
        c("ScatterElements", [T((3, 4)), np.array([[1, 0, 2, 0]]), T((1, 4))], {"axis": 0}),
        c("ScatterElements", [T((3, 4)), np.array([[1, 1], [0, 3], [2, 2]]), T((3, 2))],
          {"axis": 1, "reduction": "add"}, tag="add_duplicates"),
        c("ScatterND", [T((4, 3)), np.array([[1], [3]]), T((2, 3))]),
        c("ScatterND", [T((4, 3)), np.array([[1, 2], [1, 2], [0, 0]]), T((3,))], {"reduction": "add"},
          tag="add_duplicates"),
        # updates 0 at (0, 0), (1, 0) (both to data[1, 0]: two zeros) and (2, 0) (alone at data[0, 0])
        c("ScatterElements", [T((3, 3)), np.array([[1, 0, 2], [1, 2, 2], [0, 1, 2]]), T((3, 3), SPARSE)],
          {"axis": 0, "reduction": "mul"}, tag="mul_zeros"),
        c("ScatterElements", [T((3, 4)), np.array([[1, 1], [0, 3], [2, 2]]), T((3, 2))],
          {"axis": 1, "reduction": "max"}, tag="max_duplicates"),
        c("ScatterElements", [T((3, 4)), np.array([[1, 1], [0, -1], [2, 2]]), T((3, 2))],
          {"axis": -1, "reduction": "min"}, tag="min_duplicates"),
        c("ScatterND", [T((4, 3)), np.array([[1], [3], [1]]), T((3, 3), SPARSE)], {"reduction": "mul"},
          tag="mul_rows"),
        c("ScatterND", [T((4, 3)), np.array([[1, 2], [1, 2], [0, 0]]), T((3,))], {"reduction": "max"},
          tag="max_duplicates"),
        c("ScatterND", [T((4, 3)), np.array([[-1], [3], [0]]), T((3, 3))], {"reduction": "min"},
          tag="min_rows"),
        c("OneHot", [np.array([0, 2, -1, 1]), np.array(3), T((2,))], tag="values"),
        c("OneHot", [np.array([[1, 0], [3, -2]]), np.array(4, np.int32), T((2,))], {"axis": 1}, tag="axis1"),
        c("Det", [T((3, 3))]),
        c("Det", [T((2, 4, 4))], tag="batched"),
        c("Det", [T((2, 1, 1))], tag="one_by_one"),
        c("CumSum", [T((3, 4)), np.array(1, dtype=np.int64)]),
        c("CumSum", [T((3, 4)), np.array(0, dtype=np.int64)], {"reverse": 1, "exclusive": 1}, tag="reverse_exclusive"),
        c("TopK", [T((3, 5)), i64(2)], {"axis": 1}, n_out=2, use_outputs=(0,)),
        c("Trilu", [T((2, 4, 4)), np.array(1, dtype=np.int64)], {"upper": 0}),
        c("Trilu", [T((3, 4))], tag="upper"),
        c("Pad", [T((2, 3)), i64(1, 0, 2, 3)]),
        c("Pad", [T((2, 3, 4)), i64(1, 2, 0, 3), np.array(0.5), i64(0, -1)], opset=18, tag="axes"),
        c("Pad", [T((1, 2, 4, 5)), i64(0, 0, 2, 1, 0, 0, 3, 2)], {"mode": "reflect"}, tag="reflect"),
        c("Pad", [T((2, 3, 4)), i64(0, 2, 3, 0, 1, 0)], {"mode": "edge"}, tag="edge"),
        c("DepthToSpace", [T((2, 8, 2, 3))], {"blocksize": 2}),
        c("DepthToSpace", [T((1, 18, 2, 2))], {"blocksize": 3, "mode": "CRD"}, tag="crd"),
        c("SpaceToDepth", [T((2, 3, 4, 6))], {"blocksize": 2}),
        c("SpaceToDepth", [T((1, 2, 6, 3))], {"blocksize": 3, "mode": "CRD"}, opset=28, ort=False, tag="crd"),
        c("Pad", [T((2, 3, 4)), i64(2, 5, 1, 3), None, i64(1, 2)], {"mode": "wrap"}, opset=19, tag="wrap"),
        # negative pads crop first, then wrap what is left
        c("Pad", [T((2, 4, 6)), i64(0, -1, 3, 0, 2, -2)], {"mode": "wrap"}, opset=19, tag="wrap_crop"),
        c("Pad", [T((2, 3, 5)), i64(-2, 1, 3, -1), None, i64(-1, -2)], {"mode": "wrap"}, opset=19,
          tag="wrap_crop_axes"),
        c("Pad", [T((2, 5, 4)), i64(0, -2, 1, 0, 1, -1), np.array(0.5)], tag="crop_and_pad"),
        c("Pad", [T((2, 3, 5))], {"mode": "reflect", "pads": [0, 1, 2, 0, 2, 1]}, opset=10, tag="opset10_reflect"),
        c("Tile", [T((2, 3)), i64(2, 1)]),
        # pads, repeats and shapes fed at run time
        c("Pad", [T((2, 3)), Fed(i64(1, 0, 2, 3)), np.array(0.5)], tag="fed_pads"),
        c("Pad", [T((2, 5, 4)), Fed(i64(-2, 1, 1, -1)), None, Fed(i64(1, 2))], opset=18, tag="fed_crop_axes"),
        c("Pad", [T((1, 2, 4, 5)), Fed(i64(0, 0, 2, 1, 0, 0, 3, 2))], {"mode": "reflect"}, tag="fed_reflect"),
        c("Pad", [T((2, 3, 4)), Fed(i64(0, 2, 3, 0, 1, 0))], {"mode": "edge"}, tag="fed_edge"),
        c("Pad", [T((2, 3, 4)), Fed(i64(2, 5, 1, 3)), None, Fed(i64(1, 2))], {"mode": "wrap"}, opset=19,
          tag="fed_wrap"),
        c("Pad", [T((2, 4, 6)), Fed(i64(0, -1, 3, 0, 2, -2))], {"mode": "wrap"}, opset=19, tag="fed_wrap_crop"),
        c("Tile", [T((2, 3)), Fed(i64(2, 3))], tag="fed_repeats"),
        c("Expand", [T((3, 1)), Fed(i64(2, 3, 4))], tag="fed_shape"),
        c("Resize", [T((1, 2, 2, 3)), None, np.array([1.0, 1.0, 2.0, 3.0], dtype=np.float32)],
          {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
        c("Resize", [T((1, 2, 3, 2)), None, None, i64(1, 2, 6, 6)], {"mode": "nearest"}, tag="sizes_half_pixel"),
        c("Resize", [T((1, 2, 3, 5)), None, None, i64(7, 6)], {"mode": "linear", "axes": [2, 3],
                                                               "keep_aspect_ratio_policy": "not_larger"},
          opset=18, tag="not_larger"),  # scale 6/5: [3, 5] -> [4, 6]
        c("Resize", [T((1, 2, 3, 5)), None, None, i64(7, 6)], {"mode": "cubic", "axes": [2, 3],
                                                               "keep_aspect_ratio_policy": "not_smaller"}, opset=18,
          tag="not_smaller_cubic"),  # scale 7/3: [3, 5] -> [7, 12]
        c("Resize", [T((1, 1, 3, 4)), None, np.array([1.0, 1.0, 1.7, 1.3], dtype=np.float32)],
          {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, opset=19,
          tag="align_corners_floored"),  # 3 * 1.7 = 5.1 -> 5 rows
        c("Resize", [T((2, 4, 3)), None, None, i64(5, 7)], {"mode": "nearest", "axes": [2, 1],
                                                         "keep_aspect_ratio_policy": "not_larger",
                                                         "coordinate_transformation_mode": "align_corners"},
          opset=18, tag="not_larger_nearest_align"),  # scale 5/3: [4, 3] -> [7, 5]
        # neural-network ops
        c("Dropout", [T((3, 4))], tag="inference"),
        c("Dropout", [T((3, 4)), np.array(0.3), np.array(True)], {"seed": 7}, ort=False, tag="training"),
        c("Dropout", [T((3, 4)), np.array(0.3), np.array(True)], {"seed": 7}, n_out=2, use_outputs=(0,),
          ort=False, tag="training_mask"),
        c("Conv", [T((2, 3, 5, 5)), T((4, 3, 3, 3)), T((4,))]),
        c("Conv", [T((1, 2, 6, 7)), T((3, 2, 3, 2))], {"strides": [2, 3], "pads": [1, 0, 2, 1]}, tag="strides_pads"),
        c("Conv", [T((1, 2, 7, 7)), T((2, 2, 2, 3))], {"dilations": [2, 1], "strides": [1, 2]}, tag="dilations"),
        c("Conv", [T((2, 4, 5, 5)), T((6, 2, 3, 3)), T((6,))], {"group": 2, "pads": [1, 1, 1, 1]}, tag="groups"),
        c("Conv", [T((2, 4, 6)), T((4, 1, 3))], {"group": 4, "strides": [2]}, tag="depthwise1d"),
        # depthwise, stride 1, 256+ output pixels: dW one kernel tap at a time
        c("Conv", [T((1, 3, 16, 16)), T((3, 1, 3, 3)), T((3,))], {"group": 3, "pads": [1, 1, 1, 1]}, tag="depthwise_taps"),
        c("Conv", [T((1, 2, 17, 18)), T((2, 1, 3, 2))], {"group": 2, "dilations": [1, 2], "pads": [1, 0, 0, 1]},
          tag="depthwise_taps_dilated"),
        # stride-1 grouped convs, as many output as input channels a group: dx is a Conv of dy by
        # the weight flipped in space, each group's channel axes swapped (depthwise always;
        # other groups from batch 8 and 16 pixels); pads past the kernel keep the ConvTranspose
        c("Conv", [T((2, 3, 9)), T((3, 1, 3))], {"group": 3, "pads": [2, 0]}, tag="depthwise_flipped_1d"),
        c("Conv", [T((1, 2, 4, 5, 3)), T((2, 1, 2, 3, 2)), T((2,))], {"group": 2, "pads": [1, 0, 1, 1, 2, 0]},
          tag="depthwise_flipped_3d"),
        c("Conv", [T((8, 4, 4, 5)), T((4, 2, 3, 3)), T((4,))], {"group": 2, "pads": [1, 0, 2, 1]}, tag="grouped_flipped"),
        c("Conv", [T((8, 6, 5, 4)), T((6, 3, 2, 3))], {"group": 2, "dilations": [2, 1], "pads": [2, 1, 0, 1]},
          tag="grouped_flipped_dilated"),
        c("Conv", [T((1, 2, 5, 5)), T((2, 1, 2, 2))], {"group": 2, "pads": [2, 0, 1, 2]}, tag="depthwise_pads_past_kernel"),
        # dense, stride 1, from batch 8 on maps of 256 pixels: dx by the flipped weight too
        c("Conv", [T((8, 2, 16, 16)), T((3, 2, 3, 3)), T((3,))], {"pads": [1, 0, 2, 1]}, tag="dense_flipped"),
        c("Conv", [T((8, 1, 16, 17)), T((2, 1, 3, 2))], {"dilations": [2, 1], "pads": [2, 1, 1, 0]},
          tag="dense_flipped_one_channel"),
        c("Conv", [T((8, 2, 300)), T((3, 2, 5)), T((3,))], {"pads": [2, 1]}, tag="dense_flipped_1d"),
        c("Conv", [T((8, 1, 7, 6, 7)), T((2, 1, 2, 2, 2))], {"pads": [1, 1, 0, 0, 1, 1]}, tag="dense_flipped_3d"),
        c("Conv", [T((1, 2, 5, 5)), T((2, 2, 3, 3))], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, tag="same_upper"),
        c("Conv", [T((1, 2, 4, 5, 3)), T((2, 2, 2, 3, 2)), T((2,))], {"pads": [1, 0, 1, 0, 1, 0]}, tag="3d"),
        c("Conv", [T((2, 3, 9)), T((2, 3, 3))], {"dilations": [2], "pads": [2, 1], "strides": [2]}, tag="1d"),
        # one input channel: the weight gradient takes the im2col + MatMul lowering
        # 1x1 convs: dW is one Einsum (x subsampled by the strides first)
        c("Conv", [T((2, 3, 4, 5)), T((4, 3, 1, 1)), T((4,))], tag="pointwise"),
        # the weight outweighs the activations: dx is one Gemm by the weight read transposed
        c("Conv", [T((3, 5, 2, 2)), T((4, 5, 1, 1)), T((4,))], tag="pointwise_tiny_map"),
        c("Conv", [T((2, 3, 4)), T((5, 3, 1))], tag="pointwise_tiny_map_1d"),
        c("Conv", [T((2, 3, 5, 6)), T((4, 3, 1, 1))], {"strides": [2, 3]}, tag="pointwise_strided"),
        # the weight outweighs the maps (Co*Ci > pixels*(Ci+Co)): dW is one Gemm, not a MatMul per image
        c("Conv", [T((2, 6, 2, 1)), T((7, 6, 1, 1)), T((7,))], tag="pointwise_wide"),
        c("Conv", [T((2, 8, 3, 4)), T((9, 8, 1, 1))], {"strides": [2, 2]}, tag="pointwise_wide_strided"),
        c("Conv", [T((2, 3, 7)), T((2, 3, 1))], {"strides": [2]}, tag="pointwise_1d"),
        # small maps: dx is a 1x1 Conv spread over the input grid with zeros (cut at odd sizes)
        c("Conv", [T((2, 3, 3, 4)), T((4, 3, 1, 1)), T((4,))], {"strides": [2, 3]}, tag="pointwise_strided_small"),
        c("Conv", [T((2, 3, 4, 4)), T((5, 3, 1, 1))], {"strides": [2, 2]}, tag="pointwise_strided_even"),
        c("Conv", [T((1, 2, 2, 3, 2)), T((3, 2, 1, 1, 1))], {"strides": [1, 2, 2]}, tag="pointwise_strided_3d"),
        c("Conv", [T((1, 2, 3, 4, 3)), T((3, 2, 1, 1, 1))], {"strides": [1, 2, 1]}, tag="pointwise_3d"),
        c("Conv", [T((2, 4, 3, 3)), T((4, 2, 1, 1))], {"group": 2}, tag="pointwise_groups"),
        # batch x pixels >= 256: dW is an im2col and one GEMM
        c("Conv", [T((2, 3, 12, 12)), T((4, 3, 3, 3)), T((4,))], {"pads": [1, 1, 1, 1]}, tag="im2col"),
        c("Conv", [T((2, 2, 24, 25)), T((3, 2, 3, 2))], {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 0, 1]},
          tag="im2col_strides_dilations"),
        c("Conv", [T((2, 2, 150)), T((3, 2, 5))], {"strides": [1], "pads": [2, 1]}, tag="im2col_1d"),
        c("Conv", [T((1, 2, 7, 8, 6)), T((2, 2, 2, 2, 2))], {"pads": [1, 0, 1, 0, 1, 0]}, tag="im2col_3d"),
        # more than 9 kernel taps: dW is the Conv over x with batch and channels swapped
        c("Conv", [T((2, 2, 11, 12)), T((3, 2, 5, 5))], {"strides": [2, 2], "pads": [2, 2, 1, 2]}, tag="many_taps"),
        c("Conv", [T((2, 1, 6, 6)), T((3, 1, 3, 3)), T((3,))], {"pads": [1, 1, 1, 1]}, tag="one_channel"),
        c("Conv", [T((2, 1, 7, 8)), T((2, 1, 2, 3))], {"strides": [2, 3], "dilations": [2, 1], "pads": [1, 0, 2, 1]},
          tag="one_channel_strides"),
        c("Conv", [T((2, 1, 5, 5)), T((2, 1, 3, 2))], {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
          tag="one_channel_same_lower"),
        c("Conv", [T((3, 1, 9)), T((2, 1, 3))], {"dilations": [2], "pads": [2, 1], "strides": [2]}, tag="one_channel_1d"),
        c("Conv", [T((1, 1, 4, 5, 3)), T((2, 1, 2, 3, 2))], {"pads": [1, 0, 1, 0, 1, 0]}, tag="one_channel_3d"),
        c("ConvTranspose", [T((2, 3, 4, 4)), T((3, 2, 3, 3)), T((2,))]),
        c("ConvTranspose", [T((1, 2, 4, 5)), T((2, 3, 3, 2))],
          {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 2], "dilations": [1, 2]}, tag="geometry"),
        c("ConvTranspose", [T((1, 4, 5)), T((4, 1, 3))], {"group": 4, "strides": [2]}, tag="depthwise"),
        c("ConvTranspose", [T((2, 4, 3, 3)), T((4, 3, 2, 2)), T((6,))], {"group": 2, "pads": [1, 0, 0, 0]},
          tag="groups"),
        # output_shape sets the pads: total = full size - output_shape, the odd one at the start
        c("ConvTranspose", [T((1, 2, 4, 5)), T((2, 3, 3, 2)), T((3,))], {"strides": [2, 3], "output_shape": [8, 14]},
          tag="output_shape"),
        c("ConvTranspose", [T((2, 2, 3, 4)), T((2, 2, 3, 3))],
          {"strides": [2, 2], "output_padding": [1, 0], "dilations": [1, 2], "output_shape": [7, 9]},
          tag="output_shape_dilated"),
        # auto_pad: SAME_* pads to input x strides, the odd pad at the end (UPPER) or start (LOWER)
        c("ConvTranspose", [T((1, 2, 4, 5)), T((2, 3, 3, 2)), T((3,))], {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
          tag="same_upper"),
        c("ConvTranspose", [T((2, 2, 4, 3)), T((2, 2, 3, 3))], {"strides": [2, 1], "dilations": [2, 1],
                                                               "auto_pad": "SAME_LOWER"}, tag="same_lower_dilated"),
        c("ConvTranspose", [T((1, 4, 5)), T((4, 1, 3))], {"group": 4, "strides": [2], "auto_pad": "SAME_UPPER"},
          tag="same_upper_depthwise"),
        c("ConvTranspose", [T((1, 2, 3, 4)), T((2, 3, 3, 3))], {"strides": [2, 2], "output_padding": [1, 0],
                                                               "auto_pad": "VALID"}, tag="valid"),
        c("ConvTranspose", [T((1, 2, 4, 4)), T((2, 2, 3, 3))],
          {"strides": [2, 2], "output_shape": [8, 7], "auto_pad": "SAME_UPPER"}, tag="output_shape_same_upper"),
        # pools with auto_pad SAME_* and dilations (onnxruntime 1.31 leaves the dilations out of SAME_*'s pads:
        # its output is smaller than ONNX's, [1, 2, 5, 5] for [1, 2, 7, 6] here; graphc's ort-cpu backend states
        # the pads, tests/test_pool_same_dilations.py, but the check here runs a bare onnxruntime session)
        c("MaxPool", [T((1, 2, 5, 6))], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
          tag="same_upper"),
        c("MaxPool", [T((1, 2, 7, 6))], {"kernel_shape": [3, 2], "dilations": [2, 2], "auto_pad": "SAME_LOWER"},
          tag="same_lower_dilated", ort=False),
        c("AveragePool", [T((1, 2, 5, 6))], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
          tag="same_lower"),
        c("AveragePool", [T((1, 2, 7, 6))], {"kernel_shape": [3, 2], "dilations": [2, 2], "auto_pad": "SAME_UPPER"},
          opset=19, tag="same_upper_dilated", ort=False),
        c("LpPool", [T((1, 2, 5, 6), AWAY)], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
          tag="same_upper"),
        c("LpPool", [T((1, 2, 7, 6), AWAY)], {"kernel_shape": [3, 2], "dilations": [2, 1], "auto_pad": "SAME_LOWER"},
          opset=18, tag="same_lower_dilated", ort=False),
        c("MaxPool", [T((2, 3, 4, 4))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        c("MaxPool", [T((1, 2, 9))], {"kernel_shape": [3], "strides": [2], "dilations": [2], "pads": [1, 1]},
          tag="1d_dilated"),
        c("AveragePool", [T((2, 2, 7))], {"kernel_shape": [3], "strides": [2]}, tag="1d"),
        c("MaxPool", [T((1, 2, 5, 5))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, n_out=2,
          use_outputs=(0,), tag="overlap_indices"),
        c("MaxPool", [T((2, 2, 5, 4))], {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "storage_order": 1}, n_out=2,
          use_outputs=(0,), tag="column_major_indices"),
        c("AveragePool", [T((2, 3, 4, 4))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        c("LpPool", [T((2, 2, 5, 5), AWAY)], {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": 3}),
        c("AveragePool", [T((2, 2, 5, 7))], {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
          tag="ceil"),
        c("AveragePool", [T((1, 2, 5, 5))], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0],
                                             "ceil_mode": 1, "count_include_pad": 1}, tag="ceil_pads_counted"),
        c("AveragePool", [T((1, 2, 5, 5))], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
          tag="exclude_pad"),
        c("AveragePool", [T((1, 2, 5, 5))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
          tag="include_pad"),
        c("BatchNormalization", [T((4, 3, 2, 2)), T((3,)), T((3,)), T((3,)), T((3,), POSITIVE)],
          {"training_mode": 1}, n_out=3, use_outputs=(0,), tag="training"),
        c("BatchNormalization", [T((4, 3)), T((3,)), T((3,)), T((3,)), T((3,), POSITIVE)], tag="inference"),
        c("LayerNormalization", [T((2, 3, 4)), T((4,)), T((4,))]),
        c("LayerNormalization", [T((2, 3, 4)), T((3, 4))], {"axis": 1, "epsilon": 1e-3}, tag="axis1"),
        # the loss on the statistics: on Mean alone (dmean / n spread over each group), on both.
        # stash_type 0 (computed in x's dtype, as the numpy backend does; onnx's inference leaves
        # them untyped and its full checker refuses the type 0)
        c("LayerNormalization", [T((2, 3, 4)), T((4,)), T((4,))], {"stash_type": 0}, n_out=3, use_outputs=(1,),
          tag="stash0_mean_only", full_check=False),
        c("LayerNormalization", [T((2, 3, 4, 2)), T((4, 2)), T((4, 2))], {"axis": -2, "stash_type": 0}, n_out=3,
          use_outputs=(1, 2), tag="stash0_stats", full_check=False),
        c("InstanceNormalization", [T((2, 3, 4, 2)), T((3,)), T((3,))], {"epsilon": 1e-3}),
        c("LRN", [T((2, 5, 3, 3))], {"size": 3, "alpha": 0.5, "beta": 0.75, "bias": 1.5}),
        c("LpNormalization", [T((3, 4))], {"p": 2, "axis": 1}),
        c("GridSample", [T((2, 3, 4, 5)), T((2, 3, 6, 2), GRID)], {"mode": "linear"}, opset=22),
        c("GridSample", [T((1, 2, 3, 4)), T((1, 5, 2, 2), GRID)], {"mode": "linear", "align_corners": 1,
                                                                  "padding_mode": "border"}, opset=22, tag="border"),
        c("GridSample", [T((1, 2, 3, 4)), T((1, 5, 2, 2), GRID)], {"mode": "nearest"}, opset=22, tag="nearest"),
        c("GridSample", [T((1, 2, 3, 4)), T((1, 5, 2, 2), WIDE_GRID)], {"padding_mode": "reflection"}, opset=22,
          tag="reflection"),
        c("GridSample", [T((1, 2, 3, 4)), T((1, 5, 2, 2), WIDE_GRID)], {"padding_mode": "reflection", "align_corners": 1},
          opset=22, tag="reflection_align_corners"),
        c("GridSample", [T((2, 2, 3, 4, 3)), T((2, 2, 3, 2, 3), GRID)], opset=22, tag="3d"),
        c("GridSample", [T((1, 2, 2, 3, 4)), T((1, 3, 2, 2, 3), WIDE_GRID)], {"padding_mode": "border",
                                                                           "align_corners": 1}, opset=22, tag="3d_border"),
        c("GridSample", [T((1, 2, 2, 3, 4)), T((1, 3, 2, 2, 3), WIDE_GRID)], {"padding_mode": "reflection"}, opset=22,
          tag="3d_reflection"),
        c("GridSample", [T((1, 2, 2, 3, 4)), T((1, 3, 2, 2, 3), GRID)], {"mode": "nearest"}, opset=22,
          tag="3d_nearest"),
        c("GridSample", [T((2, 2, 4, 5)), T((2, 3, 2, 2), GRID)], {"mode": "cubic"}, opset=22, tag="cubic"),
        c("GridSample", [T((1, 2, 4, 3)), T((1, 3, 3, 2), WIDE_GRID)], {"mode": "cubic", "padding_mode": "border",
                                                                     "align_corners": 1}, opset=22, tag="cubic_border"),
        c("GridSample", [T((1, 2, 4, 3)), T((1, 3, 3, 2), WIDE_GRID)], {"mode": "cubic", "padding_mode": "reflection"},
          opset=22, tag="cubic_reflection"),
        c("GridSample", [T((1, 2, 3, 4)), T((1, 5, 2, 2), WIDE_GRID)], {"mode": "bilinear", "padding_mode": "border"},
          opset=16, tag="opset16_border"),
        c("LpNormalization", [T((2, 3, 4), AWAY)], {"p": 1, "axis": 0}, tag="p1"),
        c("LRN", [T((1, 4, 5))], {"size": 4, "alpha": 1.0, "beta": 0.5}, tag="even_size_1d",
          ort=False),  # onnxruntime takes odd sizes only
        c("GroupNormalization", [T((2, 4, 3)), T((4,)), T((4,))], {"num_groups": 2}),
        c("GroupNormalization", [T((2, 6, 2, 2)), T((6,)), T((6,))], {"num_groups": 3, "epsilon": 1e-2}, tag="4d"),
        # fused losses
        c("SoftmaxCrossEntropyLoss", [T((4, 3)), i64(0, 2, 1, 2)]),
        c("SoftmaxCrossEntropyLoss", [T((4, 3, 2)), np.array([[0, 2], [1, -1], [2, 2], [0, 1]]),
                                     np.array([0.5, 1.0, 2.0])],
          {"ignore_index": -1}, n_out=2, tag="weights_ignore_logprob"),
        c("SoftmaxCrossEntropyLoss", [T((4, 3)), i64(0, 2, 1, 2)], {"reduction": "none"}, tag="none"),
        c("SoftmaxCrossEntropyLoss", [T((4, 3)), i64(0, 2, 1, 2)], opset=13, tag="one_hot"),  # no add-scatter
        c("NegativeLogLikelihoodLoss", [T((4, 3)), i64(0, 2, 1, 2)], {"reduction": "sum"}),
        c("NegativeLogLikelihoodLoss", [T((4, 3)), i64(0, 2, 1, -1), np.array([0.5, 1.0, 2.0])],
          {"ignore_index": -1}, tag="weights_ignore"),
        # control flow: the branches read in1 and in2 from the outer graph
        c("If", [np.array(True)], if_branches, n_out=2, captures=(T((3, 4)), T((4,))), tag="then"),
        c("If", [np.array(False)], if_branches, n_out=2, captures=(T((3, 4)), T((4,))), tag="else"),
        c("Loop", [np.array(3, dtype=np.int64), None, T((3, 4))], loop_body, n_out=2, captures=(T((4,)),)),
        c("Scan", [T((4,)), T((5, 4))], scan_body, n_out=2, captures=(T((4,)),)),
        # sequences whose length is known at run time only (rules_sequence.py)
        c("SequenceConstruct", [T((2, 3)), T((1, 3))], seq_out=(0,)),
        c("SequenceAt", [Seq((T((2, 3)), T((1, 3)), T((3, 3)))), Fed(np.array(1))], opset=17),
        c("SequenceAt", [Seq((T((6, 3)),), (2, 1, 3)), Fed(np.array(-1, np.int32))], opset=17, tag="split_negative"),
        c("SequenceInsert", [Seq((T((5, 3)),), (2, 3)), T((1, 3)), Fed(np.array(1))], seq_out=(0,), opset=17),
        c("SequenceInsert", [Seq((T((5, 3)),), (2, 3)), T((1, 3)), Fed(np.array(-2))], seq_out=(0,), opset=17,
          tag="negative"),
        c("SequenceInsert", [Seq((T((5, 3)),), (2, 3)), T((4, 3))], seq_out=(0,), opset=17, tag="append"),
        c("SequenceErase", [Seq((T((6, 3)),), (2, 1, 3)), Fed(np.array(-2))], seq_out=(0,), opset=17),
        c("SequenceErase", [Seq((T((6, 3)),), (2, 1, 3))], seq_out=(0,), opset=17, tag="last"),
        c("SplitToSequence", [T((5, 3)), Fed(np.array([2, 3]))], seq_out=(0,), opset=17),
        c("SplitToSequence", [T((5, 3)), Fed(np.array(2))], seq_out=(0,), opset=17, tag="chunks"),
        c("SplitToSequence", [T((3, 4))], {"axis": 1, "keepdims": 0}, seq_out=(0,), opset=17, tag="squeezed"),
        c("ConcatFromSequence", [Seq((T((6, 3)),), (2, 1, 3))], {"axis": 0}, opset=17),
        c("ConcatFromSequence", [Seq((T((6, 3)),), (2, 2, 2))], {"axis": -1, "new_axis": 1}, opset=17,
          tag="new_axis"),
        c("Scan", [T((4,)), T((4, 5))], lambda dt: scan_body(
            dt, scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1]),
          n_out=2, captures=(T((4,)),), tag="axes_reverse"),
    ]
    return cases


CASES: list[GradCase] = _cases()
