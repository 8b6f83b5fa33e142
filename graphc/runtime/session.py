"""`gc.Session`: a model prepared on one backend, chosen by name when the session is created.

    sess = gc.Session("model.onnx", backend="ort-cpu", threads=2)
    out = sess.run({"x": batch})            # dict output name -> np.ndarray

Feeds are checked before the backend runs (``gc.InputError``); an unavailable backend raises
``gc.BackendUnavailable`` with the reason, never a silent fallback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
import onnx

from graphc.backends.cancel import CancelToken
from graphc.backends.registry import get_backend
from graphc.backends.value_sized import ShapePrepass
from graphc.errors import InputError
from graphc.model import Model, complex_io, load
from graphc.model.dtypes import TensorSpec
from graphc.passes.training.marked_inputs import class_label_inputs
from graphc.runtime.feeds import optional_inputs, validate_feeds
from graphc.runtime.labels import check_class_labels

# Options every backend accepts (a backend ignores those that mean nothing to it).
SESSION_OPTIONS = frozenset({"threads", "graph_optimization_level", "device_id", "providers_options", "flush_denormals",
                             "cpu_arena"})

ModelLike = Union[Model, str, os.PathLike, bytes, onnx.ModelProto]


def check_options(options: Mapping[str, Any], allowed: frozenset, owner: str) -> None:
    """``TypeError`` naming the first of ``options`` that ``owner`` (Session, Trainer) does not take."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unknown {owner} option {unknown[0]!r}; options are: {', '.join(sorted(allowed))}")


