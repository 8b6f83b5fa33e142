"""What this Python offers graphc's GPU check: its requirements, onnxruntime's CUDA provider, torch's CUDA.

    python scripts/gpu_env.py

Prints one line per fact, then ``ORT_CUDA=0|1``, ``TORCH_CUDA=0|1`` and ``XDIST=0|1`` for
``scripts/gpu_check.sh`` to read. A requirement of graphc's installed metadata that is missing
or of a version outside its range is named with what is there (``onnx-ir 1.0.0, wants
>=1.1,<1.2``): carry its wheel (README.md, "Running the GPU check"). Imports graphc only after
that check, so a missing requirement is reported rather than raised.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from importlib import metadata

from packaging.requirements import Requirement


def unmet_requirements() -> list[str]:
    """graphc's requirements (markers applied, extras left out) that this environment does not meet."""
    unmet = []
    for text in metadata.requires("graphc") or []:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req.name} missing, wants {req.specifier or 'any'}")
            continue
        if not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req.name} {version}, wants {req.specifier}")
    return unmet


def ort_cuda() -> tuple[bool, str]:
    try:
        from graphc.backends import onnxruntime as ort_backend
        ort = ort_backend._ort()
    except Exception as exc:  # noqa: BLE001 - reported, and the check goes on without it
        return False, f"graphc or onnxruntime does not import: {type(exc).__name__}: {exc}"
    dists = ", ".join(f"{d} {metadata.version(d)}" for d in ("onnxruntime", "onnxruntime-gpu") if _has(d))
    print(f"onnxruntime: {ort.__version__} ({dists}), providers {', '.join(ort.get_available_providers())}")
    return ort_backend.probe_cuda(0)


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def torch_cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch does not import: {exc}"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def main() -> int:
    print(f"python: {sys.executable} {platform.python_version()}")
    try:
        print(f"graphc: {metadata.version('graphc')} from {importlib.util.find_spec('graphc').origin}")
    except metadata.PackageNotFoundError:
        print("graphc: not installed")
        print("ORT_CUDA=0\nTORCH_CUDA=0\nXDIST=0")
        return 1
    unmet = unmet_requirements()
    print(f"graphc's requirements: {'all met' if not unmet else 'UNMET: ' + '; '.join(unmet)}")
    ort_ok, ort_why = ort_cuda()
    print(f"ort-cuda: {'usable' if ort_ok else 'UNUSABLE: ' + ort_why}")
    torch_ok, torch_why = torch_cuda()
    print(f"torch cuda: {torch_why}")
    xdist = importlib.util.find_spec("xdist") is not None
    print(f"ORT_CUDA={int(ort_ok)}\nTORCH_CUDA={int(torch_ok)}\nXDIST={int(xdist)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
