# Over 500 lines: level 2's algebraic rewrites, each a small rule or pass with its soundness
# argument in its docstring; they form one level's list and share the shape helpers below.
"""Level 2's algebraic simplifications and MatMul/Transpose -> Gemm rewrites."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase
from onnxscript.rewriter.rules import common as library_rules

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.optimize.rules import RulePass, int64_initializer
from graphc.passes.optimize.shape_folding import same_shape
from graphc.passes.values import const_axes, fixed_array

__all__ = ["BatchedMatMulAddToGemm", "ExpandIntoBroadcast", "NeutralOperandElimination", "ReshapeAbsorbsUnsqueeze",
           "ReshapeThroughElementwise", "algebraic_pass", "gemm_pass"]

DT = ir.DataType
# Casts that every value of the source type survives exactly (so casting back recovers it).
_LOSSLESS = {
    DT.BOOL: {DT.INT8, DT.UINT8, DT.INT16, DT.INT32, DT.INT64, DT.FLOAT16, DT.FLOAT, DT.DOUBLE},
    DT.FLOAT16: {DT.FLOAT, DT.DOUBLE},
    DT.BFLOAT16: {DT.FLOAT, DT.DOUBLE},
    DT.FLOAT: {DT.DOUBLE},
    DT.INT8: {DT.INT16, DT.INT32, DT.INT64, DT.FLOAT16, DT.FLOAT, DT.DOUBLE},
    DT.UINT8: {DT.INT16, DT.INT32, DT.INT64, DT.FLOAT16, DT.FLOAT, DT.DOUBLE},
    DT.INT16: {DT.INT32, DT.INT64, DT.FLOAT, DT.DOUBLE},
    DT.INT32: {DT.INT64, DT.DOUBLE},
}
# Gemm dtypes onnxruntime's CPU provider implements: ONNX also allows integer and bfloat16 Gemm,
# but a model rewritten to one would no longer load there ("Could not find an implementation").
_GEMM_TYPES = {DT.FLOAT, DT.DOUBLE, DT.FLOAT16}


class LosslessCastCast(RewriteRuleClassBase):
    """``Cast(Cast(x: T, to=U), to=V)`` -> ``Cast(x, to=V)``, or -> ``x`` when V == T.

    Sound only when T -> U is exact (``_LOSSLESS``): then the middle value holds x unchanged.
    float32 -> float16 -> float32 is *not* rewritten (it rounds)."""

    def pattern(self, op, x, mid, to):
        return op.Cast(op.Cast(x, to=mid), to=to)

    def check(self, context, x, mid, to) -> MatchResult:
        result = MatchResult()
        if x.dtype is None or DT(mid.as_int()) not in _LOSSLESS.get(x.dtype, ()):
            return result.fail(f"cast {x.dtype} -> {DT(mid.as_int())} may round")
        return result

    def rewrite(self, op, x, mid, to):
        if DT(to.as_int()) == x.dtype:
            return op.Identity(x)
        return op.Cast(x, to=to.as_int())


def _c_fits_gemm(c: ir.Value, a: ir.Value, b: ir.Value, trans_a: bool, trans_b: bool) -> bool:
    """Gemm's C must broadcast (unidirectionally) to the [M, N] product without growing it."""
    if c.shape is None or len(c.shape) > 2:
        return False
    product = [a.shape[1 if trans_a else 0], b.shape[0 if trans_b else 1]]
    return all(c_dim == 1 or _same_dim(c_dim, o_dim)
               for c_dim, o_dim in zip(reversed(list(c.shape)), reversed(product)))


