"""``gc.autograd.functional``: torch's ``jacobian``, ``hessian``, ``vjp``, ``jvp``, ``hvp`` and ``vhp``
inside a capture, each ``func`` traced on an ``Identity`` copy of each input and differentiated with
``gc.autograd.grad`` (a Jacobian: its batched cotangents, one ``gc.vmap``; ``jvp``: the double-backward
trick, ``hvp``/``vhp``: a gradient of ``<grad f, v>``). torch's conventions: ``inputs`` a Tensor or a tuple
of them, and results in that form; ``create_graph=False`` gives detached results; ``strict=True`` refuses an
output independent of an input where torch would give zeros; ``vectorize`` is accepted (graphc always maps
the basis with one ``gc.vmap``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.autograd_grad import grad, static_numel
from graphc.dsl.builder import user_source
from graphc.dsl.ops_array import ones_like, zeros_like
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vhp", "vjp"]

_STRATEGIES = ("forward-mode", "reverse-mode")


def _as_tuple(api: str, what: str, value: Any, source: str) -> tuple[bool, list[Tensor]]:
    """(given as a tuple, its Tensors): torch's ``_as_tuple`` (a Tensor or a tuple of Tensors)."""
    items = value if isinstance(value, tuple) else (value,)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            where = f"the value at index {i}" if isinstance(value, tuple) else f"the given {what}"
            raise CaptureError(f"gc.autograd.functional.{api}: The {what} given to {api} must be either a Tensor or "
                               f"a tuple of Tensors but {where} has type {type(t).__name__} (at {source})")
    return isinstance(value, tuple), list(items)


def _form(is_tuple: bool, items: list) -> Any:
    return tuple(items) if is_tuple else items[0]


def _vector(api: str, v: Any, like: list[Tensor], none_if: str, source: str) -> list[Tensor]:
    """``v`` (None only for one single-element Tensor ``like``) as a list matching ``like``."""
    if v is None:
        if len(like) != 1 or static_numel(like[0]) != 1:
            raise CaptureError(f"gc.autograd.functional.{api}: The vector v can only be None if {none_if} is a single "
                               f"Tensor with a single element (at {source})")
        return [ones_like(like[0])]
    _, vs = _as_tuple(api, "v", v, source)
    if len(vs) != len(like):
        raise CaptureError(f"gc.autograd.functional.{api}: v is a tuple of invalid length: should be {len(like)} "
                           f"but got {len(vs)} (at {source})")
    for k, (t, o) in enumerate(zip(vs, like)):
        if t.shape is not None and o.shape is not None and tuple(t.shape) != tuple(o.shape):
            raise CaptureError(f"gc.autograd.functional.{api}: v has invalid size: should be {list(o.shape)} but got "
                               f"{list(t.shape)} (entry {k}) (at {source})")
    return vs


def _traced(api: str, func: Callable, inputs: Any, source: str) -> tuple[bool, list[Tensor], bool, list[Tensor]]:
    """``func`` called on an Identity copy of each input: (inputs a tuple, copies, outputs a tuple, outputs)."""
    in_tuple, ins = _as_tuple(api, "inputs", inputs, source)
    copies = [ops.emit("Identity", [t], source=source) for t in ins]
    out_tuple, outs = _as_tuple(api, "outputs of the user-provided function", func(*copies), source)
    return in_tuple, copies, out_tuple, outs


def _filled(api: str, grads: tuple, zeros: Callable[[int], Tensor], strict: bool, why: str,
            source: str) -> list[Tensor]:
    """``zeros(i)`` for each None of ``grads``; with ``strict``, ``CaptureError`` (torch's text) instead."""
    out = []
    for i, g in enumerate(grads):
        if g is None and strict:
            raise CaptureError(f"gc.autograd.functional.{api}: {why.format(i=i)} This is not allowed in strict mode "
                               f"(at {source})")
        out.append(zeros(i) if g is None else g)
    return out


