"""Backend parameters for tests that run on onnxruntime: ``ort-cuda`` runs where a real session
gets CUDAExecutionProvider and is skipped, with the probe's reason, everywhere else."""

from __future__ import annotations

import pytest

from graphc.backends import onnxruntime as ort_backend

CUDA_OK, CUDA_WHY = ort_backend.probe_cuda(0)
CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=f"no usable CUDA device: {CUDA_WHY}")]
CUDA = pytest.param("ort-cuda", id="ort-cuda", marks=CUDA_MARKS)
ORT = ["ort-cpu", CUDA]
# float32 products on the GPU in full precision (onnxruntime's CUDA provider may use TF32), so
# its numbers can be held to the CPU's tolerances
EXACT_CUDA = {"providers_options": {"use_tf32": "0"}}


def options(backend: str) -> dict:
    """The Trainer/Session options a test passes for ``backend``."""
    return EXACT_CUDA if backend == "ort-cuda" else {}


def on_cuda(test):
    """Mark ``test`` as needing a CUDA device (``CUDA_MARKS``)."""
    for mark in CUDA_MARKS:
        test = mark(test)
    return test
