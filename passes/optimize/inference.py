"""Level 3's inference-only rewrites: valid only for a graph that will never be trained."""

from __future__ import annotations

import functools

from onnxscript.rewriter import _basics
from onnxscript.rewriter._rewrite_rule import RewriteRuleClassBase
from onnxscript.rewriter.rules.common import _fuse_batchnorm

from graphc.passes.optimize.rules import RulePass, const_array

__all__ = ["inference_pass"]


def _inference_bn(check):
    """Wraps onnxscript's BN-folding check (constant, unshared, non-input params) with the
    condition it leaves out: the BatchNormalization runs in inference mode (``training_mode``
    absent or 0, one output), i.e. normalizes with the stored running mean/var, an affine map."""

    def checked(self, context, x, inbound_out, batchnorm_out) -> _basics.MatchResult:
        bn = batchnorm_out.producer()
        if bn.attributes.get_int("training_mode", 0) != 0 or len(bn.outputs) != 1:
            return _basics.MatchResult().fail("BatchNormalization is in training mode")
        return check(self, context, x, inbound_out, batchnorm_out)

    return checked


def _bn_rules():
    rules = []
    for base in (_fuse_batchnorm.FuseBatchNormIntoConv, _fuse_batchnorm.FuseBatchNormIntoGemm):
        cls = type(base.__name__, (base,), {"check": _inference_bn(base.check)})
        rules.append(cls().rule())
    return rules


class DropoutInference(RewriteRuleClassBase):
    """``Dropout(x)`` -> x when its mask output is unused and it cannot be in training mode:
    before opset 12 Dropout has no training switch and inference runtimes apply it as identity;
    from 12 on, ``training_mode`` must be absent or a constant false (onnxscript's folder
    already handles those; this covers the older opsets too)."""

    def pattern(self, op, x):
        return op.Dropout(x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> _basics.MatchResult:
        result = _basics.MatchResult()
        node = y.producer()
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            mode = const_array(node.inputs[2])
            if mode is None or bool(mode.reshape(-1)[0]):
                return result.fail("training_mode may be true")
        return result

    def rewrite(self, op, x, **_):
        return op.Identity(x)


@functools.cache  # rule sets are stateless between runs; building them costs ~10 ms
def inference_pass() -> RulePass:
    """Conv/Gemm + inference-mode BatchNormalization folded into the Conv/Gemm weights and bias
    (W' = W * gamma/std, B' = (B - mean) * gamma/std + beta), and inference Dropout removed."""
    return RulePass("InferenceRewrites", [*_bn_rules(), DropoutInference().rule()])