def _kept(outs: list[Tensor], create_graph: bool) -> list[Tensor]:
    return outs if create_graph else [ops.detach(o) for o in outs]


_INDEPENDENT = "The output of the user-provided function is independent of input {i}."


def vjp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """torch's ``functional.vjp``: ``(func(*inputs), v^T J)``; ``v`` like the outputs (None for one
    single-element output)."""
    source = user_source()
    in_tuple, copies, out_tuple, outs = _traced("vjp", func, inputs, source)
    vs = _vector("vjp", v, outs, "the user-provided function returns", source)
    grads = grad(outs, copies, vs, create_graph=create_graph, allow_unused=True)
    return (_form(out_tuple, _kept(outs, create_graph)),
            _form(in_tuple, _filled("vjp", grads, lambda i: zeros_like(copies[i]), strict, _INDEPENDENT, source)))


def jvp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """torch's ``functional.jvp``: ``(func(*inputs), J v)``, by the double-backward trick as torch (a vjp
    at a placeholder ``u``, differentiated by ``u``); ``v`` like the inputs."""
    source = user_source()
    in_tuple, copies, out_tuple, outs = _traced("jvp", func, inputs, source)
    vs = _vector("jvp", v, copies, "the input to the user-provided function", source)
    us = [ops.emit("Identity", [zeros_like(o)], source=source) for o in outs]
    back = grad(outs, copies, us, create_graph=True, allow_unused=True)
    used = [k for k, g in enumerate(back) if g is not None]
    if not used:
        products = (None,) * len(outs)
    else:
        products = grad([back[k] for k in used], us, [vs[k] for k in used], create_graph=create_graph,
                        allow_unused=True)
    why = "The jacobian of the user-provided function is independent of output {i}."
    return (_form(out_tuple, _kept(outs, create_graph)),
            _form(out_tuple, _filled("jvp", products, lambda i: zeros_like(outs[i]), strict, why, source)))


def _second(api: str, func: Callable, inputs: Any, v: Any, create_graph: bool, strict: bool) -> tuple:
    """``(func(*inputs), v^T H)`` of a single-element ``func``, the gradient of ``<grad f, v>``."""
    source = user_source()
    in_tuple, copies, out_tuple, outs = _traced(api, func, inputs, source)
    if out_tuple or static_numel(outs[0]) != 1:
        raise CaptureError(f"gc.autograd.functional.{api}: The Tensor returned by the function given to {api} "
                           f"should contain a single element (at {source})")
    vs = _vector(api, v, copies, "the input to the user-provided function", source)
    first = grad(outs, copies, create_graph=True, allow_unused=True)
    used = [k for k, g in enumerate(first) if g is not None]
    if strict and len(used) < len(copies):
        i = next(k for k in range(len(copies)) if k not in used)
        raise CaptureError(f"gc.autograd.functional.{api}: {_INDEPENDENT.format(i=i)} This is not allowed in strict "
                           f"mode (at {source})")
    seconds = grad([first[k] for k in used], copies, [vs[k] for k in used], create_graph=create_graph,
                   allow_unused=True) if used else (None,) * len(copies)
    why = "The jacobian of the user-provided function is independent of input {i}."
    return ops.detach(outs[0]) if not create_graph else outs[0], \
        _form(in_tuple, _filled(api, seconds, lambda i: zeros_like(copies[i]), strict, why, source))


def vhp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """torch's ``functional.vhp``: ``(func(*inputs), v^T H)`` of a single-element ``func``."""
    return _second("vhp", func, inputs, v, create_graph, strict)


def hvp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple:
    """torch's ``functional.hvp``: ``(func(*inputs), H v)``, computed as ``v^T H`` (the Hessian of a
    twice-differentiable ``func`` is symmetric; torch documents the same identity)."""
    return _second("hvp", func, inputs, v, create_graph, strict)


