"""Reverse-mode automatic differentiation of ONNX graphs (a graph transform, standard ops only).

    from graphc.passes.autodiff import backward, gradient_model, RULES

``backward(graph, loss, wrt)`` appends gradient nodes to an ``onnx_ir`` graph in place and
returns ``{param name: gradient value}``; ``gradient_model(model, loss, wrt)`` returns a new
model whose inputs add the params and whose outputs add ``<param>_grad`` (what ``gc.grad``
returns); ``RULES`` maps each differentiable ONNX op type to its VJP rule (``registry.py``).

Conventions (each written next to its rule too):

- kinks follow PyTorch: Relu/LeakyRelu/Elu/Selu/PRelu take the x <= 0 branch at 0; Abs and
  Sign-like ops give 0 at 0; Clip passes the gradient at the boundaries (min <= x <= max);
  Max/Min/ReduceMax/ReduceMin/GlobalMaxPool split ties evenly (torch.maximum gives 0.5/0.5,
  torch.amax shares among ties); MaxPool sends each window's gradient to its Indices output
  (the first maximum, as PyTorch); Pow's exponent gradient is 0 where base == 0.
- no gradient (``None``): integer/bool inputs, shape and index inputs, Dropout's ratio,
  Resize's roi/scales/sizes, BatchNormalization's running statistics in training mode. Other op
  settings (``SETTING_INPUTS``: Clip bounds, Pad's value, Pow's exponent, class weights of the
  fused losses) get their exact gradient; ``gc.training.generate`` does not train any of them
  by default.
- an op without a rule that ONNX defines as a function of other ops (Mish, Swish, SwiGLU,
  RMSNormalization, Attention, RotaryEmbedding, ReduceL1, ...) is differentiated through its
  body (``graphc.passes.functions``), expanded in the gradient graphs only; RNN, GRU and LSTM
  are unrolled over a static sequence length (``recurrent.py``) the same way, and become a Scan
  over the same cell for a length known only at run time. A Softmax
  whose output a Where selects from (Attention's fully masked rows) gives 0, not NaN, to the
  rows it discards, as torch's scaled_dot_product_attention does.
- integer values computed from constants only (pads, shapes, axes exporters build with
  ConstantOfShape/Concat/Transpose/Cast) are folded into initializers first
  (``model.fold_integer_values``), so shape inference sees the shapes they produce; small
  integer constants a subgraph reads from an outer graph (a branch's Unsqueeze axes) are copied
  into it, since onnx's inference reads no data across scopes.
- a ``wrt`` value with no path to the loss gets zeros of its shape; an op without a rule on a
  path raises ``GraphError`` naming op, node and ``graphc.source`` line (and, for a body node,
  the op it was expanded from); so does a gradient reaching an output its rule does not cover
  (BatchNormalization's running statistics excepted, as above): it is never dropped.
- sequences: one whose length the shapes and constants decide becomes tensors first
  (``loops.lower_sequences``); any other has a gradient of its own, a sequence of its elements'
  gradients (``rules_sequence.py``), summed and zero-filled with ``SequenceMap`` (opset >= 17).
- limits: Conv/ConvTranspose/pooling need static spatial dims and channels (the batch may be
  symbolic); ConvTranspose explicit pads or an ``output_shape`` no larger than its size without
  pads (not ``auto_pad``); a Loop whose number of steps is known before run time (a constant trip count, or an
  exit condition computed from constants and integers it carries, as dynamo's EmbeddingBag writes)
  is unrolled (``loops.py``: Ifs in the body included, the sequences it builds lowered to Concat);
  any other Loop, and a Scan whose length is known only at run time, get reverse mode through a
  recorded tape (a backward Loop), if the body carries no sequence; a Scan of static length is
  unrolled; Resize needs static sizes on the axes it resizes and scales/sizes known before run
  time (an aspect-ratio policy not with tf_crop_and_resize); Einsum a static size for a letter
  repeated in one operand (a diagonal); CumProd a constant axis with a static length; Pad constant
  pads (and in edge/reflect/wrap mode static sizes on the padded axes); Gather, GatherElements, GatherND and MaxPool
  need opset >= 16 (ScatterElements with reduction).
"""

from graphc.passes.autodiff import (  # noqa: F401  (importing registers the rules)
    rules_activations,
    rules_concat,
    rules_control,
    rules_elementwise,
    rules_fused,
    rules_indexing,
    rules_linalg,
    rules_loss,
    rules_nn,
    rules_norm,
    rules_reduce,
    rules_sequence,
    rules_shape,
)
from graphc.passes.autodiff.core import backprop, backward
from graphc.passes.autodiff.model import gradient_model
from graphc.passes.autodiff.registry import RULES, SETTING_INPUTS, GradRule, get_grad_rule, grad_rule

__all__ = ["RULES", "SETTING_INPUTS", "GradRule", "backprop", "backward", "get_grad_rule", "grad_rule", "gradient_model"]
