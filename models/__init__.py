"""Example models written in the DSL. ``EXAMPLES`` maps a name to ``(factory, example_inputs)``:
``factory()`` builds the Module, ``example_inputs(batch="N")`` gives its input specs, so

    factory, inputs = EXAMPLES["cnn"]
    model = gc.capture(factory(), **inputs())
"""

from __future__ import annotations

from collections.abc import Callable

from . import cnn, resnet, transformer, two_layer_net

EXAMPLES: dict[str, tuple[Callable, Callable]] = {
    "two_layer_net": (two_layer_net.TwoLayerNet, two_layer_net.example_inputs),
    "cnn": (cnn.LeNet, cnn.example_inputs),
    "resnet": (resnet.ResNet, resnet.example_inputs),
    "transformer": (transformer.TransformerEncoder, transformer.example_inputs),
}

__all__ = ["EXAMPLES"]
