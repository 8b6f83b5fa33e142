"""The value types onnx's shape inference gives a model (``tensor_types``), and ``SharedTypes``, which hands
them to a chain of rewrites of one model (an onnxruntime session's copy) from one inference."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from graphc.model.graphs import all_graphs

__all__ = ["SharedTypes", "Types", "TypesOf", "tensor_types"]

Types = dict[str, tuple[int, list[int | None]]]  # value name -> (element type, dims, None where symbolic)
# what gives a rewrite its model's types: ``tensor_types`` itself, or a ``SharedTypes``
TypesOf = Callable[..., "Types | None"]


def tensor_types(model: onnx.ModelProto, subgraphs: bool = False) -> Types | None:
    """Value name -> (element type, dims, None where symbolic) for every shaped tensor of the main
    graph (with ``subgraphs``, of every graph in it), from onnx's shape inference; None where it
    fails (over 2 GiB, or inconsistent)."""
    graphs = _inferred_graphs(model)
    if graphs is None:
        return None
    return _main_and_every(graphs)[1] if subgraphs else _declared(graphs[0])  # only what is asked


class SharedTypes:
    """``tensor_types``, called as it is, for a chain of rewrites each of which returns its input itself
    where it finds nothing to do: asked again about the model it was last asked about (the same
    object), it answers from the shape inference it ran then, for the main graph and for every
    graph alike; asked about another model, it runs one for that. So the rewrites must not change a
    model in place (they change a copy), nor the dicts they are given."""

    def __init__(self) -> None:
        self._model: onnx.ModelProto | None = None
        self._types: tuple[Types, Types] | None = None  # (main graph, every graph)

    def __call__(self, model: onnx.ModelProto, subgraphs: bool = False) -> Types | None:
        if model is not self._model:
            graphs = _inferred_graphs(model)
            self._model, self._types = model, None if graphs is None else _main_and_every(graphs)
        return None if self._types is None else self._types[bool(subgraphs)]


def _inferred_graphs(model: onnx.ModelProto) -> list[onnx.GraphProto] | None:
    """``model``'s graphs after onnx's shape inference, the main graph first; None where it fails."""
    try:
        return list(all_graphs(onnx.shape_inference.infer_shapes(model).graph))
    except (onnx.shape_inference.InferenceError, ValueError):
        return None


def _main_and_every(graphs: list[onnx.GraphProto]) -> tuple[Types, Types]:
    """``tensor_types`` without and with ``subgraphs``, from the inferred ``graphs``."""
    main = _declared(graphs[0])
    every = dict(main) if len(graphs) > 1 else main
    for graph in graphs[1:]:  # a name declared again: the inner graph's, as read last
        every.update(_declared(graph))
    return main, every


def _declared(graph: onnx.GraphProto) -> Types:
    out = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        t = value.type.tensor_type
        if t.HasField("shape"):
            out[value.name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    for t in graph.initializer:
        out[t.name] = (t.data_type, list(t.dims))
    return out
