"""``gc.func``: torch.func's ``functional_call`` (a module's forward on Tensors given for its parameters
and buffers), ``vmap``, and the transforms of ``graphc.dsl.func_transforms`` (``grad``, ``vjp``, ``jvp``,
``jacrev``, ``jacfwd``, ``hessian``, ...). Together they give per-example gradients and model ensembling
(``vmap`` over parameters stacked along a dim)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphc.dsl.builder import current, user_source
from graphc.dsl.func_transforms import (
    grad,
    grad_and_value,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    vjp,
)
from graphc.dsl.ops import lift
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap import vmap
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter

__all__ = ["functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "vjp", "vmap"]


def _slots(module: Module, prefix: str = "", seen: frozenset = frozenset()) -> list[tuple[str, Module, str, Parameter]]:
    """(name, owner, attribute, Parameter) for every parameter and buffer under each of its names
    (a module or Parameter shared under two names is listed under both)."""
    found = [(f"{prefix}{attr}", module, attr, p) for attr, p in module._parameters.items()]
    for name, child in module._modules.items():
        if id(child) not in seen:
            found += _slots(child, f"{prefix}{name}.", seen | {id(module)})
    return found


def _merged(dicts: Any, source: str) -> dict[str, Any]:
    dicts = list(dicts) if isinstance(dicts, (tuple, list)) else [dicts]
    merged: dict[str, Any] = {}
    for d in dicts:
        if not isinstance(d, Mapping):
            raise CaptureError(f"gc.func.functional_call: parameter_and_buffer_dicts takes a dict or a tuple of "
                               f"dicts, got a {type(d).__name__} (at {source})")
        for key, value in d.items():
            if key in merged:
                raise CaptureError(f"gc.func.functional_call: {key!r} appears in more than one of "
                                   f"parameter_and_buffer_dicts (at {source})")
            merged[key] = value
    return merged


def functional_call(module: Module, parameter_and_buffer_dicts: Any, args: Any = None, kwargs: dict | None = None,
                    *, tie_weights: bool = True, strict: bool = False) -> Any:
    """torch.func's ``functional_call``: ``module(*args, **kwargs)`` with the Tensors of
    ``parameter_and_buffer_dicts`` (a dict, or a tuple of dicts, of names as ``state_dict()``'s) in place
    of those parameters and buffers, the others as they are. ``tie_weights``: a value given for one
    name of a parameter shared under several names is used under all of them. ``strict``: every
    parameter and buffer must be given, and no other name. Inside ``gc.capture`` only."""
    source = user_source()
    builder = current()
    given = _merged(parameter_and_buffer_dicts, source)
    slots = _slots(module)
    names = {name for name, *_ in slots}
    unexpected = sorted(set(given) - names)
    missing = sorted(names - set(given))
    if strict and (unexpected or missing):
        raise CaptureError(f"gc.func.functional_call(strict=True): missing {missing}, unexpected {unexpected} "
                           f"(at {source})")
    if unexpected:
        raise CaptureError(f"gc.func.functional_call: {unexpected} name no parameter or buffer of "
                           f"{type(module).__name__} (they are {sorted(names)}) (at {source})")
    groups: dict[int, list[str]] = {}
    for name, _, _, p in slots:
        groups.setdefault(id(p), []).append(name)
    values: dict[str, Tensor] = {k: lift(v) for k, v in given.items()}
    if tie_weights:
        for tied in groups.values():
            chosen = {id(values[n]): values[n] for n in tied if n in values}
            if len(chosen) > 1:
                raise CaptureError(f"gc.func.functional_call: {[n for n in tied if n in values]} are tied "
                                   f"(one parameter) but given different values; give one (at {source})")
            values.update((n, *chosen.values()) for n in tied if chosen)
    stand_ins: dict[int, Parameter] = {}
    swapped = []
    try:
        for name, owner, attr, param in slots:
            if name not in values:
                continue
            key = id(values[name])
            stand_in = stand_ins.get(key)
            if stand_in is None:
                stand_in = stand_ins[key] = Parameter(shape=param.shape, dtype=param.dtype, buffer=param.buffer)
                builder.param_tensors[id(stand_in)] = values[name]
            owner._parameters[attr] = stand_in
            swapped.append((owner, attr, param))
        call_args = args if isinstance(args, tuple) else () if args is None else (args,)
        return module(*call_args, **(kwargs or {}))
    finally:
        for owner, attr, param in reversed(swapped):
            owner._parameters[attr] = param
        for stand_in in stand_ins.values():
            builder.param_tensors.pop(id(stand_in), None)