def _same_dim(a, b) -> bool:
    """Dims known to be equal: equal ints, or the same named symbol (two unknowns may differ)."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


class MatMulAddToGemm(RewriteRuleClassBase):
    """``Add(MatMul(a, b), c)`` -> ``Gemm(a, b, c)``; with ``trans_a``/``trans_b`` the operand
    is ``Transpose(x, perm=[1, 0])`` and becomes ``transA``/``transB``. Exact when a and b are
    2-D (Gemm's operands), c broadcasts to the [M, N] product without growing it (Gemm's C is
    broadcast unidirectionally) and the dtype is one Gemm takes: then ``Gemm(A, B, C) == A @ B + C``.
    onnxscript's ``matmul_add_to_gemm_rule`` and its transposed forms (same patterns and
    replacement) check only the ranks of a and b."""

    def __init__(self, trans_a: bool, trans_b: bool):
        super().__init__(f"{'TransA' if trans_a else ''}{'TransB' if trans_b else ''}MatMulAddToGemm")
        self.trans_a, self.trans_b = trans_a, trans_b

    def pattern(self, op, input_a, input_b, input_c):
        a = op.Transpose(input_a, perm=[1, 0]) if self.trans_a else input_a
        b = op.Transpose(input_b, perm=[1, 0]) if self.trans_b else input_b
        return op.Add(op.MatMul(a, b), input_c)

    def check(self, context, input_a, input_b, input_c) -> MatchResult:
        result = MatchResult()
        if not all(v is not None and v.shape is not None and len(v.shape) == 2 for v in (input_a, input_b)):
            return result.fail("Rank of input_a and input_b must be 2")
        if input_a.dtype not in _GEMM_TYPES:
            return result.fail(f"Gemm does not take {input_a.dtype}")
        if not _c_fits_gemm(input_c, input_a, input_b, self.trans_a, self.trans_b):
            return result.fail("bias shape would broadcast the product")
        return result

    def rewrite(self, op, input_a, input_b, input_c):
        attributes = {"transA": 1} if self.trans_a else {}
        if self.trans_b:
            attributes["transB"] = 1
        return op.Gemm(input_a, input_b, input_c, **attributes)


class TransposeIntoGemm(RewriteRuleClassBase):
    """``Gemm(Transpose(a, perm=[1,0]), b, ...)`` -> ``Gemm(a, b, transA=!transA, ...)`` and the
    same for ``b``: Gemm transposes its operands itself, for free (Gemm's inputs are 2-D)."""

    def __init__(self, operand: int):
        super().__init__(f"TransposeIntoGemm{'AB'[operand]}")
        self.operand = operand

    def pattern(self, op, a, b):
        if self.operand == 0:
            return op.Gemm(op.Transpose(a, perm=[1, 0]), b, _allow_other_inputs=True, _outputs=["out"])
        return op.Gemm(a, op.Transpose(b, perm=[1, 0]), _allow_other_inputs=True, _outputs=["out"])

    def rewrite(self, op, a, b, out):
        node = out.producer()
        attrs = {k: v for k, v in node.attributes.items()}
        key = "transA" if self.operand == 0 else "transB"
        attrs[key] = ir.AttrInt64(key, 1 - node.attributes.get_int(key, 0))
        return op.Gemm(a, b, *node.inputs[2:], **{k: v.value for k, v in attrs.items()})


# op -> (neutral element, operand positions that may hold it)
_NEUTRAL = {"Add": (0, (0, 1)), "Sub": (0, (1,)), "Mul": (1, (0, 1)), "Div": (1, (1,))}


class NeutralOperandElimination(Declared, ir.passes.InPlacePass):
    """``x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1`` -> x, where the 0/1 is a constant tensor of
    any shape whose elements all equal the neutral element, as long as broadcasting it does not
    change x's shape or dtype (each of its dims, right-aligned, is 1 or x's static dim). Exact
    for every x (NaN and inf included; only the sign of a zero may flip in ``-0 + 0``).
    ``protected`` initializers (parameters, below level 3) are never taken for constants: a
    zero-initialised bias is still a bias that training will move."""

    name = "NeutralOperandElimination"

    def __init__(self, protected: frozenset[str] = frozenset()):
        super().__init__()
        self.protected = protected

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            rule = _NEUTRAL.get(node.op_type)
            if rule is None or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
                continue
            for pos in rule[1]:
                x, c = node.inputs[1 - pos], node.inputs[pos]
                if self._is_neutral(c, rule[0], x):
                    # An Identity keeps a graph output's name; identity elimination removes it.
                    identity = ir.Node("", "Identity", [x], metadata_props=dict(node.metadata_props))
                    ir.convenience.replace_nodes_and_values(
                        node.graph, node, [node], [identity], node.outputs, identity.outputs)
                    modified = True
                    break
        return ir.passes.PassResult(model, modified)

    def _is_neutral(self, c: ir.Value | None, neutral: int, x: ir.Value | None) -> bool:
        if c is None or x is None or c.name in self.protected or x.shape is None or x.dtype != c.dtype:
            return False
        array = fixed_array(c)
        if array is None or array.ndim > len(x.shape) or not np.all(array == neutral):
            return False
        return all(c_dim == 1 or c_dim == x_dim
                   for c_dim, x_dim in zip(reversed(array.shape), reversed(list(x.shape))))


_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Greater", "GreaterOrEqual",
                           "Less", "LessOrEqual", "And", "Or", "Xor"})


