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

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from graphc.errors import RequestTooLarge, TensorTooLarge
from graphc.model import node_label
from graphc.model.file import model_graphs
from graphc.model.graphs import reads

if TYPE_CHECKING:
    from graphc.backends.size_cones import SizeCones

VALUE_SIZED = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "OneHot", "Resize", "Upsample",
                         "HannWindow", "HammingWindow", "BlackmanWindow", "CenterCropPad", "MaxUnpool", "Col2Im",
                         "MelWeightMatrix", "STFT"})
# Inputs of a value-sized op whose shape (and dtype) alone matter to its output's size; its other
# inputs size it by their values.
SHAPE_ONLY = {"Expand": (0,), "Tile": (0,), "Pad": (0,), "OneHot": (0, 2), "Resize": (0,), "Upsample": (0,),
              "CenterCropPad": (0,), "MaxUnpool": (0, 1), "Col2Im": (0,), "STFT": (0, 2)}
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
    return any(is_value_sized(node) for graph in model_graphs(model) for node in graph.node)


def is_value_sized(node: onnx.NodeProto) -> bool:
    return node.op_type in VALUE_SIZED and node.domain in ("", "ai.onnx")


class Found(NamedTuple):
    """What shape inference finds of a run, for one input signature."""
    growth: list[tuple]    # (bytes, node, op, shape, dtype) of each tensor larger than all before it
    peak: tuple            # (bytes, node, op): the most bytes of known tensors live at once, and where
    misses: list[tuple]    # (node index, {input: shape}): value-sized nodes of outputs not all found


class ShapePrepass:
    """The tensors a run of ``model`` would make, found from its feeds before it runs.

    ``unchecked`` lists (node, where) for the value-sized nodes no check before a run can reach:
    in a subgraph or local function (their inputs exist only as the run goes), or in the main
    graph of sizing inputs the numpy kernels cannot compute (``size_cones``)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.skeleton = _skeleton(model)
        self._found: dict[tuple, Found] = {}
        self._lock = threading.Lock()

    @functools.cached_property
    def cones(self) -> SizeCones:
        """The numpy cones of the main graph's value-sized nodes, built on first use (the numpy
        backend, which checks those nodes as they run, never asks)."""
        from graphc.backends.size_cones import SizeCones  # the numpy kernels come only with a cone

        return SizeCones(self.model)

    @functools.cached_property
    def unchecked(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys(self.cones.unchecked + [
            (node_label(node.name, index), f"graph {graph.name!r}") for graph in model_graphs(self.model)[1:]
            for index, node in enumerate(graph.node) if is_value_sized(node)]))

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ShapePrepass | None:
        """The pre-pass of ``model``; None for a model without value-sized ops (nothing to check)."""
        return cls(model) if has_value_sized(model) else None

    def check(self, feeds: Mapping[str, np.ndarray], limit: int, request_limit: int | None = None,
              cones: bool = True) -> None:
        """``TensorTooLarge`` naming the node, shape and bytes of the first tensor (in the graph's
        order) over ``limit`` bytes that shape inference finds for ``feeds``, or that the numpy
        kernels find for a value-sized node whose output it could not find (``size_cones``; not
        with ``cones=False``, for a backend that checks such nodes as they run);
        ``RequestTooLarge`` where the tensors live at once (``Found.peak``) pass ``request_limit``."""
        key = tuple((name, a.shape, a.dtype.str, a.tobytes() if a.size <= SMALL else None)
                    for name, a in sorted(feeds.items()))
        found = self._found.get(key)
        if found is None:
            found = self._infer(feeds)
            with self._lock:
                if len(self._found) >= _CACHED:
                    self._found.clear()
                self._found[key] = found
        for nbytes, who, op, shape, dtype in found.growth:
            if nbytes > limit:
                raise TensorTooLarge(too_large(who, op, shape, dtype, nbytes, limit))
        if request_limit is not None and found.peak[0] > request_limit:
            nbytes, who, op = found.peak
            raise RequestTooLarge(f"the run would hold {nbytes:,} bytes of tensors at once (at {who} ({op})), over "
                                  f"the limit of {request_limit:,} bytes for a run's live tensors (max_request_bytes)")
        if cones and found.misses:
            self.cones.check(found.misses, feeds, limit)

    def _infer(self, feeds: Mapping[str, np.ndarray]) -> Found:
        """Shape inference over the main graph, the feeds' shapes given, their small values as
        constants."""
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
            inferred = model
        types = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output, *graph.input)}
        known = {name: _bytes(kind) for name, kind in types.items()}
        shapes = {name: found[1:] for name, found in known.items() if found is not None}
        shapes.update({t.name: (list(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
                       for t in graph.initializer})
        growth: list[tuple] = []
        misses: list[tuple] = []
        for index, node in enumerate(graph.node):
            for name in node.output:
                found = known.get(name)
                if found is not None and (not growth or found[0] > growth[-1][0]):
                    growth.append((found[0], node_label(node.name, index), node.op_type, *found[1:]))
            if is_value_sized(node) and not all(known.get(name) for name in node.output if name):
                misses.append((index, {name: shapes[name] for name in node.input if name in shapes}))
        return Found(growth, _peak(graph, known, feeds), misses)


def _peak(graph: onnx.GraphProto, known: Mapping[str, tuple | None], feeds: Mapping[str, np.ndarray]) -> tuple:
    """(bytes, node, op) where the tensors of known size (``known``: ``_bytes`` of each value's
    type) live at once add up to the most: the feeds from the start, a node's outputs from it; each
    until the last node that reads it (a subgraph's reads included), the graph's outputs to the
    end. Initializers are the model's, not the run's."""
    last: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in reads(node):
            last[name] = index
    end = len(graph.node)
    for value in graph.output:
        last[value.name] = end
    freed = [0] * (end + 1)
    live = 0
    for name, array in feeds.items():
        live += array.nbytes
        freed[last.get(name, 0)] += array.nbytes
    best = (live, "the feeds", "inputs")
    for index, node in enumerate(graph.node):
        for name in node.output:
            found = known.get(name) if name else None
            if found is not None:
                live += found[0]
                freed[last.get(name, index)] += found[0]
        if live > best[0]:
            best = (live, node_label(node.name, index), node.op_type)
        live -= freed[index]
    return best


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
    elements as they are (those that are also inputs as the inputs), larger ones as typed inputs
    (their shapes matter, not their values), no value_info and outputs typed without shapes
    (declared symbolic dims cannot clash with the concrete ones a run gives)."""
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
        else:
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
