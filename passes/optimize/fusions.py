"""Level 2's fusions of decomposed activations/normalizations into opset-native ONNX ops."""

from __future__ import annotations

import functools

import math

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from graphc.passes.optimize.rules import RulePass
from graphc.passes.values import const_axes, fixed_array

__all__ = ["fusion_passes"]

_FLOATS = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
SQRT2 = math.sqrt(2.0)


def _scalar_near(value: ir.Value | None, expected: float, exact: bool = False) -> bool:
    """``value`` is a one-element constant equal to ``expected`` rounded to its dtype: within that dtype's
    machine epsilon, relative (``exact``: equal). A looser match (1e-4, before) fused a float64 model's
    float32-rounded sqrt(2) into a Gelu that divides by the exact one: 5e-9 off, where float64 keeps 1e-16."""
    array = fixed_array(value)
    if array is None or array.size != 1:
        return False
    try:
        rtol = 0.0 if exact else float(ml_dtypes.finfo(array.dtype).eps)
    except ValueError:  # an integer constant: compared exactly
        rtol = 0.0
    return math.isclose(float(array.reshape(())), expected, rel_tol=rtol)


class GeluErf(RewriteRuleClassBase):
    """``0.5 * x * (1 + erf(x / sqrt(2)))`` -> ``Gelu(x)`` (opset 20), which is that formula's
    definition (``approximate="none"``): exact up to rounding. One rule per association:
    erf's argument is ``x/sqrt2`` (``scale="Div"``) or ``x*(1/sqrt2)`` (``"Mul"``); with
    ``cdf = 1 + erf(...)`` the product is ``(x*0.5)*cdf`` (``outer="HalfFirst"``),
    ``(x*cdf)*0.5`` (``"HalfLast"``), ``(x*cdf)/2`` (``"DivTwo"``) or ``x*(0.5*cdf)``
    (``"HalfCdf"``); ``RulePass(commute=True)`` adds each Mul/Add's other operand order. The
    constants are checked to their dtype's rounding (``_scalar_near``) and x must be floating-point; the
    rewriter replaces a match only when no intermediate has another user or is a graph output."""

    def __init__(self, scale: str, outer: str):
        super().__init__(f"Gelu{scale}{outer}")
        self.scale, self.outer = scale, outer

    def pattern(self, op, x, s, one, c):
        arg = op.Div(x, s) if self.scale == "Div" else op.Mul(x, s)
        cdf = op.Add(op.Erf(arg), one)
        if self.outer == "HalfFirst":
            return op.Mul(op.Mul(x, c), cdf)
        if self.outer == "HalfLast":
            return op.Mul(op.Mul(x, cdf), c)
        if self.outer == "DivTwo":
            return op.Div(op.Mul(x, cdf), c)
        return op.Mul(x, op.Mul(c, cdf))

    def check(self, context, x, s, one, c) -> MatchResult:
        result = MatchResult()
        if x.dtype not in _FLOATS:
            return result.fail("needs a floating-point input")
        if not _scalar_near(s, SQRT2 if self.scale == "Div" else 1 / SQRT2):
            return result.fail("erf's argument is not x / sqrt(2)")
        if not _scalar_near(one, 1.0) or not _scalar_near(c, 2.0 if self.outer == "DivTwo" else 0.5):
            return result.fail("not 0.5 * x * (1 + erf(...))")
        return result

    def rewrite(self, op, x, **_):
        return op.Gelu(x)


def _reduce_axes(node: ir.Node) -> list[int] | None:
    """A ReduceMean's axes (attribute before opset 18, constant input after), else None."""
    return const_axes(node) if node.attributes.get_int("keepdims", 1) == 1 else None


def _trailing_axis(axes: list[int] | None, rank: int) -> int | None:
    """The first axis when ``axes`` are exactly the last k axes of a rank-``rank`` tensor."""
    if not axes:
        return None
    normal = sorted(a % rank for a in axes)
    return normal[0] if normal == list(range(rank - len(normal), rank)) else None


