"""``gc.capture``: run a function or Module on symbolic (or example) inputs under a Builder and
wrap the traced graph as a ``gc.Model``."""

from __future__ import annotations

import contextlib
import inspect as _inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import methods  # noqa: F401  (binds gc.Tensor's operators before any Tensor is made)
from graphc.dsl import methods_torch  # noqa: F401  (and PyTorch's Tensor methods: view, permute, masked_fill, ...)
from graphc.dsl import inplace  # noqa: F401  (and in-place writes: x[i] = v, x += y, x.add_(y), ...)
from graphc.dsl import autograd, ops, renorm
from graphc.dsl.builder import Builder
from graphc.dsl.complex_ops import pair
from graphc.dsl.sources import raised_at
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.model.dtypes import COMPLEX_PARTS, TensorSpec, as_dtype
from graphc.errors import CaptureError, GraphcError
from graphc.model import BUFFERS_KEY, Model, complex_io
from graphc.nn.module import Module
from graphc.version import PRODUCER, __version__

def _as_spec(name: str, value: Any) -> tuple[TensorSpec, np.ndarray | None, bool]:
    """The graph input's spec, its example array (None for a spec) and whether it is complex: a complex
    one is its real pair (``graphc.model.complex_io``)."""
    if isinstance(value, TensorSpec):
        sp, arr = value.model_copy(update={"name": name}), None
    elif isinstance(value, np.ndarray) or np.isscalar(value):
        arr = np.asarray(value)
        sp = TensorSpec(name=name, dtype=as_dtype(arr.dtype), shape=arr.shape)
    else:
        raise CaptureError(f"capture input {name!r} must be a gc.TensorSpec or an np.ndarray, "
                           f"got {type(value).__name__}")
    part = COMPLEX_PARTS.get(sp.dtype)
    if part is None:
        return sp, arr, False
    if sp.shape is None:
        raise CaptureError(f"capture input {name!r}: a complex input needs a known rank (its real pair adds a "
                           f"trailing dim of 2), got {sp}")
    held = TensorSpec(name=name, dtype=part, shape=(*sp.shape, 2))
    return held, None if arr is None else complex_io.real_pair(arr), True


def _call(fn: Callable, tensors: dict[str, Any]):
    try:
        sig = _inspect.signature(fn.forward if isinstance(fn, Module) else fn)
    except (TypeError, ValueError):
        return fn(**tensors)
    params = sig.parameters
    accepts_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    if accepts_kwargs or all(n in params for n in tensors):
        return fn(**tensors)
    return fn(*tensors.values())


def check_input_names(fn: Callable, names: list[str]) -> None:
    """Raise ``GraphError`` unless ``names`` are the parameters ``fn`` (a function or a Module's
    ``forward``) takes: none unknown, every one without a default given. A signature with
    ``*args`` or ``**kwargs``, or none Python can read, accepts any names."""
    target = fn.forward if isinstance(fn, Module) else fn
    try:
        params = _inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return
    accepted = [p.name for p in params]
    needed = [p.name for p in params if p.default is p.empty]
    unknown = [n for n in names if n not in accepted]
    missing = [n for n in needed if n not in names]
    if unknown or missing:
        owner = f"{type(fn).__name__}.forward" if isinstance(fn, Module) else getattr(fn, "__qualname__", "the function")
        raise CaptureError(f"input names do not match {owner}({', '.join(accepted)}): expected "
                           f"{', '.join(needed) or 'none'}, got {', '.join(names) or 'none'}"
                           + (f" ({', '.join(unknown)} not a parameter)" if unknown else ""))


