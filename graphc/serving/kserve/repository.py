"""The models a server holds: one ``.onnx`` file, a ``gc.Model``, or a Triton model repository.

Sessions are created once, at start. A repository folder holds one folder per model
(``REPO/NAME/<version>/model.onnx`` + ``config.pbtxt``); the versions served are those the
config's ``version_policy`` names (by default the highest), and the highest of them answers
requests that name no version.
``config.pbtxt`` is parsed as Triton's ``ModelConfig`` (``graphc.serving.kserve.model_config``): its
``default_model_filename`` and ``max_batch_size`` (enforced as Triton does) are used, and the
config, completed from the model's inputs and outputs, is what ``GET .../config`` answers. No
file outside the repository folder is ever opened: symlinks that lead out are refused.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import numpy as np

from graphc.errors import GraphError, InputError, ModelLoadError, RequestTooLarge, RunCancelled, TensorTooLarge
from graphc.fileio import missing
from graphc.model import Model, load
from graphc.model.complex_io import complex_spec
from graphc.model.dtypes import TensorSpec, to_numpy
from graphc.serving.deploy import check_model_name, feedable_inputs, require_tensor_interface, triton_config, triton_versions
from graphc.serving.kserve import model_config
from graphc.serving.kserve.deadline import Deadline
from graphc.serving.kserve.protocol import DATATYPES, DecodedRequest, ProtocolError, datatype_of

_CONFIG_LIMIT = 1 << 20  # bytes of config.pbtxt read at most
_Reshapes = dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # name -> (client's shape, model's shape)


def _tensor_metadata(spec: TensorSpec, model: str, kind: str, dims: list[int] | None,
                     complex_names: frozenset[str]) -> dict[str, Any]:
    """``spec`` as the metadata route lists it; ``dims`` (the batch dim included), where its config
    reshapes it, are the shape clients see, as Triton lists them. The protocol has no complex
    datatype: a complex input or output (one of ``complex_names``, ``graphc.model.complex_io``) is
    served as its ``[..., 2]`` real pair, which its ``parameters`` say: ``{"complex": "complex128"}``."""
    if spec.dtype not in DATATYPES.values():
        raise ModelLoadError(f"model {model!r}: {kind} {spec.name!r} has dtype {spec.dtype}, which the KServe "
                             f"v2 protocol cannot carry here (served dtypes: {', '.join(DATATYPES.values())})")
    shape = [-1] if spec.shape is None else [d if isinstance(d, int) else -1 for d in spec.shape]
    listed = {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": shape if dims is None else dims}
    if spec.name in complex_names:
        listed["parameters"] = {"complex": complex_spec(spec).dtype}
    return listed


def _reshapes(model: str, kind: str, tensors: Any) -> _Reshapes:
    """name -> (client's shape, model's shape) after the batch dim, for each of ``tensors`` (a
    config's inputs or outputs) with a ``reshape``: an input is sent as its ``dims`` and reaches
    the model as ``reshape.shape``; an output leaves the model as ``reshape.shape`` and is sent as
    ``dims``. ``ModelLoadError`` where the two cannot hold the same elements, as Triton checks."""
    found = {}
    for tensor in tensors:
        if tensor.HasField("reshape"):
            dims, shape = tuple(tensor.dims), tuple(tensor.reshape.shape)
            if dims.count(-1) != shape.count(-1) or math.prod(d for d in dims if d != -1) != math.prod(
                    d for d in shape if d != -1):
                raise ModelLoadError(f"model {model!r}: config.pbtxt gives {kind} {tensor.name!r} dims {list(dims)} "
                                     f"and reshape {list(shape)}, which do not hold the same elements (as many -1 "
                                     "dims, the same product of the others)")
            found[tensor.name] = (dims, shape)
    return found


def _triton_reshape(shape: tuple[int, ...], batched: bool, src: tuple[int, ...],
                    dst: tuple[int, ...]) -> tuple[int, ...] | None:
    """``shape`` as Triton's ``reshape`` turns ``src`` into ``dst`` (after the batch dim, if
    ``batched``): ``dst``'s dims, each -1 taking the next of the sizes ``src``'s -1s matched;
    None when ``shape`` is not ``src`` (-1: any size)."""
    lead, item = (shape[:1], shape[1:]) if batched and shape else ((), shape)
    if len(item) != len(src) or any(d != -1 and d != n for d, n in zip(src, item)):
        return None
    sizes = iter([n for d, n in zip(src, item) if d == -1])
    return lead + tuple(next(sizes) if d == -1 else d for d in dst)


class ServedModel:
    """One model version with its session; ``infer`` is safe to call from many threads."""

    platform = "onnxruntime_onnx"

    def __init__(self, name: str, version: str, model: Model, backend: str = "auto", max_batch_size: int = 0,
                 config: Any = None, allow_uncalibrated: bool = False, **options: Any):
        """``config``: the folder's parsed ``config.pbtxt`` (a ``model_config.ModelConfig``),
        whose ``max_batch_size`` then applies. A capture whose fake quantizations never saw data is
        refused (``ModelLoadError``) unless ``allow_uncalibrated``."""
        from graphc.compile.export import UncalibratedError, check_calibrated
        from graphc.runtime.session import Session

        if config is not None:
            max_batch_size = config.max_batch_size
        self.name, self.version, self.max_batch_size = name, version, max_batch_size
        # a repository model's versions on disk its version_policy does not serve -> it (load_models sets it)
        self.left_out: dict[str, str] = {}
        try:
            require_tensor_interface(model, "the KServe v2 protocol")
        except GraphError as exc:
            raise ModelLoadError(str(exc)) from None
        try:
            check_calibrated(model.ir, allow_uncalibrated=allow_uncalibrated)
        except UncalibratedError as exc:
            raise ModelLoadError(f"model {name!r} version {version}: {exc}") from None
        completed = model_config.complete(config if config is not None else model_config.ModelConfig(),
                                          _derived_config(model, name, max_batch_size))
        self.config = model_config.to_json(completed)
        self._in_reshapes = _reshapes(name, "input", completed.input)
        self._out_reshapes = _reshapes(name, "output", completed.output)
        # no CPU arena: it would keep a request's peak (a value-sized tensor) for the server's life
        self.session = Session(model, backend=backend, **{"cpu_arena": False, **options})
        self.inputs, self.outputs = feedable_inputs(model), model.outputs
        self._dtypes = {spec.name: to_numpy(spec.dtype) for spec in self.inputs}
        # onnxruntime's InferenceSession.run is thread-safe; other backends are serialised.
        self._lock = None if self.session.backend.startswith("ort") else threading.Lock()
        self.metadata = {
            "name": name, "versions": [version], "platform": self.platform,
            "inputs": [_tensor_metadata(s, name, "input", self._client_dims(self._in_reshapes, s.name),
                                        self.session.complex_inputs) for s in self.inputs],
            "outputs": [_tensor_metadata(s, name, "output", self._client_dims(self._out_reshapes, s.name),
                                         self.session.complex_outputs) for s in self.outputs],
        }

    def _client_dims(self, reshapes: _Reshapes, name: str) -> list[int] | None:
        """The shape clients see of a reshaped tensor, batch dim included; None if not reshaped."""
        if name not in reshapes:
            return None
        return [-1] * (self.max_batch_size > 0) + list(reshapes[name][0])

    def infer(self, request: DecodedRequest, deadline: Deadline,
              max_tensor_bytes: int | None = None, max_request_bytes: int | None = None) -> dict[str, np.ndarray]:
        """The model's outputs for ``request``; past ``deadline`` (a wait for the model's lock
        included) ``RunCancelled``; a 413 where the request's values would make a tensor over
        ``max_tensor_bytes``, or tensors live at once over ``max_request_bytes`` (``gc.Session.run``'s)."""
        for name, array in request.inputs.items():  # in the protocol's terms; the rest is Session's
            want = self._dtypes.get(name)
            if want is not None and array.dtype != want:
                raise ProtocolError(f"input {name!r}: datatype {datatype_of(array.dtype)}, "
                                    f"model {self.name!r} expects {datatype_of(want)}")
            if self.max_batch_size and array.ndim and array.shape[0] > self.max_batch_size:
                raise ProtocolError(f"input {name!r}: batch of {array.shape[0]} exceeds the max_batch_size of model "
                                    f"{self.name!r}, {self.max_batch_size} (config.pbtxt)")
            if name in self._in_reshapes:  # shaped as the model wants, not as dims: the session checks it
                shape = _triton_reshape(array.shape, self.max_batch_size > 0, *self._in_reshapes[name])
                request.inputs[name] = array if shape is None else array.reshape(shape)
        wanted = None if request.outputs is None else list(request.outputs)
        try:
            with self._locked(deadline) if self._lock is not None else contextlib.nullcontext():
                results = self.session.run(request.inputs, outputs=wanted, cancel=deadline,
                                           max_tensor_bytes=max_tensor_bytes, max_request_bytes=max_request_bytes,
                                           complex_pairs=True)
        except InputError as exc:
            raise ProtocolError(f"model {self.name!r}: {exc}") from None
        except TensorTooLarge as exc:
            option = "--max-request-bytes" if isinstance(exc, RequestTooLarge) else "--max-tensor-bytes"
            raise ProtocolError(f"model {self.name!r}: {exc}; the server's {option}", 413) from None
        for name, array in results.items():
            if name in self._out_reshapes:
                dims, shape = self._out_reshapes[name]
                to = _triton_reshape(array.shape, self.max_batch_size > 0, shape, dims)
                if to is None:
                    after = " after the batch dim" if self.max_batch_size > 0 else ""
                    raise ProtocolError(f"model {self.name!r}: output {name!r} has shape {list(array.shape)}, which "
                                        f"its config.pbtxt reshape {list(shape)} does not fit{after}", 500)
                results[name] = array.reshape(to)
        return results

    @contextlib.contextmanager
    def _locked(self, deadline: Deadline) -> Iterator[None]:
        """Hold the model's lock, waiting at most until ``deadline`` (then ``RunCancelled``)."""
        if not self._lock.acquire(timeout=deadline.remaining()):
            raise RunCancelled(f"it waited for the model's earlier requests ({self.session.backend} runs one at a time)")
        try:
            yield
        finally:
            self._lock.release()


def _derived_config(model: Model, name: str, max_batch_size: int) -> Any:
    """The configuration ``graphc deploy triton`` would write for ``model``; where Triton could
    not take the model (say a fixed batch dim with ``max_batch_size``), only its name."""
    try:
        config = model_config.parse(triton_config(model, name, max_batch_size))[0]
    except GraphError:
        config = model_config.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size)
    config.version_policy.latest.num_versions = 1  # Triton's default, shown as Triton shows it
    return config


