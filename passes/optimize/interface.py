"""Keeping a graph's interface (input/output names, dtypes, shapes) exactly as it came in."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["restore_interface", "snapshot_interface"]

Interface = list[tuple[str, str, ir.TypeProtocol | None, ir.Shape | None]]


def snapshot_interface(model: ir.Model) -> Interface:
    graph = model.graph
    return ([("in", v.name, v.type, v.shape) for v in graph.inputs]
            + [("out", v.name, v.type, v.shape) for v in graph.outputs])


def restore_interface(model: ir.Model, interface: Interface) -> None:
    """Put back the declared types and shapes of inputs and outputs. Shape inference may have
    refined an output (a symbolic ``N`` replaced by a fresh ``unk__0``, or by a number a test
    input happened to fix); the caller's declaration is the contract, so it wins. Names are
    checked by the pipeline after every pass; here they can only match."""
    values = [*model.graph.inputs, *model.graph.outputs]
    for value, (_, name, type_, shape) in zip(values, interface):
        if value.name != name:  # pragma: no cover - the pipeline catches this per pass
            raise RuntimeError(f"graph value {name!r} was renamed to {value.name!r}")
        value.type = type_
        value.shape = shape