class ExpandIntoBroadcast(Declared, ir.passes.InPlacePass):
    """``op(Expand(a, Shape(v)), c)`` -> ``op(a, c)`` for a broadcasting binary op when v and c
    have the same shape (``same_shape``): broadcasting is associative, so the result's shape is
    broadcast(a, shape(v), c) = broadcast(a, c) either way, and each element reads the same a
    and c elements. Gradient graphs are full of these (a reduction's gradient is expanded back
    to the input's shape, then multiplied by a tensor of that very shape). The Expand stays for
    any other user."""

    name = "ExpandIntoBroadcast"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            if node.op_type not in _BROADCASTING or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
                continue
            for pos in (0, 1):
                expand, other = node.inputs[pos].producer() if node.inputs[pos] else None, node.inputs[1 - pos]
                if expand is None or expand.op_type != "Expand" or other is None:
                    continue
                shape_of = expand.inputs[1].producer()
                if (shape_of is not None and shape_of.op_type == "Shape" and not shape_of.attributes
                        and same_shape(shape_of.inputs[0], other)):
                    node.replace_input_with(pos, expand.inputs[0])
                    modified = True
                    break
        return ir.passes.PassResult(model, modified)


class ReshapeAbsorbsUnsqueeze(Declared, ir.passes.InPlacePass):
    """``Unsqueeze(Reshape(x, s), axes)`` and ``Squeeze(Reshape(x, s), axes)`` -> one
    ``Reshape(x, s')``, s' the constant s with 1s inserted at / removed from ``axes``, when the
    Reshape has no other use. Sound when s holds no 0 (a 0 copies x's dim at its own index,
    which inserting or removing would shift) and every squeezed entry is a literal 1: adding or
    dropping 1-dims re-views the same row-major data, as the single Reshape does. A 0 in s ("copy
    x's dim", whose index the insertion would shift) is first spelled out: x's static dim, or the
    one -1. (An exported attention block splits q/k/v this way; onnxruntime keeps both nodes.)"""

    name = "ReshapeAbsorbsUnsqueeze"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            if node.op_type not in ("Unsqueeze", "Squeeze") or node.domain not in ("", "ai.onnx"):
                continue
            reshape = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
            if reshape is None or reshape.op_type != "Reshape" or len(node.inputs[0].uses()) != 1 \
                    or node.inputs[0].is_graph_output() or reshape.graph is not node.graph:
                continue
            shape = fixed_array(reshape.inputs[1])
            if shape is None or shape.ndim != 1 or reshape.attributes.get_int("allowzero", 0):
                continue
            shape = _without_copies(list(shape), reshape.inputs[0].shape)
            target = None if shape is None else _squeezed(shape, const_axes(node), node.op_type)
            if target is None:
                continue
            value = int64_initializer(node.graph, f"{node.name or node.op_type}/reshape_shape", np.array(target))
            new = ir.Node("", "Reshape", [reshape.inputs[0], value], metadata_props=dict(node.metadata_props))
            ir.convenience.replace_nodes_and_values(node.graph, node, [node], [new], node.outputs, new.outputs)
            modified = True
        return ir.passes.PassResult(model, modified)


# Ops that map each element on its own (no axis, no shape-dependent attribute), so they
# commute with a Reshape; the binary ones only with a one-element constant operand.
_ELEMENTWISE = frozenset({
    "Abs", "Ceil", "Celu", "Cos", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "IsNaN",
    "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
    "Softplus", "Softsign", "Sqrt", "Tanh", "ThresholdedRelu", "Cast"})
_SCALAR_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})