def _inside(path: Path, root: Path) -> Path:
    """``path`` resolved, refusing anything (symlinks included) that leads out of ``root``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ModelLoadError(f"{path} resolves to {resolved}, outside the repository {root}; refusing to read it")
    return resolved


def _model_config(model_dir: Path, root: Path) -> tuple[str, Any]:
    """(default_model_filename, the parsed config) from the folder's config.pbtxt, if any."""
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        return "model.onnx", None
    with open(_inside(path, root), "rb") as f:
        data = f.read(_CONFIG_LIMIT + 1)
    if len(data) > _CONFIG_LIMIT:
        raise ModelLoadError(f"{path}: larger than {_CONFIG_LIMIT} bytes; not read")
    try:
        config, skipped = model_config.parse(data.decode("utf-8"), str(path))
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path}: not UTF-8 text ({exc})") from None
    except model_config.ConfigError as exc:
        raise ModelLoadError(str(exc)) from None
    if skipped is not None:
        warnings.warn(f"{path}: field {skipped} is not one graphc serves; GET /v2/models/NAME/config leaves it "
                      "out", stacklevel=2)
    if config.max_batch_size < 0:
        raise ModelLoadError(f"{path}: max_batch_size must be >= 0, got {config.max_batch_size}")
    filename = config.default_model_filename or "model.onnx"
    if "/" in filename or "\\" in filename or filename in (".", ".."):
        raise ModelLoadError(f"{path}: default_model_filename {filename!r} must be a plain file name")
    return filename, config


