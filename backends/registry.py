"""The backend registry: name -> backend class, loaded lazily (onnxruntime is heavy)."""

from __future__ import annotations

import importlib

from graphc.backends.base import Backend, BackendInfo
from graphc.errors import BackendUnavailable

# name -> "module:Class". Order is the preference order of "auto" (best first).
BACKENDS: dict[str, str] = {
    "ort-cuda": "graphc.backends.onnxruntime:CudaBackend",
    "ort-cpu": "graphc.backends.onnxruntime:CpuBackend",
    "numpy": "graphc.backends.numpy:NumpyBackend",
}


def _load(name: str) -> Backend:
    module_name, cls_name = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)()


def list_backends() -> list[BackendInfo]:
    """Every registered backend with its availability on this machine."""
    return [_load(name).info() for name in BACKENDS]


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name`` ("auto": the best available). Never falls back silently."""
    if name == "auto":
        for candidate in BACKENDS:
            backend = _load(candidate)
            if backend.info().available:
                return backend
        raise BackendUnavailable("no backend is available")  # pragma: no cover - numpy always is
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(['auto', *BACKENDS])}")
    backend = _load(name)
    info = backend.info()
    if not info.available:
        raise BackendUnavailable(f"backend {name!r} is not available here: {info.reason}")
    return backend
