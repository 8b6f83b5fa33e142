"""`gc.Model`: an onnx-ir model with graphc's conveniences, and `gc.load` for any ONNX file.

The package holds what a model is made of too: ``dtypes`` (dtypes and ``TensorSpec``), ``file``
(reading a model file safely: every tensor found, external data confined to the model's folder)
and ``inspection`` (model statistics)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from graphc.errors import ModelLoadError
from graphc.fileio import fsync_dir, missing, scratch_dir, sync_tree
from graphc.model.dtypes import FLOAT_DTYPES, TensorSpec, as_dtype
from graphc.model.file import check_external_data, densify_sparse_initializers, read_external_data
from graphc.passes.values import onnx_opset, static_shape

SOURCE_KEY = "graphc.source"
BUFFERS_KEY = "graphc.buffers"  # model metadata: the initializers gc.capture made of module buffers, comma-separated
# BatchNormalization node metadata of torch's cumulative moving average (``momentum=None``): the
# name of its ``num_batches_tracked`` counter, and the count at capture (training graphs step it)
COUNTER_KEY = "graphc.num_batches_tracked"
COUNT_KEY = "graphc.batches_tracked"
# BatchNormalization node metadata: an inference BatchNorm ``gc.vmap`` ran on the examples folded into N
# (the user's line); the training graphs refuse to switch it to batch statistics, which would span them
VMAP_FOLDED_KEY = "graphc.vmap_folded"
# node metadata: the activation-checkpoint region (``gc.utils.checkpoint``) a node was captured in, an id
# unique in its model; the training graphs' backward recomputes the region's values from its inputs
CHECKPOINT_KEY = "graphc.checkpoint"
# node metadata of a checkpoint region's copy the backward reads (``passes/training/recompute.py``), the
# original node's name: onnxruntime sessions of a model holding one keep the copies (``keep_recomputation``)
RECOMPUTED_KEY = "graphc.recomputed"
# Models with more initializer bytes than this are saved with external data (protobuf caps a
# single message at 2 GiB; staying well below keeps onnxruntime and the checker happy).
EXTERNAL_DATA_THRESHOLD = 1 << 30


# The ai.onnx opsets graphc's DSL and training passes emit; a model newer than the last is
# converted down before graphs are built from it (``graphc.compile.opsets.emitted_opset``).
EMITTED_OPSETS = range(17, 24)


def ir_version_for(opset_imports: dict[str, int]) -> int:
    """The lowest IR version that supports these opsets (what older runtimes accept)."""
    ids = [onnx.helper.make_opsetid(domain, version) for domain, version in opset_imports.items()]
    return max(7, onnx.helper.find_min_ir_version_for(ids, ignore_unknown=True))


# Dim names that exporters write for "unknown" (Paddle: ``?``); each such axis is unknown on its
# own, so two axes both named ``?`` are not tied together as a real symbol such as ``N`` ties them.
UNKNOWN_DIM_NAMES = frozenset({"", "?", "-1", "None"})


def spec_dim(dim: int | ir.SymbolicDim) -> int | str | None:
    """A dim as TensorSpec holds it: negative ints (``-1``) and placeholder names are None."""
    if isinstance(dim, int):
        return dim if dim >= 0 else None
    return None if dim.value is None or dim.value in UNKNOWN_DIM_NAMES else dim.value


def value_spec(value: ir.Value) -> TensorSpec:
    shape = None
    if value.shape is not None:
        shape = tuple(spec_dim(d) for d in value.shape)
    dtype = value.dtype
    name = as_dtype(int(dtype)) if dtype is not None else "float32"
    return TensorSpec(name=value.name or "", dtype=name, shape=shape)


def node_source(node: ir.Node | onnx.NodeProto) -> str | None:
    """The user's ``file.py:LINE`` recorded for a node at capture, if any."""
    if isinstance(node, onnx.NodeProto):
        return next((p.value for p in node.metadata_props if p.key == SOURCE_KEY), None)
    return node.metadata_props.get(SOURCE_KEY)


def node_label(name: str, index: int | None = None) -> str:
    """How a message names a node: ``node 'fc1'``, or ``unnamed node #3`` (its index in its graph)
    for one without a name, which ONNX allows."""
    return f"node {name!r}" if name or index is None else f"unnamed node #{index}"