def capture(fn_or_module: Any, *, name: str | None = None, opset: int = 21, seed: int | None = None,
            training: bool | None = None, **inputs: Any) -> Model:
    """Trace ``fn_or_module`` on the given inputs into a ``gc.Model``.

    Each keyword names a graph input: a ``gc.TensorSpec`` (symbolic capture) or an example
    ``np.ndarray`` (eager capture: ops are evaluated as traced). Returned dict keys name the
    outputs; a single Tensor is ``"output"``; a tuple gives ``"output_0"``, ``"output_1"``, ...
    ``training``: None captures each module in its own mode (``.train()``/``.eval()``; modules
    start in eval mode); True or False puts every sub-module of a captured Module in that mode
    for this capture only. ``seed`` None: ``gc.initial_seed()`` (0 unless ``gc.manual_seed`` set
    it). An exception the captured code raises (a ``RuntimeError``, an ``AttributeError`` for a
    misspelled layer, ...) becomes a ``CaptureError`` naming its type,
    message and ``file.py:LINE``, the original as its ``__cause__``; graphc's own errors pass as
    they are.

        >>> import graphc as gc
        >>> m = gc.capture(lambda x: gc.relu(x) * 2, x=gc.spec("float32", ("N", 4)))
        >>> [o.name for o in m.outputs]
        ['output']
    """
    if not inputs:
        raise CaptureError("gc.capture needs at least one input, e.g. x=gc.spec('float32', ('N', 784))")
    specs = {k: _as_spec(k, v) for k, v in inputs.items()}
    eager = all(arr is not None for _, arr, _ in specs.values())
    if isinstance(fn_or_module, type) and issubclass(fn_or_module, Module):
        fn_or_module = fn_or_module()
    module = fn_or_module if isinstance(fn_or_module, Module) else None
    forced = module if training is not None else None
    if training is None:
        training = bool(module is not None and module.training)
    builder = Builder(opset, training, eager, seed)
    graph_inputs, tensors = [], {}
    for key, (sp, arr, is_complex) in specs.items():
        value = builder.new_value(builder.reserve(key), sp.dtype, sp.shape)
        graph_inputs.append(value)
        for axis, dim in enumerate(sp.shape or ()):
            if isinstance(dim, str):
                builder.dim_sources.setdefault(dim, (value, axis))
        tensors[key] = Tensor(value, eager_value=arr)
        if is_complex:
            tensors[key] = ComplexTensor(pair=tensors[key])
        if arr is not None:
            builder.values[id(value)] = arr
    if module is not None:
        module.init_parameters(builder.seed, keep_drawn=True)
        builder.rooted = {id(p) for _, p in [*module.named_parameters(), *module.named_buffers()]}
        graph_name = name or type(module).__name__
    else:
        graph_name = name or getattr(fn_or_module, "__name__", "model").replace("<lambda>", "lambda")
    with builder.activated(), _modes(forced, training):
        try:
            result = _call(fn_or_module, tensors)
        except GraphcError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code raised it: say where, keep it as the cause
            raise CaptureError(f"{type(exc).__name__} in the captured code at {raised_at(exc)}: {exc}") from exc
        outputs, complex_outputs = _collect_outputs(builder, result, set(id(v) for v in graph_inputs))
        autograd.settle(builder, outputs)  # the module hooks' backwards, given None where no output is reached
    inplace.mark_buffer_updates(builder)
    graph = ir.Graph(graph_inputs, outputs, nodes=builder.scopes[0].nodes,
                     initializers=builder.initializers, opset_imports={"": opset}, name=graph_name)
    renorm.drop_unread(graph, builder.write_backs)
    model = ir.Model(graph, ir_version=10, producer_name=PRODUCER, producer_version=__version__)
    model.metadata_props["graphc.training"] = str(bool(training)).lower()
    complex_io.record(model.metadata_props, [k for k, (_, _, c) in specs.items() if c], complex_outputs)
    if builder.buffers:
        model.metadata_props[BUFFERS_KEY] = ",".join(builder.buffers)
    for finish in builder.finishers.values():
        finish(model)
    return Model(model)


@contextlib.contextmanager
def _modes(module: Module | None, training: bool):
    """Every sub-module of ``module`` (None: nothing) in ``training`` mode for the block; each in
    its own mode again afterwards."""
    before = [] if module is None else [(m, m.training) for m in module.modules()]
    for m, _ in before:
        m.training = training
    try:
        yield
    finally:
        for m, mode in before:
            m.training = mode


def _collect_outputs(builder: Builder, result: Any, input_ids: set[int]) -> tuple[list[ir.Value], list[str]]:
    """The graph's outputs, and the names of the complex ones (each output as its real pair)."""
    if isinstance(result, (Tensor, ComplexTensor)):
        named = {"output": result}
    elif isinstance(result, dict):
        named = dict(result)
    elif isinstance(result, (tuple, list)):
        named = {f"output_{i}": t for i, t in enumerate(result)}
    else:
        raise CaptureError(f"the captured function must return a Tensor, a tuple or a dict of Tensors, "
                           f"got {type(result).__name__}")
    values, seen, complex_outputs = [], set(), []
    for key, t in named.items():
        if isinstance(t, ComplexTensor):
            complex_outputs.append(str(key))
            t = pair(t)
        if not isinstance(t, Tensor):
            raise CaptureError(f"output {key!r} is {type(t).__name__}, not a gc.Tensor")
        value = t.value
        if (id(value) in seen or id(value) in input_ids or value.const_value is not None
                or value.producer() is None or value.name in builder.initializer_names()):
            value = ops.emit("Identity", [t], source=f"<output {key}>").value
        seen.add(id(value))
        builder.rename_output(value, str(key))
        values.append(value)
    return values, complex_outputs
