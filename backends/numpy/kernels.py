"""The kernel table: ``(domain, op_type)`` -> the kernels of each opset version.

A kernel is a plain function whose signature mirrors the ONNX spec: inputs positional (a
missing optional input is ``None``), attributes keyword-only with the spec's defaults, and the
result always a tuple of arrays. ``@kernel("Softmax", since=13)`` registers the semantics an op
has from opset 13 on; ``lookup`` picks the newest version not newer than the node's opset.
Kernels registered with ``context=True`` also receive the running ``Context`` first (control
flow needs the enclosing scope and the subgraph runner; random ops need the seeded RNG).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphc.errors import MissingKernel

# Op families, imported on first lookup (each registers its kernels with @kernel).
FAMILIES = (
    "elementwise", "reduction", "linalg", "conv", "norm", "resize",
    "shape", "indexing", "control", "rnn", "sequence", "losses", "attention", "quantize",
    "random", "image", "signal",
)


@dataclass(frozen=True)
class Kernel:
    op_type: str
    domain: str
    since: int
    fn: Callable
    context: bool
    attributes: frozenset[str] | None  # None: the kernel takes any attribute (**kwargs)

    def check_attributes(self, names) -> list[str]:
        """The attribute names this kernel does not understand."""
        if self.attributes is None:
            return []
        return sorted(set(names) - self.attributes)


KERNELS: dict[tuple[str, str], list[Kernel]] = {}
_loaded = False


def kernel(op_type: str, since: int = 1, domain: str = "", context: bool = False):
    """Register ``fn`` as the kernel of ``op_type`` from opset ``since`` on."""

    def register(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            attributes = None
        else:
            attributes = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)
        entry = Kernel(op_type, domain, since, fn, context, attributes)
        versions = KERNELS.setdefault((domain, op_type), [])
        versions.append(entry)
        versions.sort(key=lambda k: k.since)
        return fn

    return register


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for family in FAMILIES:
            importlib.import_module(f"graphc.backends.numpy.{family}")


def scalar(value, default=None):
    """The one value of a scalar (or one-element) input as a Python number; ``default`` when
    the optional input is absent or empty."""
    if value is None or not np.size(value):
        return default
    return np.asarray(value).ravel()[0].item()


def require_shape(value, shape, what: str, rule: str) -> None:
    """Refuse an input whose shape is not ``shape`` exactly (``rule`` says why it must be)."""
    if value is not None and tuple(np.shape(value)) != tuple(shape):
        raise ValueError(f"{what} has shape {list(np.shape(value))}, expected {list(shape)} ({rule})")


def require_unidirectional(value, shape, what: str) -> None:
    """Refuse an input that does not broadcast to ``shape`` without growing it (ONNX's
    unidirectional broadcasting: numpy's rules, applied to one side only)."""
    if value is None:
        return
    shape = tuple(shape)
    try:
        fits = np.broadcast_shapes(np.shape(value), shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{what} has shape {list(np.shape(value))}, which does not broadcast unidirectionally "
                         f"to {list(shape)} (trailing dims must equal it or be 1, and it may not have more dims)")


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def lookup(op_type: str, opset: int, domain: str = "") -> Kernel | None:
    """The kernel implementing ``op_type`` as of ``opset``; None when there is none."""
    _ensure_loaded()
    versions = KERNELS.get((normalize_domain(domain), op_type), [])
    chosen = None
    for entry in versions:
        if entry.since <= opset:
            chosen = entry
    return chosen


def missing(op_type: str, opset: int, domain: str = "", node: str | None = None, where: str = "") -> MissingKernel:
    """The error for an op ``lookup`` found no kernel for: op, domain, opset, the node if known,
    its source line (``where``), and the folder (as installed) whose family files hold the kernels."""
    used_by = f" used by node {node!r}" if node is not None else ""
    return MissingKernel(f"the numpy backend has no kernel for op {op_type!r} (domain {domain or 'ai.onnx'!r}, "
                         f"opset {opset}){used_by}{where}; add one with @kernel in a family file of "
                         f"{Path(__file__).resolve().parent}/ (docs/adding-an-op.md)")


def claimed_ops(domain: str = "") -> list[str]:
    """Every op type the numpy backend implements in ``domain``, sorted."""
    _ensure_loaded()
    return sorted(op for (d, op) in KERNELS if d == domain)
