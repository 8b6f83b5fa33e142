"""torch's gradient hooks as ``gc.autograd.Function``s whose forward is the identity.

``t.register_hook(hook)`` applies ``TensorHook`` (backward: ``hook(grad)``, None keeping ``grad``) to ``t``'s value
through a plain Identity of its own (the hook's *slot*), and makes every node that reads the value, those emitted
before the call too, read the hook's output instead, so the hook sees ``t``'s whole gradient, as torch's does. A
later hook on the same value is put between the value and the earlier hooks' slots, so the gradient meets the hooks
in registration order. The hook runs once, at registration, on a placeholder gradient: what it computes is captured
into the Function's backward; a hook that returns None computes nothing there (printing or storing the gradient
sees the placeholder, not values). A hook's nodes go in the scope that made the value (a parameter first read in a
control-flow body: the main graph); registering one in a body on a value from outside it is refused (torch would
register it at every step, or only when the branch runs). ``graphc.nn.backward_hooks`` builds a module's backward
hooks on the same Functions.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl import autograd
from graphc.dsl.autograd import Function
from graphc.dsl.builder import Builder, Scope, active, user_source
from graphc.dsl.inplace import outside_body
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.passes.values import static_shape

__all__ = ["HookHandle", "PostAccumulateHook", "TensorHook", "checked_grad", "hook_label", "no_grad_error",
           "checkpoint_region", "refuse_in_body", "refuse_no_grad", "refuse_outside_region", "refuse_uncallable", "register_hook"]


def hook_label(hook: Any) -> str:
    """``name (file.py line N)`` of a hook function, for messages."""
    code = getattr(hook, "__code__", None)
    name = getattr(hook, "__qualname__", type(hook).__name__)
    return name if code is None else f"{name} ({code.co_filename.rsplit('/', 1)[-1]} line {code.co_firstlineno})"


def checked_grad(new: Any, grad: Tensor, what: str) -> Tensor:
    """``new`` as the gradient that replaces ``grad`` (None: ``grad``); ``CaptureError`` naming ``what`` when it
    is not a Tensor of ``grad``'s dtype and shape."""
    if new is None:
        return grad
    if not isinstance(new, Tensor):
        raise CaptureError(f"{what} returned {type(new).__name__}; it returns a gc.Tensor or None")
    want, got = static_shape(grad.value), static_shape(new.value)
    if new.dtype != grad.dtype or (want is not None and got is not None and (
            len(want) != len(got) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                         for a, b in zip(want, got)))):
        raise CaptureError(f"{what} returned a gradient of {new.type_str()} for one of {grad.type_str()}; a hook "
                           "returns its gradient's dtype and shape")
    return new


class TensorHook(Function):
    """The identity whose backward is ``hook(grad)``; applied as ``TensorHook.apply(x, hook, where)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, hook: Any, where: str) -> Tensor:
        ctx.hook, ctx.where = hook, where
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return checked_grad(ctx.hook(grad), grad, ctx.where), None, None


class PostAccumulateHook(TensorHook):
    """``TensorHook`` of a parameter's post-accumulate hook: its record's class tells the Trainer a hook that torch
    runs on the accumulated ``.grad`` (``refuse_post_accumulate_hooks``)."""


def refuse_uncallable(hook: Any, what: str) -> None:
    """torch's refusal of a hook that is not callable (``Tensor.register_hook``, ``Parameter.register_hook``)."""
    if not callable(hook):
        raise TypeError(f"{what}: a hook must be callable, got {type(hook).__name__}")


def no_grad_error(what: str, why: str) -> CaptureError:
    """torch's refusal of a hook on a tensor that doesn't require gradient; ``why`` says what it is."""
    return CaptureError(f"{what}: cannot register a hook on a tensor that doesn't require gradient ({why})")


def refuse_no_grad(tensor: Tensor | None, what: str) -> None:
    """torch's refusal of a hook on a tensor that has no gradient (an integer or bool one)."""
    if tensor is not None and tensor.dtype not in FLOAT_DTYPES:
        raise no_grad_error(what, f"{tensor.name} is {tensor.type_str()}")


def refuse_in_body(what: str, name: str) -> None:
    """Refuse a hook registered, in a control-flow body, on ``name``, a value made outside it."""
    raise CaptureError(f"{what}: {name} is a value from outside the gc.cond/gc.scan/gc.fori_loop/gc.while_loop/"
                       "gc.vmap body being traced; a body is traced once, where torch would register the hook at "
                       "every step (or only when the branch runs): register it outside the body, or on a value the "
                       "body computes")


# per capture: the open gc.utils.checkpoint regions, each its scope's id and the ids of that scope's nodes before it
_REGIONS: weakref.WeakKeyDictionary[Builder, list[tuple[Any, frozenset]]] = weakref.WeakKeyDictionary()


@contextmanager
def checkpoint_region(builder: Builder) -> Any:
    """Around a ``gc.utils.checkpoint`` function's run: what ``refuse_outside_region`` checks."""
    regions = _REGIONS.setdefault(builder, [])
    regions.append((builder.scope.id, frozenset(map(id, builder.scope.nodes))))
    try:
        yield
    finally:
        regions.pop()


