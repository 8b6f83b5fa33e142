"""Tensors whose size a run's input values choose (a ConstantOfShape of a fed shape, a Range to a
fed limit), bounded per run by ``max_tensor_bytes`` (``gc.Session.run``; ``graphc serve``'s
``--max-tensor-bytes``) before anything is allocated.

``VALUE_SIZED`` names the ops that size their output from input values. A model with none of
them (in any graph or local function) makes tensors sized by its inputs' shapes alone, and is not
checked. For one with some, ``ShapePrepass`` runs onnx's shape inference, with data propagation,
on the model given the run's input shapes and, as constants, its small input values: every tensor
of the main graph whose shape that finds is checked, whatever op makes it (an outer comparison of
two Ranges too). The numpy interpreter checks the value-sized nodes themselves again as they run
(``backends/numpy/sizes.py``), so it also bounds those inside subgraphs or past a shape inference
cannot follow (after a NonZero); onnxruntime cannot be bounded per run, so on the ort backends the
pre-pass is the whole check.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphc.errors import TensorTooLarge
from graphc.model import node_label
from graphc.model.file import model_graphs

VALUE_SIZED = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "OneHot", "Resize", "Upsample",
                         "HannWindow", "HammingWindow", "BlackmanWindow", "CenterCropPad", "MaxUnpool"})
# Feeds and initializers of at most this many elements are constants for data propagation (shapes,
# scales, pads, limits); larger ones are shapes only, so a model's weights are not copied per run.
SMALL = 64
# Input signatures (shapes, small values) whose largest tensor is remembered.
_CACHED = 256


def too_large(who: str, op: str, shape: Sequence[int], dtype: Any, nbytes: int, limit: int) -> str:
    """The message of a tensor over the run's bound."""
    return (f"{who} ({op}) would make {np.dtype(dtype)}[{','.join(map(str, shape))}], {nbytes:,} bytes, over the "
            f"limit of {limit:,} bytes for one tensor of a run (max_tensor_bytes)")


def has_value_sized(model: onnx.ModelProto) -> bool:
    """Whether any graph or local function of ``model`` holds a ``VALUE_SIZED`` op."""
    return any(node.op_type in VALUE_SIZED and node.domain in ("", "ai.onnx")
               for graph in model_graphs(model) for node in graph.node)


class ShapePrepass:
    """The tensors a run of ``model`` would make, found from its feeds before it runs."""

    def __init__(self, model: onnx.ModelProto):
        self.skeleton = _skeleton(model)
        self._growth: dict[tuple, list[tuple]] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ShapePrepass | None:
        """The pre-pass of ``model``; None for a model without value-sized ops (nothing to check)."""
        return cls(model) if has_value_sized(model) else None

    def check(self, feeds: Mapping[str, np.ndarray], limit: int) -> None:
        """``TensorTooLarge`` naming the node, shape and bytes of the first tensor (in the graph's
        order) over ``limit`` bytes that shape inference finds for ``feeds``."""
        key = tuple((name, a.shape, a.dtype.str, a.tobytes() if a.size <= SMALL else None)
                    for name, a in sorted(feeds.items()))
        growth = self._growth.get(key)
        if growth is None:
            growth = self._infer(feeds)
            with self._lock:
                if len(self._growth) >= _CACHED:
                    self._growth.clear()
                self._growth[key] = growth
        for nbytes, who, op, shape, dtype in growth:
            if nbytes > limit:
                raise TensorTooLarge(too_large(who, op, shape, dtype, nbytes, limit))

    def _infer(self, feeds: Mapping[str, np.ndarray]) -> list[tuple]:
        """(bytes, node, op, shape, dtype) of each main-graph tensor of known shape larger than
        every one before it in the graph's order (the first over any bound is among them)."""
        model = onnx.ModelProto()
        model.CopyFrom(self.skeleton)
        graph = model.graph
        inputs = list(graph.input)
        del graph.input[:]
        for value in inputs:
            array = feeds.get(value.name)
            if array is not None and array.size <= SMALL and array.dtype.kind in "biuf":
                graph.initializer.append(numpy_helper.from_array(array, value.name))
                continue
            if array is not None:
                shape = value.type.tensor_type.shape
                del shape.dim[:]
                for d in array.shape:
                    shape.dim.add().dim_value = d
            graph.input.append(value)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except (onnx.shape_inference.InferenceError, ValueError):  # the run reports what is wrong
            return []
        types = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output)}
        growth: list[tuple] = []
        for index, node in enumerate(graph.node):
            for name in node.output:
                found = _bytes(types.get(name))
                if found is not None and (not growth or found[0] > growth[-1][0]):
                    growth.append((found[0], node_label(node.name, index), node.op_type, *found[1:]))
        return growth


def _bytes(kind: onnx.TypeProto | None) -> tuple[int, list[int], np.dtype] | None:
    """(bytes, dims, dtype) of a tensor type whose every dim is known; None otherwise."""
    if kind is None or not kind.HasField("tensor_type") or not kind.tensor_type.HasField("shape"):
        return None
    tensor = kind.tensor_type
    if not all(d.HasField("dim_value") for d in tensor.shape.dim) or tensor.elem_type == onnx.TensorProto.STRING:
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except (KeyError, TypeError):
        return None
    dims = [d.dim_value for d in tensor.shape.dim]
    return math.prod(dims) * dtype.itemsize, dims, dtype


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` for shape inference: its nodes and functions, initializers of at most ``SMALL``
    elements as they are (those that are also inputs as the inputs), larger ones as typed inputs (their shapes matter, not their values), no
    value_info and outputs typed without shapes (declared symbolic dims cannot clash with the
    concrete ones a run gives)."""
    source = model.graph
    graph = onnx.GraphProto(name=source.name)
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    names = {v.name for v in source.input}
    for tensor in source.initializer:  # one that is also an input is a default the run may override
        if tensor.name in names:
            continue
        if math.prod(tensor.dims) <= SMALL:
            graph.initializer.append(tensor)
        elif tensor.name not in names:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for sparse in source.sparse_initializer:
        graph.input.append(onnx.helper.make_tensor_value_info(sparse.values.name, sparse.values.data_type,
                                                              list(sparse.dims)))
    for value in source.output:
        graph.output.append(onnx.helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, None)
                            if value.type.HasField("tensor_type") else value)
    skeleton = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, graph=graph)
    skeleton.functions.extend(model.functions)
    return skeleton