class LayerNormCore(RewriteRuleClassBase):
    """``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over trailing axes ->
    ``LayerNormalization(x, ones, axis, epsilon=eps)`` (opset 17), the definition of the op with
    unit scale and no bias (computed in float32 or wider: ``stash_type=1``). The square may be
    ``Pow(d, 2)`` or ``d*d``; the division ``Div(d, std)`` or ``d * Reciprocal(std)``. Needs a
    known rank, static normalized dims (the ones-scale is a constant of that shape) and an epsilon that
    float32, the attribute's type, holds exactly."""

    def __init__(self, square: str, divide: str):
        super().__init__(f"LayerNorm{square}{divide}")
        self.square, self.divide = square, divide

    def pattern(self, op, x, two, eps):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        d = op.Sub(x, mean)
        sq = op.Pow(d, two) if self.square == "Pow" else op.Mul(d, d)
        var = op.ReduceMean(sq, _allow_other_inputs=True, _outputs=["var"])
        std = op.Sqrt(op.Add(var, eps))
        return op.Div(d, std) if self.divide == "Div" else op.Mul(d, op.Reciprocal(std))

    def check(self, context, x, two, eps, mean, var) -> MatchResult:
        result = MatchResult()
        if x.dtype not in _FLOATS or x.shape is None:
            return result.fail("needs a floating-point input of known rank")
        if self.square == "Pow" and not _scalar_near(two, 2.0, exact=True):
            return result.fail("Pow exponent is not 2")
        if fixed_array(eps) is None or fixed_array(eps).size != 1:
            return result.fail("epsilon is not a constant scalar")
        epsilon = float(fixed_array(eps).reshape(()))
        if float(np.float32(epsilon)) != epsilon:
            # the op's epsilon is a float32 attribute: a float64 model's 1e-5 rounded to it moved outputs by 1e-12
            return result.fail("epsilon is not a float32 value (the attribute would round it)")
        rank = len(x.shape)
        axis_m = _trailing_axis(_reduce_axes(mean.producer()), rank)
        axis_v = _trailing_axis(_reduce_axes(var.producer()), rank)
        if axis_m is None or axis_m != axis_v:
            return result.fail("means are not over the same trailing axes")
        if not all(isinstance(d, int) for d in x.shape[axis_m:]):
            return result.fail("normalized dims are not static")
        return result

    def rewrite(self, op, x, eps, mean, **_):
        rank = len(x.shape)
        axis = _trailing_axis(_reduce_axes(mean.producer()), rank)
        norm_shape = [int(d) for d in x.shape[axis:]]
        ones = ir.tensor(np.ones(norm_shape, dtype=x.dtype.numpy()))
        scale = op.initializer(ones, name=f"{mean.name}/ln_scale")
        return op.LayerNormalization(x, scale, axis=axis, epsilon=float(fixed_array(eps).reshape(())),
                                     stash_type=1)


def _normalized_shape(ln: ir.Node) -> list | None:
    x = ln.inputs[0]
    if x.shape is None:
        return None
    return list(x.shape[ln.attributes.get_int("axis", -1) % len(x.shape):])


class LayerNormScale(RewriteRuleClassBase):
    """``LayerNormalization(x, ones) * gamma`` -> ``LayerNormalization(x, gamma)`` when gamma's
    shape is exactly the normalized shape (so the product neither broadcasts nor grows); the op
    multiplies by its scale last, so this is its definition."""

    def pattern(self, op, x, ones, gamma):
        return op.Mul(op.LayerNormalization(x, ones, _outputs=["ln"]), gamma)

    def check(self, context, x, ones, gamma, ln) -> MatchResult:
        result = MatchResult()
        array = fixed_array(ones)
        if array is None or not np.all(array == 1):
            return result.fail("LayerNormalization already has a scale")
        if gamma.shape is None or gamma.dtype != x.dtype or list(gamma.shape) != _normalized_shape(ln.producer()):
            return result.fail("gamma's shape is not the normalized shape")
        return result

    def rewrite(self, op, x, gamma, ln, **_):
        return op.LayerNormalization(x, gamma, **{k: v.value for k, v in ln.producer().attributes.items()})