def _rows(api: str, func: Callable, inputs: Any, create_graph: bool, strict: bool, source: str) -> tuple:
    """(inputs a tuple, outputs a tuple, ``J[o][i]`` of shape ``[*out_o, *in_i]``): each output's rows at
    once, its basis of cotangents given batched to ``gc.autograd.grad``."""
    in_tuple, copies, out_tuple, outs = _traced(api, func, inputs, source)
    jac = []
    for k, out in enumerate(outs):
        size = static_numel(out)
        if size is None:
            raise CaptureError(f"gc.autograd.functional.{api}: output {k} is {out.type_str()}; a Jacobian needs "
                               f"static dims (at {source})")
        basis = ops.constant(np.eye(size, dtype=out.dtype.numpy).reshape(size, *out.shape))
        rows = grad(out, copies, basis, create_graph=create_graph, allow_unused=True, is_grads_batched=True)
        shapes = [[*out.shape, *c.shape] for c in copies]
        why = f"Output {k} of the user-provided function is independent of input {{i}}."
        filled = _filled(api, rows, lambda i: ops.constant(np.zeros(shapes[i], copies[i].dtype.numpy)), strict,
                         why, source)
        jac.append([r if r.shape is not None and list(r.shape) == s else ops.reshape(r, s)
                    for r, s in zip(filled, shapes)])
    return in_tuple, out_tuple, jac


def _check_strategy(api: str, strategy: str, vectorize: bool, strict: bool, source: str) -> None:
    if strategy not in _STRATEGIES:
        raise CaptureError(f"gc.autograd.functional.{api}: Expected strategy to be either \"forward-mode\" or "
                           f"\"reverse-mode\", got {strategy!r} (at {source})")
    if strategy == "forward-mode" and not vectorize:
        raise CaptureError(f"gc.autograd.functional.{api}: `strategy=\"forward-mode\"` requires `vectorize=True`, "
                           f"as torch's (at {source})")
    if strict and vectorize:
        raise CaptureError(f"gc.autograd.functional.{api}: `strict=True` and `vectorize=True` are not supported "
                           f"together, as in torch (at {source})")


def jacobian(func: Callable, inputs: Any, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode") -> Any:
    """torch's ``functional.jacobian``: ``J[o][i]`` of shape ``[*out_o, *in_i]``, a Tensor where ``inputs``
    and the output are Tensors, else a tuple (over outputs, of tuples over inputs where both are tuples)."""
    source = user_source()
    _check_strategy("jacobian", strategy, vectorize, strict, source)
    in_tuple, out_tuple, jac = _rows("jacobian", func, inputs, create_graph, strict, source)
    return _form(out_tuple, [_form(in_tuple, row) for row in jac])


def hessian(func: Callable, inputs: Any, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode") -> Any:
    """torch's ``functional.hessian`` of a single-element ``func``: ``H[i][j]`` of shape ``[*in_i, *in_j]``,
    a Tensor for a Tensor ``inputs``, else a tuple of tuples (the Jacobian of its Jacobian)."""
    source = user_source()
    _check_strategy("hessian", outer_jacobian_strategy, vectorize, strict, source)
    in_tuple, ins = _as_tuple("hessian", "inputs", inputs, source)

    def scalar(*ys: Tensor) -> Tensor:
        out = func(*ys)
        if not isinstance(out, Tensor) or static_numel(out) != 1:
            got = out.type_str() if isinstance(out, Tensor) else type(out).__name__
            raise CaptureError(f"gc.autograd.functional.hessian: The function given to hessian should return a "
                               f"single Tensor with a single element, got {got} (at {source})")
        return ops.reshape(out, [])

    def gradient(*xs: Tensor) -> tuple:
        return tuple(_rows("hessian", scalar, xs, True, strict, source)[2][0])

    jac = _rows("hessian", gradient, tuple(ins), create_graph, strict, source)[2]
    return _form(in_tuple, [_form(in_tuple, row) for row in jac])
