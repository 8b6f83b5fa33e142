"""Node emission shared by the DSL and the passes: ``make_node`` builds every node graphc emits
(attributes converted one way, the user's line stamped); ``Emitter`` appends ``ai.onnx`` nodes to
an ``ir.Graph`` for the autodiff and training passes. Both the DSL's capture ``Builder`` and the
``Emitter`` type their outputs through ``passes/infer.py`` (the Emitter with its fast rules only).

It names every new value and node ``<scope>/<stem>_<n>`` (never a name the graph already has),
shares equal constants, records output dtypes and shapes, and emits ``Reduce*``/``Squeeze``/
``Unsqueeze`` with their axes as an input or an attribute, as the graph's opset wants.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.errors import PassError
from graphc.model import SOURCE_KEY
from graphc.passes.infer import infer

__all__ = ["AXES_AS_INPUT", "Emitter", "HALF_DTYPES", "SOURCE_KEY", "make_node"]

# Opset from which an op takes its axes (or split sizes) as an input instead of an attribute;
# the other Reduce* ops moved at opset 18.
AXES_AS_INPUT = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "Split": 13}
_REDUCE_AXES_AS_INPUT = 18

# the half-precision floats: onnxruntime's CPU provider (1.31) has no reducing ScatterElements for
# them ("MLFloat16 data type is not supported ... when reduction is 'add'"), so
# ``Emitter.scatter_elements`` widens them; the Adam step of such params runs in float32 too
# (``training.optimizers._in_float32``)
HALF_DTYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})

# ops whose output is a sequence: a dtype recorded for it is its elements'
_SEQUENCE_OUTPUTS = frozenset({"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SplitToSequence",
                               "SequenceMap"})


class Emitter:
    """Appends nodes at the end of ``graph`` (callers sort the graph afterwards).

    ``source``, when set, is stamped on each new node as ``graphc.source``. Each output's dtype
    (``dtype=`` overrides it) and shape are recorded as ``infer`` gives them without onnx's
    fallback: dtypes for every op, shapes where a fast rule knows them. A node whose inputs
    cannot go together raises ``InferenceError``.
    """

    def __init__(self, graph: ir.Graph, opset: int, scope: str = "", names: _Names | None = None):
        self.graph = graph
        self.opset = opset
        self.scope = scope
        self.source: str | None = None
        self._consts: dict[tuple, ir.Value] = {}
        # names are unique across the whole model, subgraphs included: pass a parent's ``names``
        self._names = names or _Names(_taken(graph))

    def fresh(self, stem: str) -> str:
        return self._names.fresh(f"{self.scope}/{stem}" if self.scope else stem)

    def name_value(self, value: ir.Value) -> ir.Value:
        if not value.name:
            value.name = self.fresh("v")
        return value

    def op(self, op_type: str, *inputs: ir.Value | None, num_outputs: int = 1,
           dtype: ir.DataType | None = None, name: str | None = None, **attrs):
        """Append one node; returns its output (or the tuple of outputs when num_outputs > 1).
        A single output may be given its ``name`` and ``dtype``; attributes that are None are left out."""
        assert num_outputs == 1 or (name is None and dtype is None), "name/dtype are for one-output nodes"
        for v in inputs:
            if v is not None:
                self.name_value(v)
        node = make_node(op_type, inputs, attrs, num_outputs=num_outputs, name=self.fresh(op_type), source=self.source)
        for out in node.outputs:
            out.name = self._names.claim(name) if name is not None else self.fresh(op_type)
        types = infer(node, self.opset)
        if dtype is not None:
            types[0] = (dtype, types[0][1])
        for out, (out_dtype, shape) in zip(node.outputs, types):
            if out_dtype is not None:
                out.type = ir.SequenceType(ir.TensorType(out_dtype)) if op_type in _SEQUENCE_OUTPUTS \
                    else ir.TensorType(out_dtype)
            if shape is not None:
                out.shape = ir.Shape(shape)
        self.graph.append(node)
        return tuple(node.outputs) if num_outputs > 1 else node.outputs[0]

    def copy(self, nodes: Sequence[ir.Node], clones: dict[ir.Value, ir.Value]) -> None:
        """Append a copy of each of ``nodes`` (in order, none holding a subgraph) reading ``clones[v]`` for an
        input ``v`` in ``clones``; each copy's outputs go into ``clones`` under the original's."""
        for node in nodes:
            outs = self.op(node.op_type, *(clones.get(v, v) for v in node.inputs), num_outputs=len(node.outputs),
                           **{k: a.value for k, a in node.attributes.items()})
            clones.update(zip(node.outputs, outs if len(node.outputs) > 1 else [outs]))

    # -- constants ---------------------------------------------------------------------------
    def const(self, array, dtype: ir.DataType | np.dtype | None = None, hint: str = "const") -> ir.Value:
        """A ``Constant`` holding ``array`` (cast to ``dtype``); equal constants are shared."""
        np_dtype = dtype.numpy() if isinstance(dtype, ir.DataType) else dtype
        arr = np.asarray(array, dtype=np_dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.op("Constant", value=ir.tensor(arr), name=self.fresh(hint))
        return self._consts[key]

    def ints(self, values: Sequence[int]) -> ir.Value:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def dim(self, value: ir.Value, axis: int) -> ir.Value | int:
        """One dim of ``value``: an int when static, else a [1] int64 value read off ``Shape``."""
        shape = value.shape
        if shape is not None and isinstance(shape[axis], int):
            return shape[axis]
        return self.op("Gather", self.op("Shape", value), self.ints([axis]))

    def scalar(self, x: float, like: ir.Value) -> ir.Value:
        """A 0-d constant of ``like``'s dtype (CastLike when the dtype is not recorded)."""
        if like.dtype is not None:
            return self.const(x, like.dtype)
        return self.op("CastLike", self.const(x, np.float32), like)

    def from_float64(self, value: ir.Value, like: ir.Value) -> ir.Value:
        """A float64 ``value`` (a scalar computed as Python floats are) in ``like``'s dtype: itself
        where ``like`` is float64, else one Cast."""
        return value if like.dtype == ir.DataType.DOUBLE else self.op("Cast", value, to=like.dtype, dtype=like.dtype)

    def scatter_elements(self, data: ir.Value, indices: ir.Value, updates: ir.Value, axis: int,
                         reduction: str = "add") -> ir.Value:
        """``ScatterElements(data, indices, updates, axis, reduction)``. A float16 or bfloat16 reduction
        runs in float32 and is cast back once (``HALF_DTYPES``: onnxruntime's CPU provider has no
        16-bit kernel for it, and each sum then rounds once, not at every add)."""
        dtype = data.dtype
        if reduction == "none" or dtype not in HALF_DTYPES:
            return self.op("ScatterElements", data, indices, updates, axis=axis, reduction=reduction)
        wide = [self.op("Cast", v, to=ir.DataType.FLOAT) for v in (data, updates)]
        summed = self.op("ScatterElements", wide[0], indices, wide[1], axis=axis, reduction=reduction)
        return self.op("Cast", summed, to=dtype)

    # -- opset-dependent forms ---------------------------------------------------------------
    def axes_as_input(self, op_type: str) -> bool:
        return self.opset >= AXES_AS_INPUT.get(op_type, _REDUCE_AXES_AS_INPUT)

    def reduce(self, op_type: str, x: ir.Value, axes: Sequence[int] | ir.Value | None,
               keepdims: bool = True, empty_is_noop: bool = True) -> ir.Value:
        """``op_type`` (ReduceSum, ReduceMean, ...) over ``axes`` (None: all axes; []: ``x`` itself).
        Axes known only at run time (a Value) that come out empty give ``x`` itself too, or with
        ``empty_is_noop=False`` the reduction over all axes (ONNX's ``noop_with_empty_axes=0``)."""
        keep = int(keepdims)
        if axes is None:
            return self.op(op_type, x, keepdims=keep)
        if isinstance(axes, ir.Value):
            if not self.axes_as_input(op_type):
                raise PassError(f"{op_type} with dynamic axes needs opset >= 13/18 (graph has {self.opset})")
            return self.op(op_type, x, axes, keepdims=keep, noop_with_empty_axes=int(empty_is_noop))
        return self._axes_op(op_type, x, axes, keepdims=keep)

    def split(self, x: ir.Value, sizes: Sequence[int], axis: int, count: int) -> tuple[ir.Value, ...]:
        """``x`` split along ``axis`` into ``count`` parts of ``sizes``."""
        if self.axes_as_input("Split"):
            parts = self.op("Split", x, self.ints(sizes), axis=axis, num_outputs=count)
        else:
            parts = self.op("Split", x, axis=axis, split=[int(v) for v in sizes], num_outputs=count)
        return parts if count > 1 else (parts,)

    def unsqueeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        return self._axes_op("Unsqueeze", x, axes)

    def squeeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        return self._axes_op("Squeeze", x, axes)

    def _axes_op(self, op_type: str, x: ir.Value, axes: Sequence[int], **attrs) -> ir.Value:
        axes = [int(a) for a in axes]
        if not axes:
            return x
        if self.axes_as_input(op_type):
            return self.op(op_type, x, self.ints(axes), **attrs)
        return self.op(op_type, x, axes=axes, **attrs)