class LayerNormBias(RewriteRuleClassBase):
    """``LayerNormalization(x, scale) + beta`` -> ``LayerNormalization(x, scale, beta)`` when
    beta's shape is exactly the normalized shape: the op adds its bias last."""

    def pattern(self, op, x, scale, beta):
        return op.Add(op.LayerNormalization(x, scale, _outputs=["ln"]), beta)

    def check(self, context, x, scale, beta, ln) -> MatchResult:
        result = MatchResult()
        if beta.shape is None or beta.dtype != x.dtype or list(beta.shape) != _normalized_shape(ln.producer()):
            return result.fail("beta's shape is not the normalized shape")
        return result

    def rewrite(self, op, x, scale, beta, ln, **_):
        return op.LayerNormalization(x, scale, beta, **{k: v.value for k, v in ln.producer().attributes.items()})


def fusion_passes(opset: int) -> list[ir.passes.PassBase]:
    """The fusions the target opset has ops for: Gelu from 20, LayerNormalization from 17."""
    passes: list[ir.passes.PassBase] = [_gelu_pass()] if opset >= 20 else []
    layer_norm = _layer_norm_pass(opset)
    return passes + ([layer_norm] if layer_norm else [])


@functools.cache  # rule sets are stateless between runs
def _gelu_pass() -> RulePass:
    rules = [GeluErf(scale, outer) for scale in ("Div", "Mul") for outer in ("HalfFirst", "HalfLast", "DivTwo", "HalfCdf")]
    return RulePass("GeluFusion", rules, guard=_near_erf_sum, commute=True)


def _near_erf_sum(node: ir.Node) -> bool:
    """A quick necessary condition on a Gelu rule's root, over the many Mul/Div nodes of
    training graphs: it reads ``cdf = Add(Erf(...), 1)`` and a Mul (``(x*0.5)*cdf``), or a Mul
    that reads cdf (the other forms); cdf and erf's output have one user each, as a match
    needs. A backward pass that reads the forward's cdf, or the Gelu gradient's own
    ``0.5 * cdf``, fails it, and then ``RulePass`` skips the whole graph."""
    if len(node.inputs) != 2:
        return False
    producers = [v.producer() if v is not None else None for v in node.inputs]
    for k, producer in enumerate(producers):
        other = producers[1 - k]
        if _is_erf_sum(producer) and other is not None and other.op_type == "Mul":
            return True
        if producer is not None and producer.op_type == "Mul" and any(
                v is not None and _is_erf_sum(v.producer()) for v in producer.inputs):
            return True
    return False


def _is_erf_sum(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == "Add" and len(node.outputs[0].uses()) == 1 and any(
        v is not None and v.producer() is not None and v.producer().op_type == "Erf" and len(v.uses()) == 1
        for v in node.inputs)


@functools.cache  # rule sets are stateless between runs; building them costs ~10 ms
def _layer_norm_pass(opset: int) -> RulePass | None:
    rules = []
    if opset >= 17:
        rules += [LayerNormCore(sq, dv) for sq in ("Pow", "Mul") for dv in ("Div", "Recip")]
        rules += [LayerNormScale(), LayerNormBias()]
    if not rules:
        return None
    return RulePass("LayerNormFusion", rules, guard=_after_std_or_ln, commute=True)


def _after_std_or_ln(node: ir.Node) -> bool:
    """Every LayerNorm rule's root reads a Sqrt/Reciprocal (the core) or a LayerNormalization
    (scale/bias folding): a quick filter over the many Mul/Div/Add nodes of training graphs."""
    return any(v is not None and v.producer() is not None
               and v.producer().op_type in ("Sqrt", "Reciprocal", "LayerNormalization") for v in node.inputs)