def _served_versions(model_dir: Path, root: Path) -> tuple[list[tuple[str, Path]], Any, dict[str, str]]:
    """The versions the config's ``version_policy`` serves, lowest first, each with its model file
    (numeric folders without the file are not versions), the parsed config, and each version on
    disk the policy leaves out -> the policy, as a 404 for it words it. As Triton: ``latest
    { num_versions: N }`` the N highest (the default: 1), ``all`` every one, ``specific { versions:
    [...] }`` those listed, each of which must be there."""
    filename, config = _model_config(model_dir, root)
    present = [n for n in triton_versions(model_dir) if (model_dir / str(n) / filename).is_file()]
    if not present:
        raise ModelLoadError(f"{model_dir}: no numeric version folder holds {filename!r} "
                             f"(expected {model_dir}/1/{filename})")
    policy = model_config.ModelConfig().version_policy if config is None else config.version_policy
    chosen = [kind for kind in ("latest", "all", "specific") if policy.HasField(kind)]
    where = f"{model_dir / 'config.pbtxt'}: version_policy"
    if len(chosen) > 1:
        raise ModelLoadError(f"{where} sets {' and '.join(chosen)}; it takes one of latest, all, specific")
    if chosen == ["all"]:
        served = present
    elif chosen == ["specific"]:
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in present]
        if not wanted or missing:
            raise ModelLoadError(f"{where} specific lists {'no versions' if not wanted else f'versions {missing}'}"
                                 f" that hold {filename!r}; there are {', '.join(map(str, present))}")
        served = wanted
    else:
        count = policy.latest.num_versions if chosen else 1
        if count < 1:
            raise ModelLoadError(f"{where} latest {{ num_versions: {count} }} serves nothing; give 1 or more")
        served = present[-count:]
    rule = (f"its config.pbtxt's version_policy {model_config.one_line(policy)}" if chosen
            else "the default version_policy, latest { num_versions: 1 } (its config.pbtxt sets none)")
    return [(str(n), _inside(model_dir / str(n) / filename, root)) for n in served], config, \
        {str(n): rule for n in present if n not in served}


