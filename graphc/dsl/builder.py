"""Capture: trace DSL code into an onnx-ir graph.

A ``Builder`` is active while ``gc.capture`` runs. Every DSL op calls ``emit(op_type, inputs,
attrs)``, which records one ``ir.Node`` in the current scope (the main graph, or a control-flow
body), infers its output dtype/shape with ONNX's own inference (symbolic dims kept), stamps the
user's ``file.py:LINE`` and, when example arrays were given, evaluates the node eagerly.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphc.dtypes import as_dtype, to_onnx
from graphc.errors import GraphError
from graphc.model import SOURCE_KEY
from graphc.dsl import eager as _eager  # noqa: I001

_PKG_DIR = str(Path(__file__).resolve().parents[1]) + os.sep  # the graphc package
# Frames that are never the user's code: graphc's own, and numpy's (``np.sum(t)`` dispatches to
# ``Tensor.__array_function__`` from numpy's Python wrappers).
_NOT_USER = (_PKG_DIR, str(Path(np.__file__).resolve().parent) + os.sep)
_CURRENT: list["Builder"] = []


def user_source() -> str:
    """``file.py:LINE`` of the innermost frame outside the graphc package (the user's code)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_USER):
        frame = frame.f_back
    if frame is None:
        return "<unknown>:0"
    return f"{_display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


@functools.lru_cache(maxsize=1024)
def _display_path(filename: str) -> str:
    """Relative to the working directory when below it, else as given."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # other drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


def current() -> "Builder":
    if not _CURRENT:
        raise GraphError(f"graphc ops work only inside gc.capture(...) (called at {user_source()})")
    return _CURRENT[-1]


def describe(value: Any) -> str:
    """``float32[N,4]`` for a Tensor, the repr of anything else."""
    from graphc.dsl.tensor import Tensor

    if isinstance(value, Tensor):
        return value.type_str()
    if value is None:
        return "None"
    return repr(value)


class Scope:
    """Nodes of one graph being built (the main graph or a subgraph body)."""

    _serial = 0

    def __init__(self, eager: bool):
        self.nodes: list[ir.Node] = []
        self.eager = eager
        Scope._serial += 1
        self.id = Scope._serial


class Builder:
    """State of one capture: scopes, name counters, initializers, opset, eager values."""

    def __init__(self, opset: int, training: bool, eager: bool, seed: int = 0):
        if not 17 <= opset <= 23:
            raise GraphError(f"opset {opset} is not supported; graphc emits ai.onnx opsets 17..23")
        self.opset = opset
        self.training = training
        self.scopes = [Scope(eager)]
        self.initializers: list[ir.Value] = []
        self.param_tensors: dict[int, Any] = {}  # id(Parameter) -> Tensor
        self.rooted: set[int] = set()  # ids of the captured Module's own parameters
        self.buffers: list[str] = []
        self.module_path: list[str] = []
        self.rng = np.random.default_rng(seed)
        self.values: dict[int, np.ndarray] = {}  # id(ir.Value) -> eager value (for control flow)
        self._const_cache: dict[tuple, Any] = {}
        self._counters: dict[str, int] = {}
        self._names: set[str] = set()
        self.opset_protos = [onnx.helper.make_opsetid("", opset)]

    # -- naming ---------------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        base = base or "v"
        n = self._counters.get(base, 0)
        name = base if n == 0 and base not in self._names else f"{base}_{n}"
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._counters[base] = n + 1
        self._names.add(name)
        return name

    def reserve(self, name: str) -> str:
        if name in self._names:
            raise GraphError(f"duplicate graph name {name!r}")
        self._names.add(name)
        return name

    def initializer_names(self) -> set[str]:
        return {v.name for v in self.initializers}

    @property
    def scope(self) -> Scope:
        return self.scopes[-1]

    @property
    def eager(self) -> bool:
        return self.scope.eager

    # -- values ---------------------------------------------------------------------------------
    def new_value(self, name: str, dtype: str, shape: Sequence | None) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType(to_onnx(dtype))),
                        shape=None if shape is None else ir.Shape(list(shape)))

    def add_initializer(self, name: str, array: np.ndarray, exact: bool = True):
        """An initializer named ``name`` (``exact=False``: suffixed ``_1``, ... if taken)."""
        from graphc.dsl.tensor import Tensor

        name = self.reserve(name) if exact else self.unique(name)
        value = ir.Value(name=name, type=ir.TensorType(ir.DataType(to_onnx(as_dtype(array.dtype)))),
                         shape=ir.Shape(list(array.shape)), const_value=ir.Tensor(array, name=name))
        self.initializers.append(value)
        self.values[id(value)] = array
        return Tensor(value, eager_value=array if self.scopes[0].eager else None)

    def constant(self, array: np.ndarray):
        """A ``Constant`` node (not an initializer: constants are not parameters)."""
        array = np.asarray(array)
        key = (self.scope.id, array.dtype.str, array.shape, array.tobytes()) if array.size <= 16 else None
        if key is not None and key in self._const_cache:
            return self._const_cache[key]
        (out,) = self.emit("Constant", [], {"value": ir.Tensor(array)}, name_hint="const")
        out._const = array
        out._value = array if self.eager else None
        self.values[id(out.value)] = array
        if key is not None:
            self._const_cache[key] = out
        return out

    # -- emitting nodes -------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: Sequence[Any], attrs: dict[str, Any] | None = None,
             num_outputs: int = 1, *, out_types: Sequence[tuple[str, Sequence | None]] | None = None,
             name_hint: str | None = None, source: str | None = None,
             evaluator: Callable[[list[np.ndarray | None]], list[np.ndarray]] | None = None):
        """Record one node; return its outputs as Tensors."""
        from graphc.dsl.tensor import Tensor

        source = source or user_source()
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        in_values = [None if t is None else t.value for t in inputs]
        prefix = self.module_path[-1] if self.module_path else ""
        node_name = self.unique(f"{prefix}/{op_type}" if prefix else op_type)
        base = name_hint or op_type.lower()
        out_values = [ir.Value(name=self.unique(f"{prefix}.{base}" if prefix else base)) for _ in range(num_outputs)]
        node = ir.Node("", op_type, in_values, attributes=_to_attrs(attrs), outputs=out_values,
                       name=node_name, metadata_props={SOURCE_KEY: source})
        if out_types is None:
            out_types = self._infer(node, inputs, source)
        for value, (dtype, shape) in zip(out_values, out_types):
            if dtype is not None:
                value.type = ir.TensorType(ir.DataType(to_onnx(dtype)))
            value.shape = None if shape is None else ir.Shape(list(shape))
        self.scope.nodes.append(node)
        outs = [Tensor(v) for v in out_values]
        if self.eager and all(t is None or t._value is not None for t in inputs):
            if evaluator is not None:
                results = evaluator([None if t is None else t._value for t in inputs])
            else:
                results = self._evaluate(node, inputs, attrs, source)
            for t, r in zip(outs, results):
                t._value = r
                self.values[id(t.value)] = r
        return outs

    def trace_subgraph(self, fn: Callable, args: Sequence[Any], in_types: Sequence[tuple[str, str, Any]],
                       name: str) -> tuple[ir.Graph, list[Any], bool]:
        """Trace ``fn(*args, *inputs)`` into a body graph whose inputs have ``in_types``
        (name hint, dtype, shape). Returns (graph, output Tensors, whether fn returned a sequence)."""
        from graphc.dsl.tensor import Tensor

        scope = Scope(eager=False)
        self.scopes.append(scope)
        try:
            values = [self.new_value(self.unique(hint), dtype, shape) for hint, dtype, shape in in_types]
            result = fn(*args, *[Tensor(v) for v in values])
            is_seq = isinstance(result, (tuple, list))
            items = list(result) if is_seq else [result]
            produced = {id(v) for node in scope.nodes for v in node.outputs}
            outs = []
            for item in items:
                if not isinstance(item, Tensor):
                    from graphc.dsl.ops import lift

                    item = lift(item)
                if id(item.value) not in produced:
                    (item,) = self.emit("Identity", [item])
                    produced.add(id(item.value))
                outs.append(item)
        finally:
            self.scopes.pop()
        graph = ir.Graph(values, [t.value for t in outs], nodes=scope.nodes, name=self.unique(name))
        return graph, outs, is_seq

    def _infer(self, node: ir.Node, inputs: Sequence[Any], source: str) -> list[tuple[str | None, Any]]:
        proto = ir.serde.serialize_node(node)
        types, data = {}, {}
        for t in inputs:
            if t is None:
                continue
            types[t.value.name] = onnx.helper.make_tensor_type_proto(to_onnx(t.dtype), _proto_dims(t.shape))
            if t._const is not None:
                data[t.value.name] = onnx.numpy_helper.from_array(t._const, t.value.name)
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, "")
            result = onnx.shape_inference.infer_node_outputs(schema, proto, types, data,
                                                             opset_imports=self.opset_protos)
        except Exception as exc:  # onnx raises InferenceError, ValidationError, SchemaError
            msg = str(exc).replace("[ShapeInferenceError] ", "").replace("[TypeInferenceError] ", "").strip()
            raise op_error(node.op_type, inputs, msg, source) from None
        out = []
        for value in node.outputs:
            tp = result.get(value.name)
            if tp is None or not tp.HasField("tensor_type"):
                out.append((None, None))
                continue
            tt = tp.tensor_type
            dtype = as_dtype(tt.elem_type) if tt.elem_type else None
            shape = None
            if tt.HasField("shape"):
                shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
            out.append((dtype, shape))
        return out

    def _evaluate(self, node: ir.Node, inputs: Sequence[Any], attrs: dict, source: str) -> list[np.ndarray]:
        arrays = [None if t is None else t._value for t in inputs]
        try:
            return _eager.run(node.op_type, arrays, attrs, self.opset, node_outputs=len(node.outputs))
        except GraphError:
            raise
        except Exception as exc:
            vals = ", ".join(f"{describe(t)}" for t in inputs)
            raise GraphError(f"{node.op_type} failed on example values ({vals}) at {source}: {exc}") from None


def op_error(op: str, operands: Sequence[Any], msg: str, source: str) -> GraphError:
    """The one GraphError template: op, operand types, what is wrong, user's line."""
    parts = [describe(t) for t in operands]
    vals = [f"{describe(t)}={_short(t._value)}" for t in operands
            if t is not None and hasattr(t, "_value") and t._value is not None]
    extra = f"; values {', '.join(vals)}" if vals else ""
    return GraphError(f"{op}({', '.join(parts)}): {msg} at {source}{extra}")


def _short(array: np.ndarray) -> str:
    return np.array2string(np.asarray(array), threshold=6, edgeitems=2, precision=4).replace("\n", "")


def _proto_dims(shape):
    if shape is None:
        return None
    return [d if isinstance(d, (int, str)) else None for d in shape]


def _to_attrs(attrs: dict[str, Any]) -> list[ir.Attr]:
    out = []
    for key, value in attrs.items():
        if isinstance(value, bool):
            out.append(ir.AttrInt64(key, int(value)))
        elif isinstance(value, int):
            out.append(ir.AttrInt64(key, value))
        elif isinstance(value, float):
            out.append(ir.AttrFloat32(key, value))
        elif isinstance(value, str):
            out.append(ir.AttrString(key, value))
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            out.append(ir.AttrInt64s(key, value))
        elif isinstance(value, ir.Tensor):
            out.append(ir.AttrTensor(key, value))
        elif isinstance(value, ir.Attr):
            out.append(value)
        elif isinstance(value, ir.Graph):
            out.append(ir.AttrGraph(key, value))
        elif isinstance(value, bool):
            out.append(ir.AttrInt64(key, int(value)))
        elif isinstance(value, (ir.TensorProtocol, np.ndarray)):
            out.append(ir.AttrTensor(key, value if not isinstance(value, np.ndarray) else ir.tensor(value)))
        else:
            out.append(ir.convenience.convert_attribute(key, value))
    return out

__all__ = ["Builder", "current", "op_error", "user_source"]
