"""Level 2's fusions of decomposed activations/normalizations into opset-native ONNX ops."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _basics, pattern
from onnxscript.rewriter._rewrite_rule import RewriteRuleClassBase

from graphc.passes.optimize.rules import RulePass, const_array

__all__ = ["fusion_pass"]

_FLOATS = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
SQRT2 = math.sqrt(2.0)


def _scalar_near(value: ir.Value | None, expected: float, rtol: float = 1e-4) -> bool:
    array = const_array(value)
    return array is not None and array.size == 1 and math.isclose(float(array.reshape(())), expected,
                                                                   rel_tol=rtol)


class GeluErf(RewriteRuleClassBase):
    """``0.5 * x * (1 + erf(x / sqrt(2)))`` -> ``Gelu(x)`` (opset 20). ``form`` picks how the
    halving associates (``(x*0.5)*(1+erf)``, ``(x*(1+erf))*0.5``, ``x*(0.5*(1+erf))``,
    ``(x*(1+erf))/2``) and ``scale_op`` how erf's argument is scaled (``x/sqrt2`` or
    ``x*(1/sqrt2)``); Mul/Add operand order is covered by ``commute``. It is the definition of
    Gelu's default (exact, ``approximate="none"``) form, so the rewrite is exact up to rounding."""

    def __init__(self, form: int, scale_op: str):
        super().__init__(f"GeluErf{form}{scale_op}")
        self.form, self.scale_op = form, scale_op

    def pattern(self, op, x, c, half, one):
        erf_in = op.Div(x, c) if self.scale_op == "Div" else op.Mul(x, c)
        cdf = op.Add(op.Erf(erf_in), one)
        if self.form == 0:
            return op.Mul(op.Mul(x, half), cdf)
        if self.form == 1:
            return op.Mul(op.Mul(x, cdf), half)
        if self.form == 2:
            return op.Mul(x, op.Mul(half, cdf))
        return op.Div(op.Mul(x, cdf), half)

    def check(self, context, x, c, half, one) -> _basics.MatchResult:
        result = _basics.MatchResult()
        if x.dtype not in _FLOATS:
            return result.fail("Gelu takes floating-point inputs only")
        c_expected = SQRT2 if self.scale_op == "Div" else 1 / SQRT2
        half_expected = 2.0 if self.form == 3 else 0.5
        if not (_scalar_near(c, c_expected) and _scalar_near(half, half_expected)
                and _scalar_near(one, 1.0)):
            return result.fail("constants are not those of the erf Gelu")
        return result

    def rewrite(self, op, x, **_):
        return op.Gelu(x)


def _reduce_axes(node: ir.Node) -> list[int] | None:
    """A ReduceMean's axes (attribute before opset 18, constant input after), else None."""
    if node.attributes.get_int("keepdims", 1) != 1:
        return None
    if len(node.inputs) > 1:
        axes = const_array(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    attr = node.attributes.get("axes")
    return None if attr is None else list(attr.as_ints())


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
    known rank and static normalized dims (the ones-scale is a constant of that shape)."""

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

    def check(self, context, x, two, eps, mean, var) -> _basics.MatchResult:
        result = _basics.MatchResult()
        if x.dtype not in _FLOATS or x.shape is None:
            return result.fail("needs a floating-point input of known rank")
        if self.square == "Pow" and not _scalar_near(two, 2.0, 0):
            return result.fail("Pow exponent is not 2")
        if const_array(eps) is None or const_array(eps).size != 1:
            return result.fail("epsilon is not a constant scalar")
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
        return op.LayerNormalization(x, scale, axis=axis, epsilon=float(const_array(eps).reshape(())),
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

    def check(self, context, x, ones, gamma, ln) -> _basics.MatchResult:
        result = _basics.MatchResult()
        array = const_array(ones)
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

    def check(self, context, x, scale, beta, ln) -> _basics.MatchResult:
        result = _basics.MatchResult()
        if beta.shape is None or beta.dtype != x.dtype or list(beta.shape) != _normalized_shape(ln.producer()):
            return result.fail("beta's shape is not the normalized shape")
        return result

    def rewrite(self, op, x, scale, beta, ln, **_):
        return op.LayerNormalization(x, scale, beta, **{k: v.value for k, v in ln.producer().attributes.items()})


def fusion_pass(opset: int) -> RulePass | None:
    """The fusions the target opset has ops for: Gelu from 20, LayerNormalization from 17."""
    rules = []
    if opset >= 20:
        rules += [GeluErf.rule(form, scale_op) for form in range(4) for scale_op in ("Div", "Mul")]
    if opset >= 17:
        rules += [LayerNormCore.rule(sq, dv) for sq in ("Pow", "Mul") for dv in ("Div", "Recip")]
        rules += [LayerNormScale.rule(), LayerNormBias.rule()]
    if not rules:
        return None
    return RulePass("Fusions", [r for rule in rules for r in rule.commute()])