def refuse_outside_region(builder: Builder, tensor: Tensor | None, what: str, name: str) -> None:
    """Refuse a hook registered in a checkpoint region on ``tensor`` (None: a parameter), a value from outside it:
    torch runs the region's function again in the backward, registering the hook a second time on that value, so
    its hook runs twice (use_reentrant=True: once more on the region's share); graphc's recompute runs no Python."""
    for scope, before in _REGIONS.get(builder, ()):
        producer = None if tensor is None else tensor.value.producer()
        if producer is None or (tensor._scope == scope and id(producer) in before):
            raise CaptureError(f"{what}: {name} is a value from outside the gc.utils.checkpoint region being "
                               "captured; torch registers the hook again when it recomputes the region in the "
                               "backward, so it runs twice: register it outside the checkpointed function, or "
                               "on a value the function computes")


@dataclass
class _Point:
    """A hooked value: ``base``, the value its producer made, and the slots of its hooks, last registered first."""

    base: ir.Value
    slots: list[ir.Node] = field(default_factory=list)


# per capture: id of a hooked value (its base or a hook's output) -> its point
_POINTS: weakref.WeakKeyDictionary[Builder, dict[int, _Point]] = weakref.WeakKeyDictionary()


class HookHandle:
    """What ``register_hook`` returns: ``remove()`` takes the hook off while its capture runs (the captured model
    keeps what it holds); also a ``with`` block's context manager, as torch's handle."""

    def __init__(self, *removers: Any) -> None:
        self._removers = list(removers)

    def add(self, remover: Any) -> None:
        self._removers.append(remover)

    def remove(self) -> None:
        while self._removers:
            self._removers.pop()()

    def __enter__(self) -> "HookHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register_hook(tensor: Tensor, hook: Any) -> HookHandle:
    """torch's ``Tensor.register_hook``: ``hook(grad)`` returns the gradient that replaces ``grad`` (or None,
    which keeps it: in a captured graph such a hook computes nothing), applied to the tensor's whole gradient,
    several hooks in registration order. Returns a handle whose ``remove()`` takes it off during the capture."""
    where = f"Tensor.register_hook at {user_source()}"
    refuse_uncallable(hook, where)
    builder = active()
    if builder is None:
        raise CaptureError(f"{where}: {tensor.name} is outside gc.capture, where no gradient is taken; register "
                           "the hook in forward, or on a gc.nn.Parameter (param.register_hook)")
    refuse_no_grad(tensor, where)
    if outside_body(tensor):
        refuse_in_body(where, tensor.name)
    refuse_outside_region(builder, tensor, where, tensor.name)
    return HookHandle(apply_hook(builder, tensor, hook, f"the hook {hook_label(hook)} registered at {user_source()}"))


def apply_hook(builder: Builder, tensor: Tensor, hook: Any, where: str, marker: type = TensorHook) -> Any:
    """Put ``hook`` on ``tensor``'s value (see the module's docstring) as a ``marker`` (``TensorHook`` or
    ``PostAccumulateHook``); returns what takes it off again."""
    points = _POINTS.setdefault(builder, {})
    point = points.get(id(tensor.value)) or _Point(tensor.value)
    scope = next((s for s in builder.scopes if s.id == tensor._scope), builder.scope)
    start = len(scope.nodes)
    builder.scopes.append(scope)  # emitted where the value is made
    state = builder.set_gradients(True)
    try:
        slot = ops.emit("Identity", [Tensor(point.base)], name_hint="hook_slot")
        out = marker.apply(slot, hook, where).value
    finally:
        builder.restore_gradients(state)
        builder.scopes.pop()
    made = scope.nodes[start:]
    del scope.nodes[start:]
    producer = point.base.producer()
    at = scope.nodes.index(producer) + 1 if producer in scope.nodes else 0
    scope.nodes[at:at] = made  # its nodes read the base only: before every node the base's readers are
    slot_node = slot.value.producer()
    for node, index in list(point.base.uses()):
        if node is not slot_node:
            node.replace_input_with(index, out)
    autograd.rebind(builder, point.base, out)
    if not point.slots:
        tensor._ir = out
    points[id(point.base)] = points[id(out)] = point
    point.slots.insert(0, slot_node)
    return lambda: _remove(builder, scope, tensor, point, slot_node, made)


def _remove(builder: Builder, scope: Scope, tensor: Tensor, point: _Point, slot_node: ir.Node,
            made: list[ir.Node]) -> None:
    """Take one hook off: its output's readers read its slot's input again, and the Functions that sent a gradient
    to its output send it there; its nodes and its backward leave the model. After the capture: nothing (the model
    is built)."""
    if active() is not builder or slot_node not in point.slots:
        return
    out, source = made[-1].outputs[0], slot_node.inputs[0]  # made: the slot, then the Function's marker
    for node, index in list(out.uses()):
        node.replace_input_with(index, source)
    nodes = scope.nodes
    nodes[:] = [n for n in nodes if all(n is not m for m in made)]
    for node in made:
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)
    autograd.rebind(builder, out, source)
    autograd.discard(builder, made[-1])
    point.slots.remove(slot_node)
    if tensor._ir is out:
        tensor._ir = source