class ReshapeThroughElementwise(Declared, ir.passes.InPlacePass):
    """``Reshape(f(Reshape(x, s1)), s2)`` -> ``Reshape(f(x), s2)``, and -> ``f(x)`` when s2
    denotes x's own shape, for f a region of elementwise ops whose every input is the first
    Reshape's output, another op of the region or a one-element constant of rank 0 or 1
    (``_ELEMENTWISE``, or a binary op ``_SCALAR_BINARY`` of those), and whose values are read
    by nothing outside it but the last Reshape. The region may branch and join: exported
    ``0.5 * x * (1 + erf(x / sqrt2))`` reads x twice. Sound because every value of the region
    has s1's shape (a one-element operand of rank <= 1 broadcasts to nothing bigger), each op
    maps each element alone, so it commutes with re-viewing the row-major data, and two
    Reshapes in a row are the last one (s2 holds no 0, whose "copy the input's dim" would read
    the other shape). For a scalar x a rank-1 operand makes f(x) of rank 1, so the last Reshape
    then stays even where s2 denotes x's shape. ``BatchedMatMulAddToGemm`` leaves ``Reshape`` -> activation -> ``Reshape``
    between two linear layers; this removes both. The first Reshape stays for other readers."""

    name = "ReshapeThroughElementwise"
    MAX_REGION = 64  # nodes: an activation is a handful; the walk stays cheap

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for last in all_nodes(model.graph):
            if last.op_type != "Reshape" or last.domain not in ("", "ai.onnx") or last.attributes.get_int("allowzero", 0):
                continue
            target = fixed_array(last.inputs[1])
            region = None if target is None or 0 in target else self._region(last)
            if region is None:
                continue
            first, ops, root, operand_rank = region
            x = first.inputs[0]
            for op in ops:  # each now maps x's shape (a one-element operand of rank <= 1 keeps it)
                for i, v in enumerate(op.inputs):
                    if v is first.outputs[0]:
                        op.replace_input_with(i, x)
                op.outputs[0].shape = x.shape if x.shape is not None and len(x.shape) >= 1 else None
            same = self._denotes(target, x.shape) and len(x.shape) >= operand_rank
            if same and last.outputs[0].is_graph_output():
                # an Identity keeps the graph output's name; identity elimination removes it
                identity = ir.Node("", "Identity", [root.outputs[0]], metadata_props=dict(last.metadata_props))
                ir.convenience.replace_nodes_and_values(last.graph, last, [last], [identity], last.outputs,
                                                        identity.outputs)
            elif same:
                ir.convenience.replace_all_uses_with(last.outputs[0], root.outputs[0])
            modified = True
        return ir.passes.PassResult(model, modified)

    def _region(self, last: ir.Node) -> tuple[ir.Node, list[ir.Node], ir.Node, int] | None:
        """(the first Reshape, the region's ops, the op ``last`` reads, the highest rank of its
        one-element operands), or None."""
        value = last.inputs[0]
        root = value.producer() if value is not None else None
        if root is None or len(value.uses()) != 1 or value.is_graph_output():
            return None
        first, ops, seen, stack, operand_rank = None, [], set(), [root], 0
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if (node.graph is not last.graph or node.domain not in ("", "ai.onnx") or len(ops) >= self.MAX_REGION
                    or not _elementwise_op(node)):
                return None
            ops.append(node)
            for v in node.inputs:
                producer = v.producer() if v is not None else None
                if producer is not None and producer.op_type == "Reshape" and producer.domain in ("", "ai.onnx") \
                        and not producer.attributes.get_int("allowzero", 0) and producer.graph is last.graph:
                    if first not in (None, producer):
                        return None
                    first = producer
                elif _one_element(v):
                    operand_rank = max(operand_rank, len(v.shape) if v.shape is not None else 1)
                else:
                    if producer is None:
                        return None
                    stack.append(producer)
        inside = {id(n) for n in ops} | {id(last)}
        if first is None or any(out.is_graph_output() or any(id(u.node) not in inside for u in out.uses())
                                for op in ops for out in op.outputs):
            return None
        return first, ops, root, operand_rank

    @staticmethod
    def _denotes(target: np.ndarray, shape: ir.Shape | None) -> bool:
        """Whether the Reshape target (no 0 in it) names exactly ``shape``: equal static dims,
        and a -1 only where ``shape``'s one unknown dim is."""
        if shape is None or len(target) != len(shape):
            return False
        unknown = [i for i, d in enumerate(shape) if not isinstance(d, int)]
        return len(unknown) <= 1 and all(
            t == -1 if i in unknown else t == d for i, (t, d) in enumerate(zip(target, shape)))