def _is_model_dir(path: Path) -> bool:
    return (path / "config.pbtxt").is_file() or any(p.is_dir() and p.name.isdigit() for p in path.iterdir())


def _repository(root: Path, name: str | None) -> dict[str, tuple[list[tuple[str, Path]], Any, dict[str, str]]]:
    """name -> (its served versions and their model files, parsed config.pbtxt or None, what the
    policy leaves out) for a repository folder or one model's folder."""
    root = root.resolve()
    if _is_model_dir(root):
        return {name or root.name: _served_versions(root, root)}
    found = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        _inside(model_dir, root)
        if _is_model_dir(model_dir):
            found[model_dir.name] = _served_versions(model_dir, root)
    if name is not None:
        if name not in found:
            raise ModelLoadError(f"repository {root} has no model {name!r}; it has {', '.join(found) or 'none'}")
        found = {name: found[name]}
    if not found:
        raise ModelLoadError(f"{root}: no models found (expected {root}/NAME/1/model.onnx)")
    return found


def load_models(source: Any, name: str | None = None, backend: str = "auto", allow_uncalibrated: bool = False,
                **options: Any) -> dict[str, dict[str, ServedModel]]:
    """Open every model ``source`` holds: name served under -> version -> model, lowest version
    first (the last one answers requests that name no version).

    ``source`` is a ``gc.Model`` (or anything ``gc.load`` takes), a ``.onnx`` file (served under
    its stem unless ``name``, as version 1), or a folder: a Triton repository (every model, under its folder
    name, at the versions its config's ``version_policy`` serves; ``name`` picks one) or one
    model's folder from such a repository. ``options`` go to every ``gc.Session``; ``allow_uncalibrated``
    to every ``ServedModel``.
    """
    options["allow_uncalibrated"] = allow_uncalibrated
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            found = {}
            for model_name, (versions, config, left_out) in _repository(path, name).items():
                found[model_name] = {version: ServedModel(model_name, version, load(file), backend, config=config,
                                                          **options) for version, file in versions}
                for model in found[model_name].values():
                    model.metadata["versions"], model.left_out = list(found[model_name]), left_out
            return found
        if not path.is_file():
            raise ModelLoadError(f"{path}: {missing(path, 'model file or repository folder')}")
        model_name = _url_name(name or path.stem, name)
        return {model_name: {"1": ServedModel(model_name, "1", load(path), backend, **options)}}
    model = load(source)
    model_name = _url_name(name or model.name, name)
    return {model_name: {"1": ServedModel(model_name, "1", model, backend, **options)}}


def _url_name(model_name: str, given: str | None) -> str:
    """``model_name`` if URLs can name it (deploy's rule for model folders), else ``ModelLoadError``
    (a '/' in it: no route would reach the model)."""
    try:
        return check_model_name(model_name)
    except ValueError as exc:
        hint = "" if given is not None else " (the file's stem or the graph's name); choose one with name= / --name"
        raise ModelLoadError(f"cannot serve the model: {exc}{hint}") from None