class Model:
    """A graph with its parameters. Wraps an ``onnx_ir.Model``; nothing is copied on access."""

    def __init__(self, model: ir.Model):
        if not isinstance(model, ir.Model):
            raise TypeError(f"gc.Model wraps an onnx_ir.Model, got {type(model).__name__}")
        self._ir = model

    # -- views -------------------------------------------------------------------------------
    @property
    def ir(self) -> ir.Model:
        return self._ir

    @property
    def graph(self) -> ir.Graph:
        return self._ir.graph

    @property
    def name(self) -> str:
        return self._ir.graph.name or "model"

    @property
    def opset(self) -> int:
        return onnx_opset(self._ir, 0)

    @property
    def ir_version(self) -> int:
        """The IR version ``proto`` and ``save`` stamp: the lowest its opsets need."""
        return ir_version_for(dict(self._ir.opset_imports))

    @property
    def proto(self) -> onnx.ModelProto:
        """The model as protobuf, stamped with the lowest IR version its opsets need."""
        proto = ir.serde.serialize_model(self._ir)
        proto.ir_version = self.ir_version
        return proto

    @property
    def inputs(self) -> list[TensorSpec]:
        """Graph inputs a caller feeds (initializer-backed inputs included: they have defaults)."""
        return [value_spec(v) for v in self._ir.graph.inputs]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [value_spec(v) for v in self._ir.graph.outputs]

    @property
    def params(self) -> dict[str, np.ndarray]:
        """Floating-point initializers by name, as numpy arrays."""
        out = {}
        for name, value in self._ir.graph.initializers.items():
            if value.const_value is None or value.dtype is None:
                continue
            if as_dtype(int(value.dtype)) in FLOAT_DTYPES:
                out[name] = value.const_value.numpy()
        return out

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"<gc.Model {self.name!r} ({ins}) -> ({outs}), {len(self._ir.graph)} nodes, opset {self.opset}>"

    def summary(self) -> str:
        from graphc.model.inspection import summary

        return summary(self)

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: Union[str, os.PathLike], external_data: bool | None = None,
             size_threshold_bytes: int = 1024) -> Path:
        """Write ``path`` atomically. Large models (or ``external_data=True``) keep tensors of
        ``size_threshold_bytes`` or more in ``<file>.data`` beside the model."""
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(f"cannot save the model as {path}: it is a directory; give a file path such "
                                    f"as {path / 'model.onnx'}")
        if external_data is None:
            external_data = _initializer_bytes(self._ir) > EXTERNAL_DATA_THRESHOLD
        saved_ir_version = self._ir.ir_version
        self._ir.ir_version = self.ir_version
        try:
            # Write into a scratch folder beside the target, then move each file into place:
            # a crash leaves the previous file intact, never a half-written one.
            with scratch_dir(path) as tmp:
                tmp_model = tmp / path.name
                data_name = f"{path.name}.data" if external_data else None
                ir.save(self._ir, tmp_model, external_data=data_name,
                        size_threshold_bytes=size_threshold_bytes)
                sync_tree(tmp)
                if data_name and (tmp / data_name).exists():
                    os.chmod(tmp / data_name, 0o644)
                    os.replace(tmp / data_name, path.parent / data_name)
                os.chmod(tmp_model, 0o644)
                os.replace(tmp_model, path)
            fsync_dir(path.parent)
        finally:
            self._ir.ir_version = saved_ir_version
        return path


def _initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def _read_model_file(path: Path) -> bytes:
    try:
        if not path.is_file():
            raise ModelLoadError(f"{path}: " + ("not a file (a folder or a device)" if path.exists()
                                                else missing(path, "model file")))
        return path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the model file ({exc.strerror or exc})") from None


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: not a valid ONNX model (corrupt or truncated protobuf: {exc})") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelLoadError(f"{where}: not an ONNX model (no graph found; truncated or another file type?)")
    return proto


def _check(checked: onnx.ModelProto | str, where: str) -> None:
    """onnx's checker on the proto, or on the file path: a path is how the checker handles
    models whose external data is over protobuf's 2 GiB (the proto is checked before that
    data is read into it), and it applies onnx's own external-data rules on top of ours."""
    try:
        onnx.checker.check_model(checked)
    except Exception as exc:  # noqa: BLE001 - the checker raises ValidationError, parse and inference errors
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise ModelLoadError(f"{where}: invalid ONNX model: {'; '.join(lines[:2]) or type(exc).__name__}") from None


def _import(proto: onnx.ModelProto, where: str, path: Path | None) -> Model:
    """Validate, read external data, check and convert a parsed model; every failure is ModelLoadError."""
    try:
        plan = check_external_data(proto, path.parent if path is not None else None)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{where}: {exc}") from None
    _check(str(path) if path is not None and plan else proto, where)
    try:
        read_external_data(plan)
        proto = densify_sparse_initializers(proto)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{where}: {exc}") from None
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:  # noqa: BLE001 - onnx-ir raises SerdeError, ValueError, KeyError, ... on odd protos
        raise ModelLoadError(f"{where}: cannot import the model ({type(exc).__name__}: {str(exc)[:200]})") from None
    for kind, values in (("input", model.graph.inputs), ("output", model.graph.outputs)):
        for value in values:  # onnx's checker lets it pass; onnxruntime refuses the model
            if value.dtype == ir.DataType.UNDEFINED:
                raise ModelLoadError(f"{where}: graph {kind} {value.name!r} has an undefined element type "
                                     "(data type 0); the file is corrupt")
    _forget_placeholder_dims(model.graph)
    return Model(model)


def load(source: Union[str, os.PathLike, bytes, onnx.ModelProto, ir.Model, Model]) -> Model:
    """Import any valid ONNX model: a path, serialized bytes, a ``ModelProto`` or an IR model.

    Every failure is ``ModelLoadError`` naming the file and the problem. External data is read
    only from files inside the model's folder (see ``graphc.model.file``), and only when the
    model is given by its path."""
    if isinstance(source, Model):
        return source
    if isinstance(source, ir.Model):
        return Model(source)
    if isinstance(source, onnx.ModelProto):
        return _import(source, "<ModelProto>", None)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _import(_parse(bytes(source), "<bytes>"), "<bytes>", None)
    path = Path(source)
    return _import(_parse(_read_model_file(path), str(path)), str(path), path)


def _forget_placeholder_dims(graph: ir.Graph) -> None:
    """Dims written as ``-1`` or a placeholder name (``?``) become unknown, each on its own, on
    the graph's inputs and outputs, so shape inference never equates two of them."""
    for value in [*graph.inputs, *graph.outputs]:
        if value.shape is None:
            continue
        dims = [spec_dim(d) for d in value.shape]
        if tuple(dims) != static_shape(value):
            value.shape = ir.Shape(dims)