def make_node(op_type: str, inputs: Sequence[ir.Value | None], attrs: dict, *, outputs: Sequence[ir.Value] | None = None,
              num_outputs: int = 1, name: str, source: str | None = None) -> ir.Node:
    """An ``ai.onnx`` node (not yet in a graph) on ``inputs``; attributes that are None are left
    out; ``source`` (the user's ``file.py:LINE``) is stamped as ``graphc.source``."""
    return ir.Node("", op_type, list(inputs), attributes=_attributes(attrs), outputs=outputs,
                   num_outputs=None if outputs is not None else num_outputs, name=name,
                   metadata_props={SOURCE_KEY: source} if source else None)


def _attributes(attrs: dict) -> list[ir.Attr]:
    """``ir.Attr``s for Python values (those that are None left out)."""
    return [_attribute(key, value) for key, value in attrs.items() if value is not None]


def _attribute(key: str, value) -> ir.Attr:
    """Ints (bools, dtypes), floats, strings, tensors, numpy arrays and lists of ints or floats
    directly; the rest (graphs, ...) as onnx-ir converts them, which checks protocols first and
    costs up to 0.1 ms (a Transpose's ``perm``)."""
    if isinstance(value, ir.Attr):
        return value
    if isinstance(value, int):
        return ir.AttrInt64(key, int(value))
    if isinstance(value, float):
        return ir.AttrFloat32(key, value)
    if isinstance(value, str):
        return ir.AttrString(key, value)
    if isinstance(value, np.ndarray):
        return ir.AttrTensor(key, ir.tensor(value))
    if isinstance(value, ir.Tensor):
        return ir.AttrTensor(key, value)
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, int) for v in value):
            return ir.AttrInt64s(key, [int(v) for v in value])
        if all(isinstance(v, float) for v in value):
            return ir.AttrFloat32s(key, list(value))
    return ir.convenience.convert_attribute(key, value)


class _Names:
    def __init__(self, taken: set[str]):
        self.taken = taken
        self.counter = 0

    def claim(self, name: str) -> str:
        self.taken.add(name)
        return name

    def fresh(self, stem: str) -> str:
        while True:
            self.counter += 1
            name = f"{stem}_{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _taken(graph: ir.Graph) -> set[str]:
    """The names of ``graph``'s values and nodes, subgraphs included: an Emitter's new names avoid
    both (two Emitters of one scope, such as two unnamed LSTMs unrolled, once gave two nodes one
    name, which onnxruntime refuses)."""
    taken = {v.name for v in (*graph.inputs, *graph.initializers.values()) if v.name}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        taken.update(v.name for v in node.outputs if v.name)
        if node.name:
            taken.add(node.name)
    return taken
