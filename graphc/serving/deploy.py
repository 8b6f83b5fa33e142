"""Deployment targets: a Triton Inference Server model repository (onnxruntime backend).

    gc.deploy.triton("model.onnx", "repo", "mnist", max_batch_size=64)
    # repo/mnist/config.pbtxt and repo/mnist/1/model.onnx (a redeploy adds 2/, 3/, ...)

Triton's bundled onnxruntime can be older than ours, so models go out at a conservative opset
(17, IR version 8) unless ``opset=`` asks otherwise; newer models are converted down with
``onnx.version_converter``. The config is text protobuf written here (no Triton packages needed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import onnx_ir as ir


from graphc.model.complex_io import complex_names, complex_spec
from graphc.model.dtypes import TensorSpec
from graphc.errors import GraphError, ModelLoadError
from graphc.fileio import atomic_write, fsync_dir, made_folders, scratch_dir
from graphc.model import Model, load
from graphc.model.file import distinct_subgraph_outputs, unique_node_names
from graphc.model.quantizers import without_record
from graphc.passes.values import drop_autograd_functions, holds_autograd_functions
from graphc.compile.opsets import convert_opset

__all__ = ["SERVER_OPSET", "check_model_name", "triton", "triton_config", "triton_versions"]

SERVER_OPSET = 17  # default opset of models written for servers (IR version 8)
_TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16",
    "int32": "TYPE_INT32", "int64": "TYPE_INT64", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16",
    "float32": "TYPE_FP32", "float64": "TYPE_FP64", "string": "TYPE_STRING",
}
_NAME_MAX = 128
_CLAIM_TRIES = 100
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,%d}" % (_NAME_MAX - 1))


def _quote(text: str) -> str:
    """A text-protobuf string literal (non-ASCII and control bytes as octal escapes)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 32 <= byte < 127:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _tensor_block(spec: TensorSpec, batched: bool, kind: str) -> list[str]:
    if spec.shape is None:
        raise GraphError(f"{kind} {spec.name!r} has an unknown rank; Triton needs the dims of every {kind}")
    if spec.dtype not in _TRITON_TYPES:
        raise GraphError(f"{kind} {spec.name!r} has dtype {spec.dtype}, which Triton cannot serve")
    dims = list(spec.shape)
    if batched:
        if not dims or isinstance(dims[0], int):
            raise GraphError(f"{kind} {spec} needs a symbolic leading (batch) dim for max_batch_size > 0; "
                             "capture it with a named dim such as 'N', or deploy with max_batch_size=0")
        dims = dims[1:]
    values = [d if isinstance(d, int) else -1 for d in dims]
    lines = ["  {", f"    name: {_quote(spec.name)}", f"    data_type: {_TRITON_TYPES[spec.dtype]}"]
    if values:
        lines.append(f"    dims: [ {', '.join(str(v) for v in values)} ]")
    else:  # Triton wants at least one dim: a scalar (per batch item) is [1] reshaped to []
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    lines.append("  }")
    return lines


def _list(field: str, blocks: list[list[str]]) -> list[str]:
    body: list[str] = []
    for i, block in enumerate(blocks):
        body += block[:-1] + [block[-1] + ("," if i < len(blocks) - 1 else "")]
    return [f"{field} [", *body, "]"]


def feedable_inputs(model: Model) -> list[TensorSpec]:
    """The inputs a caller must feed (inputs backed by an initializer have defaults)."""
    return [s for s in model.inputs if s.name not in model.graph.initializers]


def require_tensor_interface(model: Model, server: str) -> None:
    """Raise ``GraphError`` when a graph input or output is not a tensor (a sequence, map or
    optional): inference servers' protocols carry tensors only."""
    for kind, values in (("input", model.ir.graph.inputs), ("output", model.ir.graph.outputs)):
        for value in values:
            if value.type is not None and not isinstance(value.type, ir.TensorType):
                raise GraphError(f"model {model.name!r}: {kind} {value.name!r} is a {value.type}, not a tensor; "
                                 f"{server} carries tensors only")


