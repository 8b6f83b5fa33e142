"""``gc.grad``: the gradient model of a scalar output (like ``tf.gradients``)."""

from __future__ import annotations

from collections.abc import Sequence

from graphc.model import Model, load


def grad(model, loss: str, wrt: Sequence[str] | None = None) -> Model:
    """A model with ``model``'s inputs plus every ``wrt`` parameter as an input (its initializer is
    the default), and ``model``'s outputs plus ``"<param>_grad"`` for each.

    ``loss`` names a scalar output; ``wrt`` defaults to all floating-point initializers. A model
    below opset 17 is upgraded to 17 first (onnx's version converter), as training does: the
    rules use ScatterND/ScatterElements with ``reduction``. Raises
    ``gc.GraphError`` for an unknown name, a non-scalar loss, or an op without a gradient rule on
    the path from a parameter to the loss (naming op, node and source line).

        >>> g = gc.grad(model, "loss")                                    # doctest: +SKIP
        >>> gc.Session(g).run({"x": x, "y": y})["fc1.weight_grad"]        # doctest: +SKIP
    """
    from graphc.passes.autodiff import gradient_model

    from graphc.opsets import convert_opset

    model = load(model)
    if model.opset < 17:
        model = convert_opset(model, 17, hint="gradient graphs need ai.onnx opset >= 17")
    return Model(gradient_model(model.ir, loss, list(wrt) if wrt is not None else None))