def _elementwise_op(node: ir.Node) -> bool:
    """``node`` maps its tensor inputs element by element (a unary ``_ELEMENTWISE`` op, or a
    binary ``_SCALAR_BINARY`` op), with one output."""
    if len(node.outputs) != 1:
        return False
    if node.op_type in _ELEMENTWISE:
        return len([v for v in node.inputs if v is not None]) == 1
    return node.op_type in _SCALAR_BINARY and len(node.inputs) == 2 and None not in node.inputs


def _one_element(value: ir.Value | None) -> bool:
    """A constant of one element and rank 0 or 1: broadcasting it never changes a shape of rank >= 1."""
    array = fixed_array(value)
    return array is not None and array.size == 1 and array.ndim <= 1


def _without_copies(shape: list[int], dims) -> list[int] | None:
    """A Reshape target ``shape`` with each 0 ("copy the input's dim here") spelled out from the
    input's ``dims`` (ints where static; None when even the rank is unknown): the static dim, or
    -1 for one unknown dim when the shape has no -1 yet; None when that is not possible."""
    out = []
    for i, d in enumerate(shape):
        if d == 0:
            dim = dims[i] if dims is not None and i < len(dims) else None
            if isinstance(dim, int):
                d = dim
            elif -1 in shape or -1 in out:
                return None
            else:
                d = -1
        out.append(int(d))
    return out


def _squeezed(shape: list[int], axes: list[int] | None, op_type: str) -> list[int] | None:
    if axes is None or (op_type == "Unsqueeze" and not axes):
        return None
    if op_type == "Unsqueeze":
        rank = len(shape) + len(axes)
        positions = sorted(a % rank for a in axes)
        out = list(shape)
        for a in positions:
            out.insert(a, 1)
        return out
    if not axes:  # Squeeze of every 1-dim: only when none is inferred (-1)
        return None if -1 in shape else [d for d in shape if d != 1]
    drop = {a % len(shape) for a in axes}
    if any(shape[a] != 1 for a in drop):
        return None
    return [d for i, d in enumerate(shape) if i not in drop]


@functools.cache  # rule sets are stateless between runs; building them costs ~10 ms
def algebraic_pass() -> RulePass:
    """Identities that hold for every input value (``x*1, x+0`` ... are
    ``NeutralOperandElimination``'s):
    1. ``Cast(x, to=dtype(x))`` -> x; lossless ``Cast`` chains collapse (``LosslessCastCast``);
    2. ``Transpose(Transpose(x, p), q)`` -> one Transpose (or x when q∘p is the identity);
       ``Transpose`` with the identity perm -> x;
    3. ``Reshape(Reshape(x, s1), s2)`` -> ``Reshape(x, s2)`` for a constant s2;
       ``Unsqueeze(Unsqueeze(x))`` -> one Unsqueeze; ``Expand`` to x's own shape -> x;
       ``Slice`` covering the whole axis -> x; Reshapes around a 2-D MatMul that only
       add/remove broadcast dims are dropped (onnxscript's rules, each checks shapes);
    4. ``Gemm(Transpose(a), b)`` -> ``Gemm(a, b, transA=1)`` (``TransposeIntoGemm``)."""
    rules = [
        LosslessCastCast(),
        library_rules.no_op_cast_rule, library_rules.no_op_expand_rule,
        library_rules.reshape_reshape_rule, library_rules.no_op_transpose_rule,
        library_rules.transpose_transpose_rule, library_rules.unsqueeze_unsqueeze_rule,
        library_rules.squeeze_reshape_1d_rule,
        library_rules.collapse_slice_rule, library_rules.collapse_slice2_rule,
        library_rules.two_reshapes_matmul_reshape_rule, library_rules.one_reshape_matmul_reshape_rule,
        TransposeIntoGemm(0), TransposeIntoGemm(1),
    ]
    return RulePass("AlgebraicSimplification", rules)


