"""Reverse-mode automatic differentiation of ONNX graphs (a graph transform, standard ops only).

    from graphc.passes.autodiff import backward, gradient_model, RULES

``backward(graph, loss, wrt)`` appends gradient nodes to an ``onnx_ir`` graph in place;
``gradient_model(model, loss, wrt)`` returns a new model whose outputs add ``<param>_grad``;
``RULES`` maps each differentiable ONNX op type to its VJP rule.
"""

from graphc.passes.autodiff import (  # noqa: F401  (importing registers the rules)
    rules_control,
    rules_elementwise,
    rules_linalg,
    rules_nn,
    rules_reduce,
    rules_shape,
)
from graphc.passes.autodiff.core import backprop, backward
from graphc.passes.autodiff.model import gradient_model
from graphc.passes.autodiff.registry import RULES, GradRule, get_grad_rule, grad_rule

__all__ = ["RULES", "GradRule", "backprop", "backward", "get_grad_rule", "grad_rule", "gradient_model"]