def _complex_parameters(model: Model, specs: list[TensorSpec]) -> list[str]:
    """The model ``parameters`` naming which of ``specs`` are complex values' ``[..., 2]`` real pairs
    (``graphc.model.complex_io``), ``"complex:z"`` -> ``"complex128"``: Triton's inputs and outputs have no
    parameters of their own, where the KServe metadata lists ``{"complex": "complex128"}``."""
    complex_inputs, complex_outputs = complex_names(model.ir.metadata_props)
    lines = []
    for spec in specs:
        if spec.name in complex_inputs | complex_outputs:
            lines += [f"parameters {{ key: {_quote('complex:' + spec.name)} value: {{ string_value: "
                      f"{_quote(complex_spec(spec).dtype)} }} }}"]
    return lines


def triton_config(model: Model, name: str, max_batch_size: int = 0, instance: str = "cpu",
                  dynamic_batching: bool = False) -> str:
    """``config.pbtxt`` text for ``model`` on Triton's onnxruntime backend; its complex inputs and outputs
    named in the model's ``parameters`` (``_complex_parameters``)."""
    if max_batch_size < 0:
        raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
    if instance not in ("cpu", "gpu"):
        raise ValueError(f"instance must be 'cpu' or 'gpu', got {instance!r}")
    if dynamic_batching and max_batch_size == 0:
        raise ValueError("dynamic_batching needs max_batch_size > 0 (Triton batches along dim 0)")
    require_tensor_interface(model, "a Triton model configuration")
    batched = max_batch_size > 0
    lines = [f"name: {_quote(name)}", 'backend: "onnxruntime"', f"max_batch_size: {max_batch_size}"]
    lines += _list("input", [_tensor_block(s, batched, "input") for s in feedable_inputs(model)])
    lines += _list("output", [_tensor_block(s, batched, "output") for s in model.outputs])
    lines += ["instance_group [", "  {", "    count: 1", f"    kind: KIND_{instance.upper()}", "  }", "]"]
    if dynamic_batching:
        lines.append("dynamic_batching { }")
    lines += _complex_parameters(model, [*feedable_inputs(model), *model.outputs])
    return "\n".join(lines) + "\n"


def for_server(model: Model, opset: int | None = None) -> Model:
    """``model`` at the opset a server should get: ``opset`` if given, else at most 17; nodes that
    share a name renamed apart, which the server's onnxruntime requires (ONNX does not), and a
    subgraph's repeated outputs made distinct, which it runs wrong (``distinct_subgraph_outputs``)."""
    current = model.opset
    target = opset if opset is not None else min(current, SERVER_OPSET)
    model = convert_opset(model, target, hint="" if opset is not None else
                          f"pass opset={current} if the server's onnxruntime supports it")
    proto = model.proto
    renamed = distinct_subgraph_outputs(unique_node_names(proto))
    return model if renamed is proto else load(renamed)


def for_cpu_instances(model: Model) -> Model:
    """``model`` as graphc's ort-cpu sessions give it to onnxruntime's CPU provider, in the file
    itself (``graphc.backends.narrow_casts.lower_for_cpu``, which both call): Triton's onnxruntime
    gets the file as it is. Each float16 or bfloat16 node the provider has no kernel for is computed
    in float32 between Casts (else it refuses a bfloat16 ``Mul``, "Could not find an
    implementation", or computes a run of float16 nodes in float32: a product that overflows
    float16 finite), each Where of a one-element condition is an If that copies one branch, before
    that (``graphc.backends.selects``: onnxruntime's Where returned a -0.0 from X as +0.0).
    ``model`` itself where no node needs either."""
    from graphc.backends import narrow_casts

    proto = model.proto
    lowered = narrow_casts.lower_for_cpu(proto)
    return model if lowered is proto else load(lowered)


