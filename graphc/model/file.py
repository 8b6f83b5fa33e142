"""Reading an ONNX file safely: every tensor found, strings checked, external data confined.

Nothing outside the model's folder is ever opened. Every ``TensorProto`` anywhere in the model
(graph and nested subgraphs, functions, Constant and other attribute tensors, sparse tensors'
values and indices, training info) is found by walking the protobuf by its descriptors, so no
place that can hold a tensor is missed. Each external-data entry is validated against the
folder before the first byte of any data file is read.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from graphc.errors import ModelLoadError
from graphc.model.graphs import all_graphs, model_graphs, node_subgraphs
from graphc.model.inferred import tensor_types

# The keys onnx defines (onnx/external_data_helper.py); anything else is refused.
EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})
_DIGITS = re.compile(r"[0-9]{1,19}")  # a non-negative integer below 10**19 (fits int64/off_t)
_DATA_TYPES = frozenset(int(t) for t in ir.DataType)  # what onnx-ir can read and write again


@functools.cache
def _walked_fields(descriptor: Descriptor) -> tuple[tuple[str, bool, bool], ...]:
    """(name, is a string, is repeated) of the string and message fields of a message type:
    where text and tensors can hide (bytes fields such as ``raw_data`` are never touched, so
    no tensor data is copied)."""
    return tuple((f.name, f.type == FieldDescriptor.TYPE_STRING, f.is_repeated) for f in descriptor.fields
                 if f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE))


def tensors(message, where: str = "model") -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every ``TensorProto`` under ``message`` with where it sits (``graph.node[3](c).attribute[0](value).t``).

    Raises ``ModelLoadError`` for a string field that is not UTF-8 (protobuf hands those back
    as bytes; onnx-ir could import the model but never write it again). A tensor is yielded
    after its own fields are checked, so its external-data keys and values are text."""
    for name, is_string, repeated in _walked_fields(message.DESCRIPTOR):
        if is_string:
            values = getattr(message, name)
            for i, value in enumerate(values if repeated else (values,)):
                if type(value) is bytes:
                    place = f"{where}.{name}" + (f"[{i}]" if repeated else "")
                    raise ModelLoadError(f"{place} is not UTF-8 text ({value[:40]!r}); the file is corrupt")
        elif repeated:
            for i, value in enumerate(getattr(message, name)):
                yield from tensors(value, f"{where}.{name}[{i}]{_label(value)}")
        elif message.HasField(name):
            value = getattr(message, name)
            yield from tensors(value, f"{where}.{name}{_label(value)}")
    if type(message) is onnx.TensorProto:
        yield where, message


def _label(message) -> str:
    """``(name)`` for a message with a text ``name`` (a node, graph, tensor, function), else
    ``""``; a name with a line break or other unprintable character escaped, so an error that
    quotes it stays one line."""
    name = getattr(message, "name", None)
    if type(name) is not str or not name:
        return ""
    return f"({name if name.isprintable() else name.encode('unicode_escape').decode('ascii')})"


@dataclass(frozen=True)
class _Extent:
    """Where one tensor's bytes are: a validated file in the model's folder, and a byte range."""

    path: Path
    device: int
    inode: int
    offset: int
    length: int


def _fail(where: str, tensor: onnx.TensorProto, problem: str) -> ModelLoadError:
    return ModelLoadError(f"tensor {tensor.name!r} ({where}): {problem}")


def _external_entries(where: str, tensor: onnx.TensorProto) -> dict[str, str]:
    """The external-data keys of ``tensor``: known keys only, each at most once.

    Readers disagree on a repeated key (onnx's Python loader and onnxruntime take the last
    ``location``, others the first), so a checker that picks either one can be fooled by the
    other: a repeated key is refused outright."""
    entries: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in EXTERNAL_KEYS:
            raise _fail(where, tensor, f"unknown external-data key {entry.key[:60]!r} "
                                       f"(expected {', '.join(sorted(EXTERNAL_KEYS))})")
        if entry.key in entries:
            raise _fail(where, tensor, f"external-data key {entry.key!r} is given more than once")
        entries[entry.key] = entry.value
    return entries


