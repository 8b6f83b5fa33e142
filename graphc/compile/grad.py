"""``gc.grad``: the gradient model of a scalar output (like ``tf.gradients``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Union

import onnx_ir as ir

from graphc.errors import PassError
from graphc.compile.losses import LossSpec
from graphc.model import Model, load

LOSS = "loss"  # the output a loss spec's loss gets, as in the training graphs


def grad(model, loss: Union[str, LossSpec], wrt: Sequence[str] | None = None) -> Model:
    """A model with ``model``'s inputs plus every ``wrt`` parameter as an input (its initializer is
    the default), and ``model``'s outputs plus ``"<param>_grad"`` for each.

    ``loss`` names a scalar output, or is a loss spec such as
    ``gc.losses.cross_entropy("logits", label="y")``: its loss graph is spliced after that output
    as ``gc.training.generate`` does, so the result also takes the label as an extra input (``y``,
    int64 class indices for cross-entropy, else the output's type) and outputs the scalar
    ``"loss"``. ``wrt`` defaults to all floating-point initializers. A model below opset 17 is
    upgraded to 17 first (onnx's version converter), as training does: the rules use
    ScatterElements with ``reduction``.

    Raises:
        TypeError: ``loss`` is neither an output name nor a ``gc.losses`` spec.
        gc.GraphError: an unknown name, a non-scalar loss, or an op without a gradient rule on the
            path from a parameter to the loss (naming op, node and source line).

        >>> g = gc.grad(model, "loss")                                    # doctest: +SKIP
        >>> gc.Session(g).run({"x": x, "y": y})["fc1.weight_grad"]        # doctest: +SKIP
        >>> g = gc.grad(model, gc.losses.cross_entropy("logits", label="y"))  # doctest: +SKIP
    """
    from graphc.passes.autodiff import gradient_model

    from graphc.compile.opsets import convert_opset, emitted_opset
    from graphc.compile.training import names

    if not isinstance(loss, (str, LossSpec)):
        raise TypeError("loss must be the name of a scalar output or a gc.losses spec such as "
                        f"gc.losses.mse('out', label='y'), got {type(loss).__name__}")
    model = load(model)
    if model.opset < 17:
        model = convert_opset(model, 17, hint="gradient graphs need ai.onnx opset >= 17")
    model = emitted_opset(model, "gradient graphs")
    if isinstance(loss, LossSpec):
        model, loss = _with_loss(model, loss), LOSS
    return Model(gradient_model(model.ir, loss, names(wrt) if wrt is not None else None))


def _with_loss(model: Model, spec: LossSpec) -> Model:
    """A copy of ``model`` with ``spec``'s loss graph after its output, a new label input and the
    loss as one more output named ``loss``."""
    from graphc.passes.training.loss_graph import LossArgs, append_loss, free_names
    from graphc.compile.complex_loss import complex_output, with_complex_label
    from graphc.compile.training import capture_loss

    if LOSS in {o.name for o in model.outputs}:
        raise PassError(f"the model already has an output named {LOSS!r}, the name a loss spec's output "
                         f"takes; differentiate it with gc.grad(model, {LOSS!r})")
    copy = ir.serde.deserialize_model(model.proto)
    graph = copy.graph
    free_names(graph, {LOSS: "the loss spec's loss, an output of the gradient graph"})
    pair = complex_output(model, spec)
    append_loss(graph, model.opset, LossArgs(spec.output, spec.label,
                                             build=partial(capture_loss, spec, complex_pair=pair)))
    if pair:
        with_complex_label(copy, spec.label)
    graph.outputs.append(next(v for node in reversed(list(graph)) for v in node.outputs if v.name == LOSS))
    return Model(copy)
