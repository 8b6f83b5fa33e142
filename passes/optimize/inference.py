"""Level 3's inference-only rewrites: valid only for a graph that will never be trained."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

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


def _fold_bn(self, op, x: ir.Value, inbound_out: ir.Value, batchnorm_out: ir.Value):
    """onnxscript's ``_FuseBatchNormBase.rewrite`` (same arithmetic, same names and attributes),
    building the folded tensors with ``ir.Tensor`` directly: ``ir.tensor()`` first tests its
    argument against runtime-checkable protocols, which on Python 3.11 costs more than the
    folding arithmetic itself."""
    batchnorm_node = batchnorm_out.producer()
    gamma, beta, input_mean, input_var = [inp.const_value.numpy() for inp in batchnorm_node.inputs[1:]]
    attr = batchnorm_node.attributes.get("epsilon")
    eps = attr.as_float() if attr is not None else 1e-5  # the ONNX default
    scale_factor = gamma / np.sqrt(input_var + eps)
    inbound_node = inbound_out.producer()
    weights = inbound_node.inputs[1].const_value.numpy()
    fused_weights = ir.Tensor(self._scale_weights(weights, scale_factor, inbound_node.attributes))
    # Gemm scales its bias by "beta" (default 1): folded into the bias, dropped from the node
    new_attributes = dict(inbound_node.attributes)
    gemm_beta_attr = new_attributes.pop("beta", None)
    gemm_beta = gemm_beta_attr.as_float() if gemm_beta_attr is not None else 1.0
    if len(inbound_node.inputs) > 2:
        original_bias = inbound_node.inputs[2].const_value.numpy()
        bias_name = inbound_node.inputs[2].name
    else:
        original_bias = np.zeros_like(input_mean)
        bias_name = inbound_node.inputs[1].name + "_bias"
    fused_bias = ir.Tensor((gemm_beta * original_bias - input_mean) * scale_factor + beta)
    return op.op(self.op_type, x, op.initializer(fused_weights, name=inbound_node.inputs[1].name),
                 op.initializer(fused_bias, name=bias_name), **new_attributes)


def _bn_rules():
    rules = []
    for base in (_fuse_batchnorm.FuseBatchNormIntoConv, _fuse_batchnorm.FuseBatchNormIntoGemm):
        cls = type(base.__name__, (base,), {"check": _inference_bn(base.check), "rewrite": _fold_bn})
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

