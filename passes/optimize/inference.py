"""Level 3's inference-only rewrites: valid only for a graph that will never be trained."""

from __future__ import annotations

import functools
import json

import numpy as np
import onnx_ir as ir

from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.optimize.rules import RulePass, initializer
from graphc.passes.values import (AUTOGRAD_KEY, DROPPED_MARKS_KEY, STOP_GRADIENT_KEY, autograd_function_label,
                                  draws_random, drop_autograd_functions, fixed_array, stops_gradient)

__all__ = ["ScaleIntoLinear", "StopGradientRemoval", "inference_pass"]


class FoldBatchNorm(RewriteRuleClassBase):
    """``BatchNormalization(Conv(x, W, B))`` -> ``Conv(x, W', B')`` (and the same for
    ConvTranspose and Gemm), W' = W * gamma/std along the output-channel axis, B' = (beta_g * B -
    mean) * gamma/std + beta (``beta_g``: Gemm's bias scale, dropped from the node). Exact up to
    rounding when the BatchNormalization runs in inference mode (``training_mode`` absent or 0,
    one output): it then normalizes with its stored statistics, an affine map per channel.
    Needs W, B and the statistics to be constants (initializers or ``Constant`` outputs: Paddle's
    exports hold every weight in one) no graph input overrides. Sound where the weight or bias is
    shared too (a block applied twice, as ShuffleNet's): the folded tensors are then new
    initializers read by this node only (``_fused_names``) and every other reader keeps the
    originals (equal folded copies are merged by the dedup later).

    onnxscript's ``fuse_batchnorm_into_*_rule`` (same arithmetic, same names and attributes)
    also fold a training-mode BatchNormalization, which normalizes with the batch's statistics
    (no upstream issue found for onnxscript 0.7), and refuse shared weights; they are written
    here with those checks, building the tensors with ``ir.Tensor`` directly (``ir.tensor()``
    first tests its argument against runtime-checkable protocols, which on Python 3.11 costs
    more than the folding arithmetic)."""

    def __init__(self, op_type: str):
        super().__init__(f"FuseBatchNormInto{op_type}")
        self.op_type = op_type

    def pattern(self, op, x):
        inbound = getattr(op, self.op_type)(x, _allow_other_inputs=True, _outputs=["inbound_out"])
        return op.BatchNormalization(inbound, _allow_other_inputs=True, _outputs=["batchnorm_out"])

    def check(self, context, x, inbound_out: ir.Value, batchnorm_out: ir.Value) -> MatchResult:
        del context
        result = MatchResult()
        bn, inbound = batchnorm_out.producer(), inbound_out.producer()
        if bn.attributes.get_int("training_mode", 0) != 0 or len(bn.outputs) != 1:
            return result.fail("BatchNormalization is in training mode")
        for value in [*inbound.inputs[1:3], *bn.inputs[1:]]:
            if value is not None and (value.is_graph_input() or ir.convenience.get_const_tensor(value) is None):
                return result.fail(f"{value.name} is not a constant")
        if any(name in bn.graph.initializers for name in _fused_names(inbound, batchnorm_out)[2:]):
            return result.fail("a folded tensor's name is taken")
        if self.op_type == "ConvTranspose":  # its weight scaling needs the input channels split evenly
            channels = inbound.inputs[1].shape[0] if inbound.inputs[1].shape is not None else None
            if not isinstance(channels, int) or channels % inbound.attributes.get_int("group", 1):
                return result.fail("the input channels do not split evenly into the groups")
        return result

    def rewrite(self, op, x: ir.Value, inbound_out: ir.Value, batchnorm_out: ir.Value):
        batchnorm_node = batchnorm_out.producer()
        gamma, beta, input_mean, input_var = [_array(inp) for inp in batchnorm_node.inputs[1:]]
        attr = batchnorm_node.attributes.get("epsilon")
        eps = attr.as_float() if attr is not None else 1e-5  # the ONNX default
        scale_factor = gamma / np.sqrt(input_var + eps)
        inbound_node = inbound_out.producer()
        fused_weights = ir.Tensor(self._scale_weights(_array(inbound_node.inputs[1]), scale_factor,
                                                      inbound_node.attributes))
        # Gemm scales its bias by "beta" (default 1): folded into the bias, dropped from the node
        new_attributes = dict(inbound_node.attributes)
        gemm_beta_attr = new_attributes.pop("beta", None)
        gemm_beta = gemm_beta_attr.as_float() if gemm_beta_attr is not None else 1.0
        has_bias = len(inbound_node.inputs) > 2 and inbound_node.inputs[2] is not None
        original_bias = _array(inbound_node.inputs[2]) if has_bias else np.zeros_like(input_mean)
        fused_bias = ir.Tensor((gemm_beta * original_bias - input_mean) * scale_factor + beta)
        weight_name, bias_name = _fused_names(inbound_node, batchnorm_out)[:2]
        return op.op(self.op_type, x, op.initializer(fused_weights, name=weight_name),
                     op.initializer(fused_bias, name=bias_name), **new_attributes)

    def _scale_weights(self, weights: np.ndarray, scale: np.ndarray, attributes) -> np.ndarray:
        """W times ``scale`` along its output-channel axis: Conv's axis 0, Gemm's 1 (0 under
        ``transB``), ConvTranspose's [C, M/group, ...] per group (output channel g*M/group + j)."""
        if self.op_type == "ConvTranspose":
            group = attributes.get_int("group", 1)
            grouped = weights.reshape(group, weights.shape[0] // group, *weights.shape[1:])
            per_group = scale.reshape(group, 1, weights.shape[1], *[1] * (weights.ndim - 2))
            return (grouped * per_group).reshape(weights.shape)
        axis = 1 if self.op_type == "Gemm" and not attributes.get_int("transB", 0) else 0
        return weights * np.reshape(scale, [-1 if i == axis else 1 for i in range(weights.ndim)])


def _fused_names(inbound: ir.Node, batchnorm_out: ir.Value) -> tuple[str, ...]:
    """(weight, bias) names of the folded tensors, then those of them that are new: the
    originals' where they are initializers only this node reads (the folded tensors replace
    them), else names of their own after the BatchNormalization's output."""
    weight = inbound.inputs[1]
    bias = inbound.inputs[2] if len(inbound.inputs) > 2 else None
    own = [v is not None and v.is_initializer() and all(user is inbound for user, _ in v.uses())
           for v in (weight, bias)]
    names = (weight.name if own[0] else f"{batchnorm_out.name}_weight",
             bias.name if own[1] else f"{weight.name}_bias" if own[0] and bias is None else f"{batchnorm_out.name}_bias")
    return (*names, *(n for n, kept in zip(names, own) if not kept))


def _array(value: ir.Value) -> np.ndarray:
    return ir.convenience.get_const_tensor(value).numpy()


class DropoutInference(RewriteRuleClassBase):
    """``Dropout(x)`` -> x when its mask output is unused and it cannot be in training mode (it
    does not ``draws_random``): before opset 12 Dropout has no training switch and inference
    runtimes apply it as identity; from 12 on, ``training_mode`` must be absent or a constant
    false (onnxscript's folder already handles those; this covers the older opsets too)."""

    def pattern(self, op, x):
        return op.Dropout(x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        return result.fail("training_mode may be true") if draws_random(y.producer()) else result

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class ConvAddBias(RewriteRuleClassBase):
    """``Add(Conv(x, W[, B]), c)`` -> ``Conv(x, W, B')`` with ``B' = B + c`` (B absent: 0) for
    a constant c that is the same over every axis but the channel one: right-aligned to the
    output's rank its dims are all 1 but dim 1, which is 1 or the output channels M (a scalar,
    [M, 1, 1], [1, M, 1, 1]; Paddle's exports add each Conv's bias so). Sound: the Conv adds
    ``B[m]`` to every element of channel m, so adding ``c[m]`` too is adding ``B[m] + c[m]``
    (up to rounding), and such a c does not broadcast the output to a larger shape. The Conv's
    output must have no other reader (the matcher's rule for a pattern's inner values). The
    same for ConvTranspose (``op_type``), whose bias is per output channel too.
    Inference only: B' replaces a parameter."""

    def __init__(self, op_type: str = "Conv"):
        super().__init__(f"{op_type}AddBias")
        self.op_type = op_type

    def pattern(self, op, x, c):
        conv = getattr(op, self.op_type)(x, _allow_other_inputs=True, _outputs=["conv_out"])
        return op.Add(conv, c, _outputs=["total"])

    def check(self, context, x, c, conv_out, total) -> MatchResult:
        del context
        result = MatchResult()
        if _channel_shift(c, conv_out) is None:
            return result.fail("the added value is not a constant per output channel")
        conv = conv_out.producer()
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if bias is not None and (bias.is_graph_input() or ir.convenience.get_const_tensor(bias) is None):
            return result.fail("the Conv's bias is not a constant")
        if f"{total.name}_bias" in conv.graph.initializers:
            return result.fail("the new bias's name is taken")
        return result

    def rewrite(self, op, x, c, conv_out, total):
        conv = conv_out.producer()
        shift = _channel_shift(c, conv_out)
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        new = shift if bias is None else _array(bias) + shift
        new_bias = op.initializer(ir.Tensor(new.astype(shift.dtype)), name=f"{total.name}_bias")
        return op.op(self.op_type, x, conv.inputs[1], new_bias, **conv.attributes)


def _channel_shift(c: ir.Value, conv_out: ir.Value) -> np.ndarray | None:
    """c as a vector over the Conv's M output channels, where it is a constant the same over
    every other axis of the output (see ``ConvAddBias``), else None."""
    tensor = None if c.is_graph_input() else ir.convenience.get_const_tensor(c)
    conv = conv_out.producer()
    weight = conv.inputs[1]
    axis = 1 if conv.op_type == "ConvTranspose" else 0  # ConvTranspose: [C, M / group, ...]
    if (tensor is None or weight.shape is None or not isinstance(weight.shape[axis], int) or conv_out.shape is None
            or conv_out.dtype is None):
        return None
    channels = weight.shape[axis] * (conv.attributes.get_int("group", 1) if axis else 1)
    value, rank = tensor.numpy(), len(conv_out.shape)
    if value.ndim > rank or value.dtype != conv_out.dtype.numpy():
        return None
    dims = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(dims) if i != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).copy()


@functools.cache  # rule sets are stateless between runs; building them costs ~10 ms
def inference_pass() -> RulePass:
    """Conv/Gemm + inference-mode BatchNormalization folded into the Conv/Gemm weights and bias
    (W' = W * gamma/std, B' = (B - mean) * gamma/std + beta), a per-channel constant added
    after a Conv folded into its bias, and inference Dropout removed."""
    folds = [FoldBatchNorm(op_type) for op_type in ("Conv", "ConvTranspose", "Gemm")]
    biases = [ConvAddBias(op_type) for op_type in ("Conv", "ConvTranspose")]
    return RulePass("InferenceRewrites", [*folds, *biases, DropoutInference()], commute=True)


class StopGradientRemoval(Declared, ir.passes.InPlacePass):
    """``gc.detach``'s stop-gradient marks dropped: an inference graph has no gradient to stop,
    and each marked Identity becomes a plain one that identity elimination removes; so are a
    ``gc.autograd.Function``'s marks on its outputs and its backward (``drop_autograd_functions``).
    The model's ``DROPPED_MARKS_KEY`` names each such Function and counts the other marks, for
    autodiff to refuse the model."""

    name = "StopGradientRemoval"
    idempotent = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        marked = [node for node in all_nodes(model.graph) if stops_gradient(node)]
        dropped = json.loads(model.metadata_props.get(DROPPED_MARKS_KEY, '{"functions": [], "stop_gradients": 0}'))
        for node in marked:
            del node.metadata_props[STOP_GRADIENT_KEY]
            text = node.metadata_props.pop(AUTOGRAD_KEY, None)
            if text is None:
                dropped["stop_gradients"] += 1
            elif (where := autograd_function_label(json.loads(text))) not in dropped["functions"]:
                dropped["functions"].append(where)
        if marked:
            model.metadata_props[DROPPED_MARKS_KEY] = json.dumps(dropped)
        return ir.passes.PassResult(model, bool(marked) | drop_autograd_functions(model))


class ScaleIntoLinear(Declared, ir.passes.InPlacePass):
    """``Mul(Gemm(a, B, C), c)`` -> ``Gemm(a, B', C')`` and ``Mul(MatMul(a, B), c)`` ->
    ``MatMul(a, B')`` for constant B (read by nothing else) and C, where c is a constant that
    scales only the output's last axis (its dims, right-aligned, are all 1 but the last, which
    is 1 or N, and it has no more axes than the product): B' is B with column n (row n under
    ``transB``) times c[n], C' = C * c. A ``Reshape`` may sit between the product [M, N] and
    the Mul when its output's last dim is N too. Sound because scaling column n of a product
    scales column n of B: ``(alpha*a@B + beta*C) * c = alpha*a@(B*c) + beta*(C*c)`` (up to
    rounding), and a Reshape whose last dim is N keeps each element's column (flat index
    m*N + n ends in n). ConvNeXt's layer scale (``gamma * Linear(x)``) goes into the weights.
    Inference only: B' replaces a parameter."""

    name = "ScaleIntoLinear"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
                continue
            for pos in (0, 1):
                linear = self._linear(node.inputs[pos], node.inputs[1 - pos])
                if linear is not None:
                    self._fold(node, node.inputs[pos], linear, fixed_array(node.inputs[1 - pos]).reshape(-1))
                    modified = True
                    break
        return ir.passes.PassResult(model, modified)

    @staticmethod
    def _linear(y: ir.Value | None, c: ir.Value | None) -> ir.Node | None:
        """The Gemm/MatMul whose scaled output y is (see the class docstring), else None."""
        scale = fixed_array(c)
        if y is None or y.shape is None or scale is None or y.dtype != c.dtype or scale.ndim > len(y.shape):
            return None
        node, product = y.producer(), y
        if node is not None and node.op_type == "Reshape" and _single_use(y):
            product = node.inputs[0]
            node = product.producer() if product is not None else None
        if node is None or node.op_type not in ("Gemm", "MatMul") or node.domain not in ("", "ai.onnx") \
                or not _single_use(product) or product.shape is None or node.graph is not y.producer().graph:
            return None
        n = product.shape[-1] if len(product.shape) else None
        b = node.inputs[1]
        if not isinstance(n, int) or y.shape[-1] != n or fixed_array(b) is None or len(b.uses()) != 1 \
                or fixed_array(b).ndim != 2 or (len(node.inputs) > 2 and node.inputs[2] is not None
                                                and fixed_array(node.inputs[2]) is None):
            return None
        if any(d != 1 for d in scale.shape[:-1]) or (scale.ndim and scale.shape[-1] not in (1, n)):
            return None
        return node

    @staticmethod
    def _fold(mul: ir.Node, y: ir.Value, linear: ir.Node, scale: np.ndarray) -> None:
        graph = linear.graph
        b = fixed_array(linear.inputs[1])
        column = scale[:, None] if linear.attributes.get_int("transB", 0) else scale
        linear.replace_input_with(1, initializer(graph, f"{linear.inputs[1].name}_scaled", b * column))
        if len(linear.inputs) > 2 and linear.inputs[2] is not None:
            c = fixed_array(linear.inputs[2])
            linear.replace_input_with(2, initializer(graph, f"{linear.inputs[2].name}_scaled", c * scale))
        identity = ir.Node("", "Identity", [y], metadata_props=dict(mul.metadata_props))
        ir.convenience.replace_nodes_and_values(graph, mul, [mul], [identity], mul.outputs, identity.outputs)


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()