class Session:
    """A model prepared for repeated runs on one backend.

    Args:
        model_or_path: a ``gc.Model``, a path to an ``.onnx`` file, its bytes or a ``ModelProto``.
        backend: ``"numpy"``, ``"ort-cpu"``, ``"ort-cuda"`` or ``"auto"`` (best available).
        **options: ``threads``, ``graph_optimization_level`` (``"disable"``, ``"basic"``,
            ``"extended"``, ``"all"``), ``device_id``, ``providers_options`` (a dict given to
            the execution provider), ``flush_denormals``, ``cpu_arena`` (onnxruntime's CPU
            memory arena; ``graphc serve`` turns it off).

    Raises:
        BackendUnavailable: the backend cannot run here (the message says why).
        BackendError / GraphError: the backend cannot run an op of the model.
    """

    def __init__(self, model_or_path: ModelLike, backend: str = "auto", **options: Any):
        check_options(options, SESSION_OPTIONS, "Session")
        self.model = load(model_or_path)
        self._backend = get_backend(backend)
        self._executable = self._backend.prepare(self.model.proto, **options)
        self.inputs: list[TensorSpec] = self.model.inputs
        self.outputs: list[TensorSpec] = self.model.outputs
        self.optional_inputs = optional_inputs(self.model)
        self._output_names = [s.name for s in self.outputs]
        self.complex_inputs, self.complex_outputs = complex_io.complex_names(self.model.ir.metadata_props)
        # the data inputs a cross_entropy / nll_loss of the model reads as class labels: ``run`` checks them
        self._class_labels = class_label_inputs(self.model.ir.graph)

    # -- what the session is -------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend's name (``"ort-cpu"``, ...), after ``"auto"`` was resolved."""
        return self._backend.name

    @property
    def device(self) -> str:
        return self._backend.device

    @property
    def placement(self) -> dict[str, str]:
        """Node name -> the device or execution provider that runs it."""
        return self._executable.placement

    @property
    def copy_nodes(self) -> int:
        """How many host<->device copy nodes the backend inserted (0 on a CPU)."""
        return int(getattr(self._executable, "copy_nodes", 0))

    @property
    def executable(self) -> Any:
        """The backend's prepared model (for tools that need backend-specific access)."""
        return self._executable

    def __repr__(self) -> str:
        return f"<gc.Session {self.model.name!r} on {self.backend}>"

    # -- running ----------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None, *,
            cancel: CancelToken | None = None, max_tensor_bytes: int | None = None,
            max_request_bytes: int | None = None, complex_pairs: bool = False) -> dict[str, np.ndarray]:
        """Run the model; returns ``{output name: array}`` for ``outputs`` (default: all).
        ``cancel``: a ``graphc.backends.cancel.CancelToken`` another thread may cancel, which
        stops the run with ``RunCancelled`` (numpy: before the next node; onnxruntime: its
        ``RunOptions.terminate``). ``max_tensor_bytes``: the most bytes one tensor whose size
        the feeds' values choose may take (``graphc.backends.value_sized``); past it the run
        raises ``TensorTooLarge`` before allocating it. ``max_request_bytes`` (with
        ``max_tensor_bytes``): the most bytes the main graph's tensors of known shape may hold at
        once in such a model; past it, ``RequestTooLarge``. A complex input (``complex_inputs``) takes a complex
        array (or its ``[..., 2]`` real pair) and a complex output comes back complex (``graphc.model.complex_io``),
        or as its pair with ``complex_pairs`` (serving's, whose protocol has no complex datatype). The labels a
        ``cross_entropy`` / ``nll_loss`` of the model reads from an input are checked to be classes or the
        ignore index (``InputError``, as torch raises), the graph's loss being NaN for any other."""
        if self.complex_inputs and isinstance(feeds, Mapping):
            feeds = complex_io.pairs_of(self.inputs, self.complex_inputs, feeds)
        values = validate_feeds(self.inputs, feeds, self.optional_inputs)
        arrays = {k: v if isinstance(v, np.ndarray) else self._executable.to_host(v) for k, v in values.items()}
        check_class_labels(self._class_labels, self.inputs, arrays, "a run")
        names = self._check_outputs(outputs)
        options: dict[str, Any] = {} if cancel is None else {"cancel": cancel}
        if max_tensor_bytes is not None:
            checks = getattr(self._executable, "checks_tensor_bytes", False)
            if self._prepass is not None:
                self._prepass.check(arrays, max_tensor_bytes, max_request_bytes, cones=not checks)
            if checks:
                options["max_tensor_bytes"] = max_tensor_bytes
        results = self._executable.run(arrays, names, **options)
        if complex_pairs:
            return results
        return complex_io.complex_results(self.complex_outputs, results)

    @property
    def unbounded_nodes(self) -> list[tuple[str, str]]:
        """(node, where) of the value-sized nodes ``max_tensor_bytes`` cannot check before this
        backend runs them (in a Loop/If/Scan body or a local function, on the ort backends; the
        numpy backend checks each as it runs)."""
        if self._prepass is None or getattr(self._executable, "checks_tensor_bytes", False):
            return []
        return list(self._prepass.unchecked)

    @functools.cached_property
    def _prepass(self) -> ShapePrepass | None:
        """The shape pre-pass of ``max_tensor_bytes``; None for a model without value-sized ops."""
        return ShapePrepass.of(self.model.proto)

    def _check_outputs(self, outputs: Sequence[str] | None) -> list[str]:
        if outputs is None:
            return list(self._output_names)
        if isinstance(outputs, str):
            outputs = [outputs]
        for name in outputs:
            if name not in self._output_names:
                raise InputError(f"unknown output {name!r}; the model's outputs are: "
                                 f"{', '.join(str(s) for s in self.outputs)}")
        return list(outputs)

    # -- device residency (the Trainer keeps params and optimizer state on the device) -----------
    def to_device(self, array: np.ndarray) -> Any:
        """Copy a host array to the session's device; returns the backend's handle."""
        return self._executable.to_device(np.asarray(array))

    def to_host(self, handle: Any) -> np.ndarray:
        return self._executable.to_host(handle)

    def run_bound(self, feeds: Mapping[str, Any], host_outputs: Sequence[str],
                  device_outputs: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Run with feeds given as host arrays or device handles. Returns (host arrays of
        ``host_outputs``, handles of ``device_outputs``, which stay on the device)."""
        values = validate_feeds(self.inputs, feeds, self.optional_inputs)
        self._check_outputs([*host_outputs, *device_outputs])
        return self._executable.run_bound(values, list(host_outputs), list(device_outputs))