def _number(where: str, tensor: onnx.TensorProto, entries: dict[str, str], key: str) -> int | None:
    text = entries.get(key)
    if text is None:
        return None
    if not _DIGITS.fullmatch(text):
        raise _fail(where, tensor, f"external-data {key} {text[:40]!r} is not a non-negative integer")
    return int(text)


def _confined_file(where: str, tensor: onnx.TensorProto, base_dir: Path, location: str) -> tuple[Path, os.stat_result]:
    """The data file ``location`` names, checked to lie inside ``base_dir`` (without opening it).

    The rule follows onnx's checker (onnx/checker.cc ``resolve_external_data_location``): a
    relative path without ``..``, whose real path (every symlink resolved) is inside the
    model's folder, not itself a symlink, a regular file, and with one hard link only. A hard
    link has no "target" to resolve: the same inode may also be named outside the folder (a
    link to a secret planted beside the model), and nothing in the folder can tell the two
    apart, so any file with ``st_nlink > 1`` is refused, as onnx does."""
    if not location:
        raise _fail(where, tensor, "external data has no 'location'")
    if "\x00" in location:
        raise _fail(where, tensor, f"external-data location {location[:60]!r} contains a NUL byte")
    parts = location.replace("\\", "/").split("/")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ".." in parts:
        raise _fail(where, tensor, f"external-data location {location[:100]!r} points outside the model's folder "
                                   f"{base_dir} (an absolute path or '..'); refusing to read it")
    root = base_dir.resolve()
    candidate = base_dir / location
    real = Path(os.path.realpath(candidate))
    if not real.is_relative_to(root):
        raise _fail(where, tensor, f"external-data location {location[:100]!r} resolves to {real}, outside "
                                   f"the model's folder {root}; refusing to read it")
    try:
        info = os.lstat(candidate)
    except OSError as exc:
        raise _fail(where, tensor, f"external data file {candidate} cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise _fail(where, tensor, f"external data file {candidate} is a symbolic link; refusing to follow it")
    if not stat.S_ISREG(info.st_mode):
        raise _fail(where, tensor, f"external data file {candidate} is not a regular file")
    if info.st_nlink > 1:
        raise _fail(where, tensor, f"external data file {candidate} has {info.st_nlink} hard links; a hard-linked "
                                   "file may be a file outside the model's folder, refusing to read it")
    return candidate, info


def check_external_data(proto: onnx.ModelProto, base_dir: Path | None) -> list[tuple[onnx.TensorProto, _Extent]]:
    """Validate every tensor's data type and external data (nothing is read). Returns what to
    read, in order. (onnx's checker leaves the tensors of functions' nodes unchecked; onnx-ir
    imports an unknown data type and fails only when the model is written again.)"""
    plan = []
    for where, tensor in tensors(proto):
        if tensor.data_type not in _DATA_TYPES:
            raise _fail(where, tensor, f"data type {tensor.data_type} is not one ONNX defines; the file is corrupt")
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            if tensor.external_data:
                raise _fail(where, tensor, "has external-data entries but its data_location is not EXTERNAL")
            continue
        entries = _external_entries(where, tensor)
        if base_dir is None:
            raise _fail(where, tensor, f"keeps its data in external file {entries.get('location', '')[:100]!r}, but "
                                       "the model was given as bytes; load it from its file path instead")
        path, info = _confined_file(where, tensor, base_dir, entries.get("location", ""))
        offset = _number(where, tensor, entries, "offset") or 0
        length = _number(where, tensor, entries, "length")
        if offset > info.st_size:
            raise _fail(where, tensor, f"external-data offset {offset} is past the end of {path} ({info.st_size} bytes)")
        if length is None:
            length = info.st_size - offset
        elif offset + length > info.st_size:
            raise _fail(where, tensor, f"external-data range {offset}+{length} is past the end of {path} "
                                       f"({info.st_size} bytes)")
        wanted = _data_bytes(tensor)
        if wanted is not None and length != wanted:
            shape = "x".join(map(str, tensor.dims)) or "scalar"
            raise _fail(where, tensor, f"external-data range {offset}+{length} of {path} holds {length:,} bytes, but "
                                       f"its {ir.DataType(tensor.data_type).name} {shape} data takes {wanted:,}")
        plan.append((tensor, _Extent(path, info.st_dev, info.st_ino, offset, length)))
    return plan


def _data_bytes(tensor: onnx.TensorProto) -> int | None:
    """How many bytes the tensor's dims take in raw form (sub-byte types packed); None for strings
    and an undefined type (no size to check)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    count = 1
    for dim in tensor.dims:
        count *= max(int(dim), 0)
    return -(-count * ir.DataType(tensor.data_type).bitwidth // 8)


def read_external_data(plan: list[tuple[onnx.TensorProto, _Extent]]) -> None:
    """Move each planned tensor's bytes into the proto. Files are opened without following a
    symlink and must still be the inode that was checked (a file swapped in between is refused).
    onnx's ``load_external_data_for_model`` is not used: it skips sparse tensors and resolves
    paths again by name, after our check."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for tensor, extent in plan:
        try:
            fd = os.open(extent.path, flags)
        except OSError as exc:
            raise ModelLoadError(f"tensor {tensor.name!r}: cannot open {extent.path} ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if (info.st_dev, info.st_ino) != (extent.device, extent.inode) or info.st_nlink > 1:
                raise ModelLoadError(f"tensor {tensor.name!r}: {extent.path} changed while the model was loading")
            f.seek(extent.offset)
            data = f.read(extent.length)
        if len(data) != extent.length:
            raise ModelLoadError(f"tensor {tensor.name!r}: {extent.path} is shorter than its external-data range "
                                 f"{extent.offset}+{extent.length}")
        tensor.raw_data = data
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def unique_node_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when no two of its nodes (subgraphs included) share a non-empty name;
    else a copy in which each repeat gets a suffix (``n`` and ``n_1``). ONNX lets nodes share a
    name (it is for diagnostics), onnxruntime refuses such a model."""
    names = [node.name for graph in all_graphs(model.graph) for node in graph.node if node.name]
    if len(names) == len(set(names)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken, seen = set(names), set()
    for graph in all_graphs(copy.graph):
        for node in graph.node:
            if node.name and node.name in seen:
                k = 1
                while f"{node.name}_{k}" in taken:
                    k += 1
                node.name = f"{node.name}_{k}"
                taken.add(node.name)
            seen.add(node.name)
    return copy


def _subgraphs(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto]]:
    """``node_subgraphs`` of ``model``'s main graph and local functions: every graph but the main one."""
    return node_subgraphs([*model.graph.node, *(n for f in model.functions for n in f.node)])


def _aliased(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[int]:
    """Indices of ``graph``'s outputs onnxruntime 1.31 runs wrong: a repeat of an earlier output,
    and in a Scan's body an output that is one of the body's inputs."""
    taken = {i.name for i in graph.input} if node.op_type == "Scan" and node.domain in ("", "ai.onnx") else set()
    found = []
    for k, out in enumerate(graph.output):
        if out.name in taken:
            found.append(k)
        taken.add(out.name)
    return found


def distinct_subgraph_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when no subgraph output is aliased (``_aliased``); else a copy in which each
    is an Identity of the value. ONNX allows both, onnxruntime 1.31 runs them wrong: a Scan whose
    body lists one value as two outputs (``lambda h, x: (h2, h2)``: the carry and the scanned
    output) gave outputs up to 0.9 off, an If's second output was uninitialised memory (1e35); a
    Scan body passing a state or a scanned input straight out gave zeros, NaN or garbage (a Loop's
    body doing so runs right)."""
    if not any(_aliased(node, g) for node, g in _subgraphs(model)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken = {name for g in model_graphs(copy) for n in g.node for name in n.output}
    for node, graph in _subgraphs(copy):
        for k in _aliased(node, graph):
            out, i = graph.output[k], 1
            while f"{out.name}_{i}" in taken:
                i += 1
            graph.node.append(onnx.helper.make_node("Identity", [out.name], [f"{out.name}_{i}"]))
            out.name = f"{out.name}_{i}"
            taken.add(out.name)
    return copy


def _undeclared_body_outputs(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, int, int | None]]:
    """(node, body output index, scan axis or None for a state) of every output of the bodies of
    ``graph``'s Loops and Scans declared without a shape (a Loop's condition aside)."""
    found = []
    for node in graph.node:
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if node.op_type not in ("Loop", "Scan") or body is None:
            continue
        first = len(node.input) - 1 if node.op_type == "Loop" else len(node.input) - next(
            a.i for a in node.attribute if a.name == "num_scan_inputs")
        axes = next((list(a.ints) for a in node.attribute if a.name == "scan_output_axes"), None)
        for k in range(node.op_type == "Loop", len(body.output)):
            if not body.output[k].type.tensor_type.HasField("shape"):
                found.append((node, k, None if k < first else axes[k - first] if axes else 0))
    return found


def with_body_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when every Loop's and Scan's body declares its outputs' shapes (onnxruntime
    refuses a Scan body that does not: "Subgraph must have the shape set for all outputs"); else a
    copy in which onnx's shape inference gives them, and one it leaves unknown takes the node's
    declared output's (a scan output's less its scan axis), else for a Scan's state the body's
    input's. A scan output of no steps takes its dims from there (unknown ones 0), in the numpy
    backend and in ``backends.scans``'s guard, as onnxruntime's do. A local function's bodies are
    inferred with its inputs typed as at its calls (``_function_model``)."""
    if not any(_undeclared_body_outputs(g) for g in model_graphs(model)):
        return model
    copy = _inferred(model)
    for graph in all_graphs(copy.graph):
        _declare_body_outputs(graph)
    for function in copy.functions:
        typed = _inferred(_function_model(copy, function)).graph
        for graph in all_graphs(typed):
            _declare_body_outputs(graph)
        del function.node[:]
        function.node.extend(typed.node)
    return copy


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with onnx's shape inference, a plain copy where it fails."""
    try:
        return onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy


def _function_model(model: onnx.ModelProto, function: onnx.FunctionProto) -> onnx.ModelProto:
    """A model whose graph is ``function``'s nodes, each input typed as at the function's calls in
    ``model``'s (shape-inferred) main graph and its subgraphs where they all agree, else untyped
    (and all untyped where another function calls it)."""
    called = lambda n: (n.domain, n.op_type) == (function.domain, function.name)  # noqa: E731
    graphs = list(all_graphs(model.graph))
    types = {v.name: v.type for g in graphs for v in [*g.input, *g.output, *g.value_info]}
    calls = [n for g in graphs for n in g.node if called(n)]
    if any(called(n) for g in model_graphs(model)[len(graphs):] for n in g.node):
        calls = []
    inputs = []
    for i, name in enumerate(function.input):
        seen = {types[c.input[i]].SerializeToString() if i < len(c.input) and c.input[i] in types else None
                for c in calls}
        value = onnx.helper.make_empty_tensor_value_info(name)
        if len(seen) == 1 and None not in seen:
            value.type.CopyFrom(types[calls[0].input[i]])
        inputs.append(value)
    opsets = {o.domain: o.version for o in [*model.opset_import, *function.opset_import]}
    graph = onnx.helper.make_graph(list(function.node), function.name, inputs, [])
    return onnx.helper.make_model(graph, ir_version=model.ir_version, functions=list(model.functions),
                                  opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])


def _declare_body_outputs(graph: onnx.GraphProto) -> None:
    """Gives each of ``_undeclared_body_outputs(graph)`` the shape ``with_body_output_shapes`` says."""
    types = {v.name: v.type.tensor_type for v in [*graph.output, *graph.value_info]}
    for node, k, axis in _undeclared_body_outputs(graph):
        body = next(a.g for a in node.attribute if a.name == "body")
        j = k - (node.op_type == "Loop")  # the node's output for body output k
        outer = types.get(node.output[j]) if j < len(node.output) else None
        dims = list(outer.shape.dim) if outer is not None and outer.HasField("shape") else None
        if dims is not None and axis is not None and dims:
            del dims[axis % len(dims)]
        elif dims is None and axis is None and node.op_type == "Scan" and body.input[k].type.tensor_type.HasField("shape"):
            dims = list(body.input[k].type.tensor_type.shape.dim)
        if dims is not None:
            shape = body.output[k].type.tensor_type.shape
            shape.SetInParent()
            shape.dim.extend(dims)


def constant_tensors(graphs: list[onnx.GraphProto]) -> dict[str, onnx.TensorProto]:
    """Value name -> tensor for the constants of ``graphs``: their initializers that are not also
    inputs (a fed one takes the caller's value) and their ``Constant`` nodes' ``value``s."""
    fed = {i.name for g in graphs for i in g.input}
    out = {t.name: t for g in graphs for t in g.initializer if t.name not in fed}
    out.update({node.output[0]: a.t for g in graphs for node in g.node if node.op_type == "Constant"
                and node.domain in ("", "ai.onnx") for a in node.attribute if a.name == "value"})
    return out


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    """The opset ``model`` imports for the default (ai.onnx) domain; 0 where it imports none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def with_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose main graph holds ``nodes`` in place of its own (a backend's
    rewrite of the session's copy; ``model`` itself is not changed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def clip_bounds_like_input(model: onnx.ModelProto) -> None:
    """Give, in place, each main-graph Clip's bounds made by a ``Constant`` that only it reads its
    input's element type: onnx's version converter turns Clip-6's ``min``/``max`` attributes into
    float32 Constants whatever the input's type (a double Clip then mixes dtypes)."""
    clips = [n for n in model.graph.node if n.op_type == "Clip" and n.domain in ("", "ai.onnx") and len(n.input) > 1]
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
    bounds = [(clip, const) for clip in clips for name in clip.input[1:]
              if (const := constants.get(name)) is not None and readers[name] == 1
              and const.attribute[0].name == "value"]
    types = tensor_types(model) if bounds else None  # shape inference only where a bound may need it
    if not types:
        return
    for clip, const in bounds:
        elem = types.get(clip.input[0], (0, None))[0]
        tensor = const.attribute[0].t
        if elem and tensor.data_type != elem:
            array = numpy_helper.to_array(tensor).astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def densify_sparse_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every graph's sparse initializers made dense (a copy when there are any:
    the caller's proto is not changed). onnx-ir has no sparse tensors and drops them with a
    warning, which would leave their readers without an input; onnx has no converter for
    SparseTensorProto, so this is written here (zeros, values put at indices)."""
    if not any(graph.sparse_initializer for graph in all_graphs(proto.graph)):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    proto = copy
    for graph in all_graphs(proto.graph):
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            try:
                values = numpy_helper.to_array(sparse.values).reshape(-1)
                indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
                dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
                if indices.ndim == 2:  # [NNZ, rank] coordinates
                    dense[tuple(indices.T)] = values
                else:  # [NNZ] positions in the flattened tensor
                    dense.reshape(-1)[indices] = values
            except (ValueError, IndexError, TypeError) as exc:
                raise ModelLoadError(f"sparse initializer {name!r}: values, indices and dims do not agree ({exc})") from None
            graph.initializer.append(numpy_helper.from_array(dense, name))
        graph.ClearField("sparse_initializer")
    return proto
