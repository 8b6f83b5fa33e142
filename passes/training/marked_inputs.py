"""The data inputs whose values the Trainer checks on the host before a step, as the loss nodes that
read them mark them at capture: a ``binary_cross_entropy``'s probabilities, a ``cross_entropy`` /
``nll_loss``'s class labels (the graph would turn a value out of range into a wrong number, where
PyTorch raises)."""

from __future__ import annotations

from typing import Union

import onnx_ir as ir

from graphc.passes.values import CLASS_LABELS_KEY, PROBABILITIES_KEY


def probability_inputs(graph: ir.Graph) -> list[str]:
    """The data inputs a ``binary_cross_entropy`` reads as probabilities (``PROBABILITIES_KEY``): the
    Trainer refuses a batch holding a value outside [0, 1] there."""
    return sorted({name for names in _marks(graph, PROBABILITIES_KEY) for name in names.split(",")} & _data(graph))


def class_label_inputs(graph: ir.Graph) -> list[tuple[str, Union[int, str, None], int]]:
    """(data input, C: its size, the name of an input dim, or None, ignore index) for each ``cross_entropy`` /
    ``nll_loss`` that reads a data input as class labels (``CLASS_LABELS_KEY``): the Trainer
    refuses a batch holding a label outside [0, C) there that is not the ignore index."""
    found = {tuple(mark.rsplit(":", 2)) for mark in _marks(graph, CLASS_LABELS_KEY)}
    return sorted(((name, int(classes) if classes.isdigit() else classes or None, int(ignore))
                   for name, classes, ignore in found if name in _data(graph)), key=str)


def _marks(graph: ir.Graph, key: str) -> list[str]:
    return [mark for mark in (node.metadata_props.get(key) for node in graph.all_nodes()) if mark]


def _data(graph: ir.Graph) -> set[str]:
    return {v.name for v in graph.inputs if not v.is_initializer()}
