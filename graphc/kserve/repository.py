"""The models a server holds: one ``.onnx`` file, a ``gc.Model``, or a Triton model repository.

Sessions are created once, at start. A repository folder holds one folder per model
(``REPO/NAME/<version>/model.onnx`` + ``config.pbtxt``); the highest numeric version is served.
``config.pbtxt`` is read as text only (for ``default_model_filename`` and ``max_batch_size``,
which the server enforces as Triton does), and no file outside the repository folder is ever
opened: symlinks that lead out are refused.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from graphc.deploy import feedable_inputs, require_tensor_interface, triton_versions
from graphc.dtypes import TensorSpec, to_numpy
from graphc.errors import GraphError, InputError, ModelLoadError
from graphc.kserve.protocol import DATATYPES, DecodedRequest, ProtocolError, datatype_of
from graphc.model import Model, load

_CONFIG_LIMIT = 1 << 20  # bytes of config.pbtxt read at most
_FILENAME = re.compile(r'^\s*default_model_filename\s*:\s*"([^"]*)"', re.MULTILINE)
_MAX_BATCH = re.compile(r"^\s*max_batch_size\s*:\s*(\d+)\b", re.MULTILINE)


def _tensor_metadata(spec: TensorSpec, model: str, kind: str) -> dict[str, Any]:
    if spec.dtype not in DATATYPES.values():
        raise ModelLoadError(f"model {model!r}: {kind} {spec.name!r} has dtype {spec.dtype}, which the KServe "
                             f"v2 protocol cannot carry here (served dtypes: {', '.join(DATATYPES.values())})")
    shape = [-1] if spec.shape is None else [d if isinstance(d, int) else -1 for d in spec.shape]
    return {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": shape}


class ServedModel:
    """One model version with its session; ``infer`` is safe to call from many threads."""

    platform = "onnxruntime_onnx"

    def __init__(self, name: str, version: str, model: Model, backend: str = "auto", max_batch_size: int = 0,
                 **options: Any):
        from graphc.session import Session

        self.name, self.version, self.max_batch_size = name, version, max_batch_size
        try:
            require_tensor_interface(model, "the KServe v2 protocol")
        except GraphError as exc:
            raise ModelLoadError(str(exc)) from None
        self.session = Session(model, backend=backend, **options)
        self.inputs, self.outputs = feedable_inputs(model), model.outputs
        self._dtypes = {spec.name: to_numpy(spec.dtype) for spec in self.inputs}
        # onnxruntime's InferenceSession.run is thread-safe; other backends are serialised.
        self._lock = None if self.session.backend.startswith("ort") else threading.Lock()
        self.recent_seconds = 0.0  # moving average of a request's time, kept by the app
        self.metadata = {
            "name": name, "versions": [version], "platform": self.platform,
            "inputs": [_tensor_metadata(s, name, "input") for s in self.inputs],
            "outputs": [_tensor_metadata(s, name, "output") for s in self.outputs],
        }

    def infer(self, request: DecodedRequest) -> dict[str, np.ndarray]:
        for name, array in request.inputs.items():  # in the protocol's terms; the rest is Session's
            want = self._dtypes.get(name)
            if want is not None and array.dtype != want:
                raise ProtocolError(f"input {name!r}: datatype {datatype_of(array.dtype)}, "
                                    f"model {self.name!r} expects {datatype_of(want)}")
            if self.max_batch_size and array.ndim and array.shape[0] > self.max_batch_size:
                raise ProtocolError(f"input {name!r}: batch of {array.shape[0]} exceeds the max_batch_size of model "
                                    f"{self.name!r}, {self.max_batch_size} (config.pbtxt)")
        wanted = None if request.outputs is None else list(request.outputs)
        try:
            if self._lock is None:
                return self.session.run(request.inputs, outputs=wanted)
            with self._lock:
                return self.session.run(request.inputs, outputs=wanted)
        except InputError as exc:
            raise ProtocolError(f"model {self.name!r}: {exc}") from None


def _inside(path: Path, root: Path) -> Path:
    """``path`` resolved, refusing anything (symlinks included) that leads out of ``root``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ModelLoadError(f"{path} resolves to {resolved}, outside the repository {root}; refusing to read it")
    return resolved


def _model_config(model_dir: Path, root: Path) -> tuple[str, int]:
    """(default_model_filename, max_batch_size) from the folder's config.pbtxt, if any."""
    config = model_dir / "config.pbtxt"
    if not config.is_file():
        return "model.onnx", 0
    with open(_inside(config, root), "rb") as f:
        text = f.read(_CONFIG_LIMIT).decode("utf-8", errors="replace")
    match = _FILENAME.search(text)
    filename = match.group(1) if match else "model.onnx"
    if not filename or "/" in filename or "\\" in filename or filename in (".", ".."):
        raise ModelLoadError(f"{config}: default_model_filename {filename!r} must be a plain file name")
    match = _MAX_BATCH.search(text)
    return filename, int(match.group(1)) if match else 0


def _latest_version(model_dir: Path, root: Path) -> tuple[str, Path, int]:
    """The highest numeric version folder holding the model file, that file, and max_batch_size."""
    filename, max_batch_size = _model_config(model_dir, root)
    for number in reversed(triton_versions(model_dir)):
        candidate = model_dir / str(number) / filename
        if candidate.is_file():
            return str(number), _inside(candidate, root), max_batch_size
    raise ModelLoadError(f"{model_dir}: no numeric version folder holds {filename!r} "
                         f"(expected {model_dir}/1/{filename})")


def _is_model_dir(path: Path) -> bool:
    return (path / "config.pbtxt").is_file() or any(p.is_dir() and p.name.isdigit() for p in path.iterdir())


def _repository(root: Path, name: str | None) -> dict[str, tuple[str, Path, int]]:
    """name -> (version, model file, max_batch_size) for a repository folder or one model's folder."""
    root = root.resolve()
    if _is_model_dir(root):
        return {name or root.name: _latest_version(root, root)}
    found = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        _inside(model_dir, root)
        if _is_model_dir(model_dir):
            found[model_dir.name] = _latest_version(model_dir, root)
    if name is not None:
        if name not in found:
            raise ModelLoadError(f"repository {root} has no model {name!r}; it has {', '.join(found) or 'none'}")
        found = {name: found[name]}
    if not found:
        raise ModelLoadError(f"{root}: no models found (expected {root}/NAME/1/model.onnx)")
    return found


def load_models(source: Any, name: str | None = None, backend: str = "auto",
                **options: Any) -> dict[str, ServedModel]:
    """Open every model ``source`` holds, keyed by the name it is served under.

    ``source`` is a ``gc.Model`` (or anything ``gc.load`` takes), a ``.onnx`` file (served under
    its stem unless ``name``), or a folder: a Triton repository (every model, under its folder
    name; ``name`` picks one) or one model's folder from such a repository. ``options`` go to
    every ``gc.Session``.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return {model_name: ServedModel(model_name, version, load(file), backend, max_batch_size, **options)
                    for model_name, (version, file, max_batch_size) in _repository(path, name).items()}
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such model file or repository folder")
        model_name = name or path.stem
        return {model_name: ServedModel(model_name, "1", load(path), backend, **options)}
    model = load(source)
    model_name = name or model.name
    return {model_name: ServedModel(model_name, "1", model, backend, **options)}
