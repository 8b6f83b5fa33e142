"""A loss spec on a complex model output (``graphc.model.complex_io``: the output is its ``[..., 2]`` real pair).
torch's ``l1_loss`` takes complex Tensors, the mean modulus ``|pred - label|``; with it the label is complex too
(the graphs record it as a complex input, so a complex array or its pair feeds it). The other ``gc.losses`` are
refused, as torch's functionals refuse complex Tensors."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from graphc.compile.losses import LossSpec
from graphc.model import Model
from graphc.model.complex_io import complex_names, complex_spec, record
from graphc.model.dtypes import type_text

_TORCH_NAMES = {"mse": "mse_loss", "huber": "huber_loss", "cross_entropy": "cross_entropy",
                "bce_with_logits": "binary_cross_entropy_with_logits"}


def complex_output(model: Model, spec: LossSpec) -> bool:
    """Whether ``spec``'s output is complex; a ValueError naming the loss and the output's dtype where its kind
    does not take one (all but ``l1``)."""
    if spec.output not in complex_names(model.ir.metadata_props)[1]:
        return False
    if spec.kind != "l1":
        held = complex_spec(next(o for o in model.outputs if o.name == spec.output))
        raise ValueError(f"loss {spec.kind!r} on the complex output {spec.output!r} "
                         f"({type_text(held.dtype, held.shape)}): torch's {_TORCH_NAMES[spec.kind]} does not take "
                         "complex Tensors; gc.losses.l1 does (the mean |pred - label|, as torch's l1_loss), or put "
                         "the loss on a real output (y.abs(), y.real)")
    return True


def l1_of_pairs(pred: Any, label: Any, reduction: str = "mean") -> Any:
    """torch's ``l1_loss`` of the complex values the ``[..., 2]`` pairs ``pred`` and ``label`` hold."""
    from graphc.dsl import complex_ops, losses

    losses.check_reduction("l1", reduction)
    difference = complex_ops.sub(complex_ops.view_as_complex(pred), complex_ops.view_as_complex(label))
    return losses.reduce_loss(complex_ops.abs(difference), reduction)


def with_complex_label(model: ir.Model, label: str) -> None:
    """Record ``label`` as a complex input of ``model``, where it is one of its inputs."""
    if label in {v.name for v in model.graph.inputs}:
        inputs, outputs = complex_names(model.metadata_props)
        record(model.metadata_props, sorted(inputs | {label}), sorted(outputs))