def _served(model: Model) -> Model:
    """``model`` as a server gets it, a copy where it changes: without the fake quantizers' record (checked
    before: ``graphc serve REPO`` serves the file as deployed) and the ``gc.autograd.Function`` backwards and
    their ``graphc.autograd`` import (no server differentiates; they were shipped at the model's opset)."""
    served = without_record(model.ir)
    if holds_autograd_functions(served):
        if served is model.ir:
            served = ir.serde.deserialize_model(ir.serde.serialize_model(served))
        drop_autograd_functions(served)
    return Model(served)


def _real_dir(path: Path, root: Path) -> Path:
    """``path``, checked to be a folder (not a symlink) whose real path is itself, inside ``root``."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or os.path.realpath(path) != str(path):
        raise GraphError(f"{path} is not a plain folder inside the repository {root} (a symlink or a file); "
                         "refusing to write there")
    return path


def triton_versions(model_dir: Union[str, os.PathLike]) -> list[int]:
    """The numeric version folders of a Triton model folder, lowest first. A number written with
    leading zeros (``0001``) is refused: it would be version 1 next to a folder ``1``, and
    ``model_dir / str(version)`` would not find it."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    numeric = [p.name for p in folder.iterdir() if p.name.isdigit() and p.name.isascii()]
    for name in numeric:
        if name != str(int(name)):
            raise ModelLoadError(f"{folder / name}: version folder {name!r} is not a plain version number; "
                                 f"rename it to {str(int(name))!r}")
    return sorted(int(name) for name in numeric)


