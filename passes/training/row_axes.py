"""Where each ONNX op sends the batch's rows: ``RULES`` maps an op type to a rule that takes a
node and its inputs' ``Rows`` (None: not from the batch) and returns its outputs' ``Rows``, or
raises ``Mixes`` saying how the op combines rows. A rule that cannot tell (an unknown shape, a
computed axis) raises too: the analysis is conservative (``row_mixing``). Here: elementwise ops,
ops along an axis, reductions, matrix products, moves and reshapes; ``row_axes_select`` adds
indexing, joining and recurrent layers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from graphc.passes.evaluate import folded_array
from graphc.passes.training.row_shapes import shape_of
from graphc.passes.values import const_axes

__all__ = ["BIG", "Mixes", "RULES", "Rows", "constant", "int_attr", "norm_axis", "only_rows", "product", "rank_of",
           "rule"]


@dataclass(frozen=True)
class Rows:
    """A value's batch axis: ``axis`` holds the batch's rows, ``copies`` times stacked (a Concat of
    the batch with itself along it), each slice along ``axis`` one row's (a flatten of a row's
    values into it keeps that)."""

    axis: int
    copies: int = 1


class Mixes(Exception):
    """An op combines rows of the batch, or may: the message says how."""


Ins = Sequence["Rows | None"]
Rule = Callable[[ir.Node, Ins], list["Rows | None"]]
RULES: dict[str, Rule] = {}
BIG = 2 ** 62  # a Slice end past this is "to the end"


def rule(*op_types: str):
    def register(fn: Rule) -> Rule:
        RULES.update(dict.fromkeys(op_types, fn))
        return fn
    return register


def constant(value: ir.Value | None):
    """A value known before the model runs (a constant no feed overrides, or a node of such values:
    an exporter's ``Unsqueeze`` of a ``Constant`` in a Loop body; ``folded_array``), else None."""
    return folded_array(value)


def rank_of(value: ir.Value | None) -> int | None:
    shape = shape_of(value) if value is not None else None
    return None if shape is None else len(shape)


def int_attr(node: ir.Node, name: str, default: int) -> int:
    return node.attributes.get_int(name, default)


def norm_axis(axis: int, rank: int | None) -> int:
    if axis >= 0:
        return axis
    if rank is None:
        raise Mixes("its axis counts from the end of a value of unknown rank")
    return axis + rank


def only_rows(node: ir.Node, ins: Ins, *allowed: int) -> Rows:
    """The batch axis of the one input of ``allowed`` positions that may hold rows."""
    bad = [node.inputs[i].name for i, r in enumerate(ins) if r is not None and i not in allowed]
    if bad:
        raise Mixes(f"it reads the rows in {', '.join(map(repr, bad))} as an operand whose rows it does not keep "
                    f"(only input {'/'.join(map(str, allowed))}'s)")
    rows = [r for r in ins if r is not None]
    if len(rows) > 1 and len(set(rows)) > 1:
        raise Mixes("it reads rows on different axes")
    return rows[0]


# -- elementwise, by numpy broadcasting -------------------------------------------------------------
ELEMENTWISE = (
    "Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Bernoulli Cast "
    "CastLike Ceil Celu Clip Cos Cosh DequantizeLinear Div Dropout DynamicQuantizeLinear Elu Equal Erf Exp Floor Gelu "
    "Greater GreaterOrEqual HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish "
    "Mod Mul Neg Not Or PRelu Pow QuantizeLinear Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus "
    "Softsign Sqrt Sub Sum Tan Tanh ThresholdedRelu Where Xor Expand BatchNormalization").split()


@rule(*ELEMENTWISE)
def elementwise(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """The output's axis is each input's aligned from the right; inputs whose rows land on
    different axes pair every row with every other (``x[:, None] - x[None]``)."""
    if node.op_type == "Expand" and ins[1] is not None:
        raise Mixes("its shape is computed from the rows' values")
    out_rank = rank_of(node.outputs[0])
    placed = set()
    for value, r in zip(node.inputs, ins):
        if r is not None:
            rank = rank_of(value)
            if out_rank is None or rank is None:
                raise Mixes("its operands' ranks are unknown")
            placed.add(replace(r, axis=r.axis + out_rank - rank))
    if len(placed) > 1:
        raise Mixes(f"it pairs rows on axes {sorted(r.axis for r in placed)}: each row with the others")
    out = placed.pop()
    return [out if rank_of(v) == out_rank else None for v in node.outputs]


# -- along one axis --------------------------------------------------------------------------------
def _along(axes_of: Callable[[ir.Node, int | None], Sequence[int]], what: str) -> Rule:
    """A rule for an op that combines values along ``axes_of(node, rank)`` and keeps the others
    (its outputs of the input's rank keep the batch axis)."""
    def along(node: ir.Node, ins: Ins) -> list[Rows | None]:
        r = only_rows(node, ins, 0)
        rank = rank_of(node.inputs[0])
        if r.axis in {norm_axis(a, rank) for a in axes_of(node, rank)}:
            raise Mixes(f"it {what} over the batch axis {r.axis}")
        return [r if rank_of(v) == rank else None for v in node.outputs]
    return along


def _attr_axis(name: str, default: int) -> Callable[[ir.Node, int | None], list[int]]:
    return lambda node, rank: [int_attr(node, name, default)]


def _from_axis(node: ir.Node, rank: int | None) -> range:
    if rank is None:
        raise Mixes("it normalises a value of unknown rank")
    return range(norm_axis(int_attr(node, "axis", -1), rank), rank)


def _input_axis(node: ir.Node, rank: int | None) -> list[int]:
    axis = constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if axis is None:
        raise Mixes("its axis is not a constant")
    return [int(np.asarray(axis).reshape(-1)[0])]


RULES.update({
    "Softmax": _along(_attr_axis("axis", -1), "normalises"), "LogSoftmax": _along(_attr_axis("axis", -1), "normalises"),
    "Hardmax": _along(_attr_axis("axis", -1), "picks a maximum"),
    "LpNormalization": _along(_attr_axis("axis", -1), "normalises"),
    "TopK": _along(_attr_axis("axis", -1), "sorts"), "CumSum": _along(_input_axis, "sums cumulatively"),
    "LRN": _along(lambda node, rank: [1], "normalises"),
    "LayerNormalization": _along(_from_axis, "normalises"),
    "MeanVarianceNormalization": _along(lambda node, rank: list(node.attributes.get_ints("axes", [0, 2, 3])),
                                        "normalises"),
    "InstanceNormalization": _along(lambda node, rank: range(2, rank or 2), "normalises"),
    "GroupNormalization": _along(lambda node, rank: range(1, rank or 1), "normalises"),
    "Trilu": _along(lambda node, rank: [-2, -1], "masks by position"),
    "ReverseSequence": _along(_attr_axis("time_axis", 0), "reverses"),
    "DFT": _along(lambda node, rank: _input_axis(node, rank) if len(node.inputs) > 2 and node.inputs[2] is not None
                  else [int_attr(node, "axis", 1)], "transforms"),
})


@rule("Det")
def det(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, rank = only_rows(node, ins, 0), rank_of(node.inputs[0])
    if rank is None or r.axis >= rank - 2:
        raise Mixes("it takes determinants over the batch axis")
    return [r]


@rule("Conv", "ConvTranspose", "ConvInteger", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
      "GlobalMaxPool", "GlobalLpPool", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "GridSample",
      "MaxUnpool", "STFT")
def channels_first(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """Ops over ``[N, C, spatial...]`` (STFT ``[N, length, 1]``) keep N, which they never combine."""
    r = only_rows(node, ins, 0)
    if r.axis != 0:
        raise Mixes(f"its rows are on axis {r.axis}, which it combines, not on N")
    return [r] * len(node.outputs)


# -- reductions --------------------------------------------------------------------------------------
@rule("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
      "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin")
def reduce(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r = only_rows(node, ins, 0)
    rank = rank_of(node.inputs[0])
    if node.op_type in ("ArgMax", "ArgMin"):
        axes: list[int] | None = [int_attr(node, "axis", 0)]
    else:
        axes = const_axes(node, constant)
        if axes is None:
            raise Mixes("its axes are not constant")
        if not axes:
            if int_attr(node, "noop_with_empty_axes", 0):
                return [r]
            raise Mixes("it reduces every axis, the batch's included")
    axes = [norm_axis(a, rank) for a in axes]
    if r.axis in axes:
        raise Mixes(f"it reduces the batch axis {r.axis}")
    keep = int_attr(node, "keepdims", 1)
    return [replace(r, axis=r.axis if keep else r.axis - sum(a < r.axis for a in axes))]


# -- matrix products ---------------------------------------------------------------------------------
def _contract(terms: Sequence[str], out: str, ins: Ins, what: str) -> list[Rows | None]:
    """Rows through a product written as einsum letters: each input's batch letter must survive
    into ``out``, and every input's the same one."""
    letters = set()
    for term, r in zip(terms, ins):
        if r is None:
            continue
        letter = term[r.axis]
        if term.count(letter) > 1:
            raise Mixes(f"it takes a diagonal of the batch axis ({what})")
        if letter not in out:
            raise Mixes(f"it contracts the batch axis ({what})")
        letters.add((letter, r.copies))
    if len(letters) > 1:
        raise Mixes(f"it multiplies rows with rows ({what}): each with every other")
    letter, copies = letters.pop()
    return [Rows(out.index(letter), copies)]


@rule("MatMul", "MatMulInteger")
def matmul(node: ir.Node, ins: Ins) -> list[Rows | None]:
    ra, rb = rank_of(node.inputs[0]), rank_of(node.inputs[1])
    if ra is None or rb is None:
        raise Mixes("its operands' ranks are unknown")
    rank = max(ra, rb, 2)
    lead = "abcdefghijklmnop"[:rank - 2]
    a = lead[len(lead) - (ra - 2):] + "mk" if ra >= 2 else "k"
    b = lead[len(lead) - (rb - 2):] + "kn" if rb >= 2 else "k"
    out = lead + ("m" if ra >= 2 else "") + ("n" if rb >= 2 else "")
    return _contract([a, b], out, ins[:2], "a matrix product")


@rule("Gemm")
def gemm(node: ir.Node, ins: Ins) -> list[Rows | None]:
    a = "km" if int_attr(node, "transA", 0) else "mk"
    b = "nk" if int_attr(node, "transB", 0) else "kn"
    rows = _contract([a, b], "mn", ins[:2], "a matrix product") if any(ins[:2]) else [None]
    if len(ins) > 2 and ins[2] is not None:  # C broadcasts onto [M, N]
        c = ins[2]
        placed = Rows(c.axis + 2 - (rank_of(node.inputs[2]) or 0), c.copies)
        if rows[0] not in (None, placed):
            raise Mixes("its C operand's rows are on another axis than its product's")
        rows = [placed]
    return rows


@rule("Einsum")
def einsum(node: ir.Node, ins: Ins) -> list[Rows | None]:
    equation = node.attributes.get_string("equation", "").replace(" ", "")
    if "->" not in equation or "..." in equation:
        raise Mixes(f"its equation {equation!r} has no explicit output or has an ellipsis")
    terms, out = equation.split("->")
    return _contract(terms.split(","), out, ins, f"einsum {equation!r}")


# -- moving axes -----------------------------------------------------------------------------------
@rule("Transpose")
def transpose(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, rank = only_rows(node, ins, 0), rank_of(node.inputs[0])
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        if rank is None:
            raise Mixes("it reverses the axes of a value of unknown rank")
        perm = list(range(rank))[::-1]
    return [replace(r, axis=list(perm).index(r.axis))]


@rule("Unsqueeze")
def unsqueeze(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, axes, rank = only_rows(node, ins, 0), const_axes(node, constant), rank_of(node.outputs[0])
    if axes is None or rank is None:
        raise Mixes("its axes are not constant")
    kept = [i for i in range(rank) if i not in {norm_axis(a, rank) for a in axes}]
    return [replace(r, axis=kept[r.axis])]


@rule("Squeeze")
def squeeze(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, axes, shape = only_rows(node, ins, 0), const_axes(node, constant), shape_of(node.inputs[0])
    if axes == [] and shape is not None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    if not axes and axes != [] or shape is None and any(a < 0 for a in axes or ()):
        raise Mixes("its axes are not known")
    axes = [norm_axis(a, len(shape) if shape else None) for a in axes]
    return [replace(r, axis=r.axis - sum(a < r.axis for a in axes))]


def product(dims: Sequence) -> Counter | None:
    """A product of dims (a product's items among them) as a Counter of its symbols, and its int factor
    under ``1``; None if a dim is unknown (or one shape inference made up, ``unk__3``, which stands for no
    known product)."""
    out: Counter = Counter({1: 1})
    for d in dims:
        if d is None or isinstance(d, str) and d.startswith("unk__"):
            return None
        if isinstance(d, str) and "*" in d:  # the dynamo exporter's "3*N"
            d = product([int(f) if f.strip().isdigit() else f.strip() for f in d.split("*")])
        if isinstance(d, frozenset):
            d = Counter(dict(d))
        if isinstance(d, Counter):
            out.update({s: n for s, n in d.items() if s != 1})
            out[1] *= d[1]
        elif isinstance(d, int):
            out[1] *= d
        else:
            out[d] += 1
    return out


def _regroup(before: Sequence | None, axis: int, after: Sequence | None) -> int | None:
    """The axis of ``after`` (a reshape of ``before``) that holds ``before``'s ``axis`` as its
    outermost factor, each of its slices within one row: the dims before it multiply to those
    before ``axis``, and it is the same dim as ``axis`` or the dims after it divide those after
    ``axis``. None when the shapes do not show one."""
    if before is None or after is None:
        return None
    prefix, rest = product(before[:axis]), product(before[axis + 1:])
    if prefix is None:
        return None
    for j in range(len(after)):
        if product(after[:j]) != prefix or product([after[j]]) == Counter({1: 1}):
            continue
        if after[j] == before[axis] and before[axis] is not None:  # as many slices as rows: each slice a row
            return j
        suffix = product(after[j + 1:])
        if suffix is None or rest is None or suffix[1] == 0 or rest[1] % suffix[1]:
            return None
        return j if all(rest[s] >= n for s, n in suffix.items() if s != 1) else None
    return None


@rule("Reshape", "Flatten")
def reshape(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r = only_rows(node, ins, 0)
    before = shape_of(node.inputs[0])
    if node.op_type == "Flatten" and before is not None:
        at = norm_axis(int_attr(node, "axis", 1), len(before))
        after: Sequence | None = [product(before[:at]), product(before[at:])]
    else:
        after = shape_of(node.outputs[0])
    j = _regroup(before, r.axis, after)
    if j is None:
        raise Mixes(f"it reshapes {_shape_text(before)} to {_shape_text(shape_of(node.outputs[0]))}, which "
                    "may put rows together")
    return [replace(r, axis=j)]


def _shape_text(shape: Sequence | None) -> str:
    return "[?]" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
