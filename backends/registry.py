"""The backend registry: name -> backend class, loaded lazily (onnxruntime is heavy)."""

from __future__ import annotations

import importlib

from graphc.backends.base import Backend, BackendInfo
from graphc.errors import BackendUnavailable, did_you_mean

# name -> "module:Class". Order is the preference order of "auto" (best first).
BACKENDS: dict[str, str] = {
    "ort-cuda": "graphc.backends.onnxruntime:CudaBackend",
    "ort-cpu": "graphc.backends.onnxruntime:CpuBackend",
    "numpy": "graphc.backends.numpy:NumpyBackend",
}


def _load(name: str) -> Backend:
    module_name, cls_name = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)()


def _info(name: str) -> BackendInfo:
    try:
        backend = _load(name)
    except (ImportError, AttributeError) as exc:
        module_name = BACKENDS[name].split(":")[0]
        return BackendInfo(name=name, available=False, device="?",
                           reason=f"cannot load {module_name}: {exc}")
    return backend.info()


def _meant(name: str) -> str:
    """The end of an unknown backend's error: for a name that asks for the GPU (``ort-gpu``,
    ``cuda``), the CUDA backend, which spelling alone would miss (``ort-gpu`` is 1 edit from
    ``ort-cpu``); else the close name, if any (``did_you_mean``)."""
    cuda = [backend for backend in BACKENDS if "cuda" in backend]
    if cuda and any(word in name.lower() for word in ("gpu", "cuda")):
        return f" (did you mean {cuda[0]!r}, the GPU backend?)"
    return did_you_mean(name, ["auto", *BACKENDS])


def list_backends() -> list[BackendInfo]:
    """Every registered backend with its availability on this machine."""
    return [_info(name) for name in BACKENDS]


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name`` ("auto": the best available). Never falls back silently."""
    if name == "auto":
        infos = [_info(candidate) for candidate in BACKENDS]
        for info in infos:
            if info.available:
                return _load(info.name)
        reasons = "; ".join(f"{i.name}: {i.reason}" for i in infos)
        raise BackendUnavailable(f"no backend is available ({reasons})")
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(['auto', *BACKENDS])}"
                                 f"{_meant(name)}")
    info = _info(name)
    if not info.available:
        raise BackendUnavailable(f"backend {name!r} is not available here: {info.reason}")
    return _load(name)