def check_model_name(name: str) -> str:
    """``name`` if it is a plain folder name Triton and URLs accept, else ``ValueError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = repr(name) if len(str(name)) <= 80 else repr(str(name)[:80]) + f"... ({len(name)} characters)"
        raise ValueError(f"model name {shown} must be a plain folder name: 1 to {_NAME_MAX} letters, digits, "
                         "'_', '-' or '.', not starting with '.' or '-'")
    return name


@contextlib.contextmanager
def _repository_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the repository folder itself (no lock file is left in it)
    while a deploy numbers its version and writes the config, so that concurrent deploys, threads
    or processes, take 1, 2, ... in turn and the config is the highest version's. Where there is no
    ``fcntl`` (Windows) or the file system refuses the lock, the numbering's retry alone keeps
    deploys apart."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # pragma: no cover - e.g. a network file system without flock
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _next_version(model_dir: Path) -> Path:
    """The folder one above the highest version in ``model_dir``."""
    return model_dir / str(max(triton_versions(model_dir), default=0) + 1)


def _claim_version(staged: Path, model_dir: Path) -> Path:
    """Rename ``staged`` to the next free version number in ``model_dir``; a number another
    writer took first (one that holds no lock: another tool, or no ``flock`` here) is skipped."""
    for _ in range(_CLAIM_TRIES):
        target = _next_version(model_dir)
        try:
            os.rename(staged, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            continue
        fsync_dir(model_dir)
        return target
    raise GraphError(f"{model_dir}: other writers took every version number tried ({_CLAIM_TRIES} tries)")


def triton(model_or_path: Union[Model, str, os.PathLike, Any], repo_dir: Union[str, os.PathLike], name: str,
           max_batch_size: int = 0, instance: str = "cpu", dynamic_batching: bool = False,
           opset: int | None = None, external_data: bool | None = None, dtype: str | None = None,
           keep_io_types: bool = True, allow_uncalibrated: bool = False) -> Path:
    """Write ``repo_dir/name/config.pbtxt`` and ``repo_dir/name/<version>/model.onnx``; returns the model folder.

    The first deploy writes version 1; a redeploy writes a new version above the highest one
    there (Triton serves the highest by default) and keeps the older ones; concurrent deploys of
    one name each get their own version. Every folder written is a real folder inside
    ``repo_dir`` (no symlink is followed), and files are written whole or not at all: a failure
    removes only what it wrote, leaving the repository as it was.

    Args:
        model_or_path: a ``gc.Model`` or anything ``gc.load`` takes.
        name: the model's folder name: 1 to 128 letters, digits, ``_ - .``, not starting with
            ``.`` or ``-``.
        max_batch_size: > 0 lets Triton batch along dim 0, which must then be symbolic in every
            input and output; ``dims`` in the config leave it out.
        instance: ``"cpu"`` (KIND_CPU) or ``"gpu"`` (KIND_GPU).
        dynamic_batching: add ``dynamic_batching { }`` (needs ``max_batch_size > 0``).
        opset: the opset to write (default: the model's, at most 17).
        external_data: keep large tensors in ``model.onnx.data`` in the version folder (default:
            only when the model is too large for one protobuf).
        dtype: ``"float16"`` or ``"bfloat16"``: deploy ``gc.convert_float(model, dtype,
            keep_io_types)``; None: as it is.
        keep_io_types: with ``dtype``, the float32 inputs and outputs stay float32 (``TYPE_FP32``,
            Casts at the model's edges), so clients keep sending what they sent the float32
            model; False makes them ``TYPE_FP16``/``TYPE_BF16``. Only True without ``dtype``.
        allow_uncalibrated: deploy a capture whose fake quantizations' observers never saw data
            (their scales as built, 1.0 unless set by hand); refused by default. The file written holds
            no record of them (``graphc.model.quantizers``), so serving the repository asks nothing more.

    Raises:
        ValueError: a bad name or option.
        UncalibratedError: ``model_or_path`` is a capture whose fake quantizations were never
            calibrated (``graphc.compile.export.check_calibrated``), unless ``allow_uncalibrated``.
        GraphError: a dim 0 is fixed while ``max_batch_size > 0``, a dtype Triton lacks, an
            opset conversion that cannot be done, a bad ``dtype`` (or ``keep_io_types=False``
            without one), or a symlink or file where a folder goes.
    """
    from graphc.compile.export import check_calibrated
    from graphc.compile.precision import check_keep_io_types, convert_float

    check_model_name(name)
    check_keep_io_types(dtype, keep_io_types, default=True)
    model = load(model_or_path)
    check_calibrated(model.ir, allow_uncalibrated=allow_uncalibrated)
    model = _served(model)
    if dtype is not None:
        model = convert_float(model, dtype, keep_io_types=keep_io_types)
    model = for_server(model, opset)
    if instance == "cpu":
        model = for_cpu_instances(model)
    config = triton_config(model, name, max_batch_size, instance, dynamic_batching)
    root = Path(repo_dir).resolve()
    model_dir = root / name
    version_dir = None  # what this call wrote, removed again if a later step fails
    # the model folder and repository folders this call makes go again on a failure, while empty (a concurrent
    # deploy's versions and config stay)
    with made_folders(model_dir):
        try:
            root.mkdir(parents=True, exist_ok=True)
            _real_dir(root, root)
            with contextlib.suppress(FileExistsError):
                model_dir.mkdir(0o755)
            _real_dir(model_dir, root)
            # Staged under the next version's temp name (so a later deploy removes one a killed deploy
            # left); the number is taken only when it is renamed in, under the repository's lock.
            with scratch_dir(_next_version(model_dir)) as staged:
                model.save(staged / "model.onnx", external_data=external_data)
                os.chmod(staged, 0o755)
                with _repository_lock(root):
                    version_dir = _claim_version(staged, model_dir)
                    atomic_write(model_dir / "config.pbtxt", config.encode())
        except BaseException as exc:
            if version_dir is not None:
                shutil.rmtree(version_dir, ignore_errors=True)
            if isinstance(exc, OSError):
                raise GraphError(f"cannot write model {name!r} into the repository {root}: {exc.strerror or exc}"
                                 + (f" ({exc.filename})" if exc.filename else "")) from None
            raise
    return model_dir
