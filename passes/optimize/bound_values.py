"""The values a ``gc.autograd.Function``'s backward is bound to, kept through the pipeline below level 3."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import onnx_ir as ir

from graphc.passes.values import AUTOGRAD_DOMAIN, AUTOGRAD_KEY, autograd_bound_names

__all__ = ["keep_bound_values"]


@contextlib.contextmanager
def keep_bound_values(model: ir.Model) -> Iterator[None]:
    """While the pipeline runs, the values the main graph's Function records bind by name (``inputs``,
    ``reads``) are extra graph outputs, as the pipeline keeps every output under its name (no pass folds
    one away, renames it or merges it with another): the backward still reads them after ``gc.optimize``
    (a saved ``x * 1.0`` that ``x*1`` elimination would fold into ``x``, a saved value only the backward
    reads, which dead-node removal would drop). Graph inputs are kept anyway, and a model without the
    backwards (``AUTOGRAD_DOMAIN``'s functions: training artifacts) has none to keep. Afterwards the
    outputs are the model's own again."""
    graph = model.graph
    names: set[str] = set()
    for node in graph if AUTOGRAD_DOMAIN in model.opset_imports else ():
        if (text := node.metadata_props.get(AUTOGRAD_KEY)) is not None:
            names.update(autograd_bound_names(json.loads(text)))
    values = [*graph.initializers.values(), *(v for node in graph for v in node.outputs)] if names else []
    kept = list(dict.fromkeys(v for v in values
                              if v.name in names and not v.is_graph_output() and not v.is_graph_input()))
    graph.outputs.extend(kept)
    try:
        yield
    finally:
        del graph.outputs[len(graph.outputs) - len(kept):]
