"""``NumpyBackend``: the Backend protocol over the numpy interpreter, and ``run_node``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from graphc.backends.base import BackendInfo
from graphc.backends.cancel import CancelToken
from graphc.backends.numpy.interpreter import Context, Plan
from graphc.backends.numpy.kernels import lookup, missing, normalize_domain
from graphc.errors import BackendError, GraphcError, MissingKernel
from graphc.model.file import with_body_output_shapes


class NumpyExecutable:
    """A model planned for the numpy kernels. Handles are the arrays themselves.

    ``run(feeds, outputs=[...])`` accepts any value name of the graph, intermediates included,
    and runs only the nodes those values need; ``max_tensor_bytes`` bounds, per run, what a node
    whose output size its inputs' values choose may allocate (``sizes``).
    """

    checks_tensor_bytes = True  # ``run`` takes ``max_tensor_bytes``

    def __init__(self, model: onnx.ModelProto, seed: int = 0):
        opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
        opsets.setdefault("", 1)
        self.opsets = opsets
        functions = {(normalize_domain(f.domain), f.name): f for f in model.functions}
        model = with_body_output_shapes(model)
        self.plan = Plan(model.graph, opsets, functions=functions)
        self.input_names = list(self.plan.input_names)
        self.output_names = list(self.plan.output_names)
        # Random ops (Dropout in training mode, RandomNormal, ...) draw from this generator, so
        # a session prepared with the same seed reproduces the same masks run after run.
        self.rng = np.random.default_rng(seed)
        self._const_ids = {id(a) for a in self.plan.consts.values()}

    @property
    def placement(self) -> dict[str, str]:
        return {step.label: "numpy:cpu" for step in self.plan.steps}

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            cancel: CancelToken | None = None, max_tensor_bytes: int | None = None) -> dict[str, np.ndarray]:
        self.plan.check_feeds(feeds)
        wanted = self.output_names if outputs is None else list(outputs)
        with np.errstate(all="ignore"):  # inf/NaN results are ONNX semantics (a masked softmax row), not errors
            result = self.plan.run(feeds, wanted, self.rng, cancel=cancel, max_tensor_bytes=max_tensor_bytes)
        for name, value in result.items():
            # never hand out the plan's own initializers or read-only views (callers may write)
            if isinstance(value, np.ndarray) and (id(value) in self._const_ids or not value.flags.writeable):
                try:  # a broadcast view (Expand) costs nothing until it is copied here
                    result[name] = value.copy()
                except MemoryError as exc:
                    step = self.plan.producer(name)
                    if step is None:
                        raise BackendError(f"value {name!r} is too large to copy: {exc}") from None
                    raise step.fail(exc, output=value) from None
        return result

    # -- device residency: the host is the device --------------------------------------------
    def to_device(self, array: np.ndarray, owned: bool = False) -> np.ndarray:
        return np.asarray(array)

    def to_host(self, handle: np.ndarray) -> np.ndarray:
        return handle

    def run_bound(self, feeds: Mapping[str, Any], host_outputs: Sequence[str],
                  device_outputs: Sequence[str] = (), into: Mapping[str, Any] | None = None,
                  keep: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        # ``into`` and ``keep`` are ignored: the interpreter's kernels return new arrays
        result = self.run(feeds, [*host_outputs, *device_outputs])
        return ({n: result[n] for n in host_outputs}, {n: result[n] for n in device_outputs})

    def forget_bindings(self) -> None:
        """Nothing is bound here."""


class NumpyBackend:
    """The reference interpreter: pure numpy, always available, runs every graph graphc emits."""

    name = "numpy"
    device = "cpu"

    def info(self) -> BackendInfo:
        return BackendInfo(name=self.name, available=True, device=self.device)

    def prepare(self, model: onnx.ModelProto, seed: int = 0, **options: Any) -> NumpyExecutable:
        """Plan ``model``. ``seed`` seeds the RNG of random ops; other options (meant for other
        backends, e.g. thread counts) are accepted and ignored."""
        return NumpyExecutable(model, seed=seed)


def _convert_attribute(value: Any, opsets: dict[str, int]) -> Any:
    if isinstance(value, onnx.GraphProto):
        return Plan(value, opsets, subgraph=True)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (onnx.GraphProto, bytes, onnx.TensorProto)):
        return [_convert_attribute(v, opsets) for v in value]
    return value


def run_node(op_type: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], opset: int,
             domain: str = "", *, num_outputs: int | None = None, scope: Mapping[str, np.ndarray] | None = None,
             rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Evaluate one node eagerly.

    ``attrs`` are plain Python values (graph attributes may be ``onnx.GraphProto``s, whose
    outer-scope names are read from ``scope``). ``num_outputs`` tells kernels with optional
    outputs (MaxPool indices, Dropout mask) how many the node has.
    """
    domain = normalize_domain(domain)
    found = lookup(op_type, opset, domain)
    if found is None:
        raise missing(op_type, opset, domain)
    unknown = found.check_attributes(attrs)
    if unknown:
        raise MissingKernel(f"the numpy kernel of {op_type!r} does not support attribute(s) {', '.join(unknown)}")
    opsets = {"": opset} if not domain else {"": opset, domain: opset}
    kwargs = {k: _convert_attribute(v, opsets) for k, v in attrs.items()}
    if found.attributes is not None and "_outputs" in found.attributes:
        kwargs["_outputs"] = num_outputs or 1
    args = [None if x is None else np.asarray(x) for x in inputs]
    try:
        if found.context:
            res = found.fn(Context(rng or np.random.default_rng(0), scope), *args, **kwargs)
        else:
            res = found.fn(*args, **kwargs)
    except GraphcError:
        raise
    except Exception as exc:
        raise BackendError(f"op {op_type!r} failed: {type(exc).__name__}: {exc}") from exc
    res = [np.asarray(r) if isinstance(r, np.generic) else r for r in res]
    return res[:num_outputs] if num_outputs else res
