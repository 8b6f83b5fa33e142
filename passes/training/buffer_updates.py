"""Module buffers a training-mode forward writes, as training state.

``gc.capture`` records each write into a buffer of the captured Module (``self.u.copy_(new)``,
``self.ema.mul_(d)``, ``self.u = new``) as a stop-gradient Identity marked ``BUFFER_WRITE_KEY`` with
the buffer's name, and marks the last write of each buffer ``BUFFER_UPDATE_KEY`` too: its output is
the buffer's value after the forward. Here:

* ``with_written``: the BatchNorm statistics plus the written buffers, the state the training graphs
  read as inputs and carry from step to step (``<buffer>.next`` outputs that feed ``<buffer>``);
* ``inference_mode``: ``modes.set_inference_mode`` and each write skipped (its Identity reads the
  buffer as stored), as if the forward guarded it with torch's ``if self.training:``: eval and
  inference graphs read the buffer's current value and compute no update;
* ``updated_values``: ``{buffer: its value after the forward}`` in the training-mode graph.

A param an embedding's ``max_norm`` renormalises in place is ``passes/training/max_norm.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.training import modes
from graphc.passes.values import BUFFER_UPDATE_KEY, BUFFER_WRITE_KEY, STOP_GRADIENT_KEY

__all__ = ["inference_mode", "updated_values", "with_written"]


def _writes(graph: ir.Graph, key: str) -> list[ir.Node]:
    return [node for node in graph if node.op_type == "Identity" and key in node.metadata_props]


def with_written(graph: ir.Graph, stats: Sequence[str]) -> list[str]:
    """``stats`` (BatchNorm's running statistics) and then each buffer the forward writes, in graph
    order; a PassError for a marked buffer that is no initializer, written twice as the final value or
    a BatchNorm statistic too (read by a BatchNormalization as written or not: both would update it)."""
    names = [node.metadata_props[BUFFER_UPDATE_KEY] for node in _writes(graph, BUFFER_UPDATE_KEY)]
    taken = {*stats, *map(_written_statistic, graph)}
    for name in names:
        why = ("is no initializer of the model" if name not in graph.initializers else
               "has two final writes" if names.count(name) > 1 else
               "is a BatchNorm running statistic, which BatchNorm updates itself" if name in taken else None)
        if why is not None:
            raise PassError(f"buffer {name!r}, written in the training-mode forward (node metadata "
                            f"{BUFFER_UPDATE_KEY}), {why}")
    return [*stats, *names]


def _written_statistic(node: ir.Node) -> str | None:
    """The buffer whose written value ``node``, a BatchNormalization, reads as a running statistic
    (or tiles, ``modes.tracked_stat``), if any."""
    if node.op_type != "BatchNormalization":
        return None
    for value in node.inputs[3:5]:
        producer = None if value is None else value.producer()
        if producer is not None and producer.op_type == "Tile":
            producer = producer.inputs[0].producer()
        if producer is not None and BUFFER_WRITE_KEY in producer.metadata_props:
            return producer.metadata_props[BUFFER_WRITE_KEY]
    return None


def inference_mode(graph: ir.Graph) -> None:
    """``modes.set_inference_mode``, and each buffer write skipped: its Identity reads the buffer as
    stored, unmarked (the computation of the new value becomes dead code)."""
    modes.set_inference_mode(graph)
    for node in _writes(graph, BUFFER_WRITE_KEY):
        node.replace_input_with(0, graph.initializers[node.metadata_props[BUFFER_WRITE_KEY]])
        for key in (BUFFER_WRITE_KEY, BUFFER_UPDATE_KEY, STOP_GRADIENT_KEY):
            node.metadata_props.pop(key, None)


def updated_values(graph: ir.Graph) -> dict[str, ir.Value]:
    """``{buffer name: its value after the forward}`` (the output of its last write)."""
    return {node.metadata_props[BUFFER_UPDATE_KEY]: node.outputs[0] for node in _writes(graph, BUFFER_UPDATE_KEY)}