@functools.cache  # rule sets are stateless between runs; building them costs ~10 ms
def gemm_pass() -> RulePass:
    """``Add(MatMul(a, b), c)`` -> ``Gemm(a, b, c)`` for 2-D a, b (a Transpose([1,0]) on either
    operand becomes transA/transB), when c broadcasts to the product's shape. One fused kernel
    instead of two, and the bias add happens in the GEMM epilogue."""
    rules = [MatMulAddToGemm(trans_a, trans_b) for trans_a, trans_b in ((True, True), (True, False), (False, True),
                                                                        (False, False))]
    return RulePass("MatMulAddToGemm", rules, guard=_reads_matmul, commute=True)


def _reads_matmul(node: ir.Node) -> bool:
    """An input is a MatMul of two 2-D operands (the rules' check; an operand may be the
    Transpose a rule folds into transA/transB, whose input is then the 2-D one)."""
    return any(v is not None and v.producer() is not None and v.producer().op_type == "MatMul"
               and all(_rank2(m) for m in v.producer().inputs) for v in node.inputs)


def _rank2(value: ir.Value | None) -> bool:
    if value is None:
        return False
    if value.shape is not None and len(value.shape) == 2:
        return True
    producer = value.producer()
    return (producer is not None and producer.op_type == "Transpose" and producer.inputs[0] is not None
            and producer.inputs[0].shape is not None and len(producer.inputs[0].shape) == 2)


class BatchedMatMulAddToGemm(Declared, ir.passes.InPlacePass):
    """``Add(MatMul(a[..., K], b[K, N]), c)`` -> ``Reshape(Gemm(Reshape(a, [-1, K]), b, c),
    [..., N])`` for a of rank 3 or more (a linear layer on a sequence), when K, N and all but at
    most one of a's leading dims are static (that one becomes the -1 of both Reshapes), no
    static dim is 0, and c is [N], [1, N], [1] or a scalar. A MatMul with a 2-D right operand
    multiplies every leading index's row by b alone, so it is the 2-D product of the flattened
    rows; Gemm adds c to each row as the Add's broadcast did (c spans only the last axis).
    Reshapes re-view row-major data and cost nothing in onnxruntime, which then runs one GEMM
    with the bias in its epilogue instead of a batched MatMul and a separate Add (about 4 %
    faster end to end on tests/data/torch_attention.onnx, 1 thread)."""

    name = "BatchedMatMulAddToGemm"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # Linear layers reading one input (q, k and v projections) share its rows Reshape, and
        # equal shapes share one initializer, so no later CSE/dedup round is needed for them.
        self._shapes: dict[tuple[int, tuple], ir.Value] = {}
        self._rows: dict[tuple[int, tuple], ir.Value] = {}
        modified = False
        for add in all_nodes(model.graph):
            if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
                continue
            for pos in (0, 1):
                matmul = add.inputs[pos].producer() if add.inputs[pos] is not None else None
                shapes = self._match(matmul, add, add.inputs[1 - pos])
                if shapes is not None:
                    self._rewrite(add, matmul, add.inputs[1 - pos], *shapes)
                    modified = True
                    break
        return ir.passes.PassResult(model, modified)

    def _shape(self, graph: ir.Graph, name: str, dims: list[int]) -> ir.Value:
        key = (id(graph), tuple(dims))
        if key not in self._shapes:
            self._shapes[key] = int64_initializer(graph, name, np.array(dims))
        return self._shapes[key]

    @staticmethod
    def _match(matmul: ir.Node | None, add: ir.Node, c: ir.Value | None) -> tuple[list, list] | None:
        """(a's 2-D shape, the output's shape), -1 for the one symbolic dim; None if no match."""
        if (matmul is None or matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx")
                or matmul.graph is not add.graph or len(matmul.outputs[0].uses()) != 1
                or matmul.outputs[0].is_graph_output() or c is None or c.shape is None):
            return None
        a, b = matmul.inputs
        if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) < 3 \
                or len(b.shape) != 2 or a.dtype not in _GEMM_TYPES or c.dtype != a.dtype:
            return None
        k, n = b.shape
        lead = list(a.shape[:-1])
        if not (isinstance(k, int) and isinstance(n, int) and _same_dim(a.shape[-1], k)):
            return None
        symbolic = [i for i, d in enumerate(lead) if not isinstance(d, int)]
        if len(symbolic) > 1 or 0 in lead or 0 in (k, n):
            return None
        if list(c.shape) not in ([], [1], [n], [1, 1], [1, n]):
            return None
        out = [-1 if not isinstance(d, int) else d for d in lead] + [n]
        return [-1 if symbolic else int(np.prod(lead)), k], out

    def _rewrite(self, add: ir.Node, matmul: ir.Node, c: ir.Value, rows_shape: list, out_shape: list) -> None:
        graph, meta = add.graph, dict(matmul.metadata_props)
        # a Reshape feeding the rows, or reading the result, merges with ours (two Reshapes in a
        # row are the last one, when the last holds no 0): the attention block's head splits
        a = _unreshaped(matmul.inputs[0])
        # new nodes are named after the MatMul's output value, unique in the graph
        base = matmul.outputs[0].name or matmul.name
        named = {part: f"{base}/{part}" if base else None for part in ("rows", "gemm", "unrows")}
        m = rows_shape[0] if rows_shape[0] != -1 else ir.SymbolicDim(None)
        new, key = [], (id(graph), id(a), tuple(rows_shape))
        if key not in self._rows:
            reshape = ir.Node("", "Reshape", [a, self._shape(graph, f"{base}/rows", rows_shape)], name=named["rows"],
                              metadata_props=meta)
            rows = self._rows[key] = reshape.outputs[0]
            rows.shape, rows.dtype = ir.Shape([m, rows_shape[1]]), a.dtype
            new.append(reshape)
        b, trans_b = _untransposed(matmul.inputs[1])  # Gemm transposes b itself (TransposeIntoGemm)
        gemm = ir.Node("", "Gemm", [self._rows[key], b, c], attributes=[ir.AttrInt64("transB", 1)] if trans_b else (),
                       name=named["gemm"], metadata_props=meta)
        gemm.outputs[0].shape, gemm.outputs[0].dtype = ir.Shape([m, out_shape[-1]]), a.dtype
        for use in list(add.outputs[0].uses()):
            target = _reshape_target(use.node, out_shape) if use.idx == 0 else None
            if target is not None:
                use.node.replace_input_with(0, gemm.outputs[0])
                use.node.replace_input_with(1, self._shape(graph, f"{base}/reshaped", target))
        back = ir.Node("", "Reshape", [gemm.outputs[0], self._shape(graph, f"{base}/unrows", out_shape)],
                       name=named["unrows"], metadata_props=meta)
        # a shared rows Reshape goes in at the first linear that reads it, which comes before
        # every later one in the graph's order
        ir.convenience.replace_nodes_and_values(graph, add, [matmul, add], [*new, gemm, back], add.outputs,
                                                back.outputs)
        if not back.outputs[0].uses() and not back.outputs[0].is_graph_output():
            graph.remove(back, safe=True)  # safe: detaches its inputs, so its shape initializer is unused


