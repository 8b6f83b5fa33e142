"""The backend protocol: prepare an ONNX model once, run it many times.

A backend never imports the DSL: it receives an ``onnx.ModelProto`` (what every runtime
understands) and returns an ``Executable``. Adding a backend is one module implementing
``Backend`` plus one entry in ``registry.BACKENDS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import onnx
from pydantic import BaseModel


class BackendInfo(BaseModel):
    """What ``gc.backends()`` reports for one backend."""

    name: str
    available: bool
    device: str
    reason: str = ""


@runtime_checkable
class Executable(Protocol):
    """A prepared model. ``run`` takes already-validated feeds."""

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            cancel: Any = None) -> dict[str, np.ndarray]:
        """``cancel``: a ``CancelToken`` (``graphc.backends.cancel``) that stops the run with
        ``RunCancelled`` once another thread cancels it (``Session.run`` passes it only when given)."""
        ...

    @property
    def placement(self) -> dict[str, str]:
        """Node name -> device/provider that runs it."""
        ...

    # Device residency (the Trainer keeps params and optimizer state on the device between
    # steps). A "handle" is the backend's own on-device value: an ``OrtValue`` for onnxruntime,
    # the ``np.ndarray`` itself for numpy.
    def to_device(self, array: np.ndarray, owned: bool = False) -> Any:
        """Copy a host array to the executable's device; returns a handle. ``owned``: the caller
        hands ``array`` over (nothing else uses it), so a host device may keep it as it is."""
        ...

    def to_host(self, handle: Any) -> np.ndarray:
        """A handle's contents as a host array. Not necessarily a copy: onnxruntime's is a view of
        the handle's memory (garbage once the handle is freed), numpy's the handle itself, so a
        caller keeping it past the handle copies it (``replica_shards``, ``Trainer._host``)."""
        ...

    def run_bound(self, feeds: Mapping[str, Any], host_outputs: Sequence[str],
                  device_outputs: Sequence[str] = (), into: Mapping[str, Any] | None = None,
                  keep: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Run with feeds given as host arrays or handles; return (host arrays of
        ``host_outputs``, handles of ``device_outputs`` left on the device). ``into`` offers
        handles of the right shape and dtype to write device outputs into (no allocation); a
        backend may ignore it and return new handles. ``keep``: the same handles will be fed
        and written into again (a Trainer's steps), so a backend may keep what it set up for
        them until ``forget_bindings``."""
        ...

    def forget_bindings(self) -> None:
        """Drop what ``run_bound(keep=True)`` kept (the caller's handles are about to change)."""
        ...


@runtime_checkable
class Backend(Protocol):
    name: str
    device: str

    def info(self) -> BackendInfo:
        """Availability here and, when unavailable, why."""
        ...

    def prepare(self, model: onnx.ModelProto, **options: Any) -> Executable:
        """Plan the model for execution; an unsupported op fails here, naming op and node."""
        ...