def _reshape_target(node: ir.Node, dims: list[int]) -> list[int] | None:
    """For a Reshape of a value of shape ``dims`` (-1 for its one unknown dim) to a constant
    shape: that shape with each 0 ("copy the input's dim") spelled out (``_without_copies``),
    which then means the same for any input with that many elements; None if not a Reshape,
    or two dims would be -1."""
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or node.attributes.get_int("allowzero", 0):
        return None
    shape = fixed_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if shape is None or shape.ndim != 1:
        return None
    target = _without_copies([int(d) for d in shape], [None if d == -1 else d for d in dims])
    return target if target is not None and 0 not in target else None


def _unreshaped(value: ir.Value) -> ir.Value:
    """The input of the Reshape producing ``value``, else ``value``: a later Reshape to a full
    constant shape reads the same elements from either."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Reshape" and producer.domain in ("", "ai.onnx") \
            and producer.inputs[0] is not None:
        return producer.inputs[0]
    return value


def _untransposed(value: ir.Value) -> tuple[ir.Value, bool]:
    """(x, True) when ``value`` is ``Transpose(x, perm=[1, 0])``, else (value, False)."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
        perm = producer.attributes.get_ints("perm", None)
        x = producer.inputs[0]
        if x is not None and x.shape is not None and len(x.shape) == 2 and list(perm or [1, 0]) == [1, 0]:
            return x, True
    return value, False
