"""A module's backward hooks, torch's ``register_full_backward_pre_hook`` and ``register_full_backward_hook``, as
two ``gc.autograd.Function``s whose forwards are the identity (``graphc.dsl.grad_hooks`` holds a Tensor's hooks).

Around one call (its forward and forward hooks, on the arguments its forward pre-hooks gave, as torch's order):
``ModuleGradOutput`` on the output Tensors, whose backward runs the pre-hooks on ``grad_output``; with full hooks
also ``ModuleGradInput`` on the float positional arguments, applied after the forward, its outputs moved before it
and read by the forward's nodes in the arguments' place. ``ModuleGradInput`` also returns one zero *carrier* per
float output that ``ModuleGradOutput`` takes as an argument and sends its ``grad_output`` to, so the gradients
reaching ``ModuleGradInput``'s backward hold both the module's ``grad_input`` and ``grad_output``, which it gives the
full hooks.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from graphc.dsl import ops
from graphc.dsl.autograd import Function
from graphc.dsl.builder import Builder, active, nested_nodes, user_source
from graphc.dsl.grad_hooks import checked_grad, hook_label
from graphc.dsl.ops_array import zeros_like
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

__all__ = ["Call", "deprecated_hook_refused", "start"]


def _floats(values: tuple) -> list[int]:
    return [i for i, v in enumerate(values) if isinstance(v, Tensor) and v.dtype in FLOAT_DTYPES]


@dataclass
class Call:
    """One call of a module with backward hooks: what its two Functions' backwards need."""

    module: Any
    builder: Builder
    before: frozenset  # its scope's nodes when the call began (a hook's nodes may be put among them later)
    args: tuple
    arg_floats: list[int]
    source: str
    inputs: tuple = ()  # the float arguments as they were when the call began (a hook in forward rebinds them)
    outputs: tuple = ()
    out_floats: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{type(self.module).__name__}'s backward hooks (called at {self.source})"

    def hooks(self, kind: str) -> list[Any]:
        return [hook.fn for hook in self.module.__dict__.get(kind, OrderedDict()).values()]

    def finish(self, result: Any) -> Any:
        """``result`` (a Tensor or tuple of Tensors) through the hooks' Functions."""
        single = isinstance(result, Tensor)
        if not single and not (isinstance(result, tuple) and all(isinstance(r, Tensor) or r is None for r in result)):
            raise CaptureError(f"{type(self.module).__name__}'s backward hooks: forward returned "
                               f"{type(result).__name__}; graphc takes a module's grad_output from a Tensor or a "
                               "tuple of Tensors, as torch's BackwardHook does")
        self.outputs = (result,) if single else result
        self.out_floats = tuple(_floats(self.outputs))
        if not self.out_floats:
            return result
        carriers: tuple = ()
        if self.hooks("_backward_hooks") and self.arg_floats:
            carriers = self._hook_inputs()
        hooked = ModuleGradOutput.apply(self, *(self.outputs[i] for i in self.out_floats), *carriers)
        hooked = hooked if isinstance(hooked, tuple) else (hooked,)
        outputs = list(self.outputs)
        for i, value in zip(self.out_floats, hooked):
            outputs[i] = value
        return outputs[0] if single else tuple(outputs)

    def _hook_inputs(self) -> tuple:
        """``ModuleGradInput`` applied, the call's nodes reading its outputs in the arguments' place; the carriers."""
        nodes = self.builder.scope.nodes
        called = [n for n in nodes if n not in self.before]
        marks = ModuleGradInput.apply(self, *self.inputs)
        inputs = marks[:len(self.arg_floats)]
        firsts = [m.value.producer() for m in inputs]  # Identities of the arguments: before the call's nodes
        nodes[:] = [n for n in nodes if all(n is not f for f in firsts)]
        at = 1 + max((i for i, n in enumerate(nodes) if n in self.before), default=-1)  # after the last of them
        nodes[at:at] = list(dict.fromkeys(firsts))
        readers = {id(n) for n in nested_nodes(called)}
        for arg, mark in zip(self.inputs, inputs):
            for node, index in list(arg.value.uses()):
                if id(node) in readers:
                    node.replace_input_with(index, mark.value)
        return marks[len(self.arg_floats):]

    def grad_tuple(self, values: tuple, positions: list[int] | tuple[int, ...], count: int) -> tuple:
        out: list[Any] = [None] * count
        for i, g in zip(positions, values):
            out[i] = g
        return tuple(out)

    def replaced(self, new: Any, old: tuple, what: str, hook: Any) -> tuple:
        """A hook's result as the new gradients (None: ``old``), each checked against the one it replaces."""
        if new is None:
            return old
        where = f"{type(self.module).__name__}'s {what} hook {hook_label(hook)}"
        new = (new,) if isinstance(new, Tensor) else tuple(new) if isinstance(new, (tuple, list)) else new
        if not isinstance(new, tuple) or len(new) != len(old):
            got = len(new) if isinstance(new, tuple) else type(new).__name__
            raise CaptureError(f"{where} returned an invalid number of gradients, got {got}, but expected {len(old)}")
        return tuple(g if o is None or g is None else checked_grad(g, o, where) for g, o in zip(new, old))


class ModuleGradOutput(Function):
    """The identity on a call's float outputs; backward: the pre-hooks on ``grad_output``, which also goes to the
    carriers."""

    _deferred = True  # backward captured once the graph's (a body's) outputs are known: None for an output reaching
    # none (and again for each float output as the loss, ``autograd.settle``)

    @staticmethod
    def describe(ctx: Any) -> str:  # ``autograd``'s warnings name the module
        return ctx.call.describe()

    @staticmethod
    def forward(ctx: Any, call: Call, *values: Tensor) -> Any:
        ctx.call = call
        outputs = values[:len(call.out_floats)]
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        call = ctx.call
        if all(g is None for g in grads):  # no output reaches the graph's: torch calls no hook
            return (None,) * len(ctx.needs_input_grad)
        grad_output = call.grad_tuple(grads, call.out_floats, len(call.outputs))
        for hook in call.hooks("_backward_pre_hooks"):
            grad_output = call.replaced(hook(call.module, grad_output), grad_output, "backward pre-", hook)
        floats = tuple(grad_output[i] for i in call.out_floats)
        carried = len(ctx.needs_input_grad) - 1 - len(floats)
        return None, *floats, *(floats if carried else ())


class ModuleGradInput(Function):
    """The identity on a call's float arguments, and a zero carrier per float output; backward: the full hooks on
    (``grad_input``, ``grad_output``), the carriers' gradients being ``grad_output``."""

    _deferred = True

    describe = staticmethod(ModuleGradOutput.describe)

    @staticmethod
    def forward(ctx: Any, call: Call, *args: Tensor) -> tuple:
        ctx.call = call
        return (*args, *(zeros_like(call.outputs[i]) for i in call.out_floats))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        call = ctx.call
        if all(g is None for g in grads):
            return (None,) * len(ctx.needs_input_grad)
        count = len(call.arg_floats)
        grad_input = call.grad_tuple(grads[:count], call.arg_floats, len(call.args))
        grad_output = call.grad_tuple(grads[count:], call.out_floats, len(call.outputs))
        for hook in call.hooks("_backward_hooks"):
            grad_input = call.replaced(hook(call.module, grad_input, grad_output), grad_input, "full backward", hook)
        return None, *(grad_input[i] for i in call.arg_floats)


def start(module: Any, args: tuple) -> Call | None:
    """The ``Call`` that ``finish`` completes, where ``module`` has backward hooks and gradients are on. Its
    ``args`` are those forward gets: each float one through an Identity of its own, a new value as torch's
    ``BackwardHookFunction`` makes, so a hook forward registers on it sees forward's reads only."""
    builder = active()
    state = module.__dict__
    if builder is None or not builder.gradients_enabled or not (
            state.get("_backward_hooks") or state.get("_backward_pre_hooks")):
        return None
    floats = _floats(args)
    call = Call(module, builder, frozenset(builder.scope.nodes), args, floats, user_source(),
                tuple(copy.copy(args[i]) for i in floats))
    wrapped = list(args)
    for i in floats:
        wrapped[i] = ops.emit("Identity", [args[i]], name_hint="module_input")
    call.args = tuple(wrapped)
    return call


def deprecated_hook_refused() -> NotImplementedError:
    """Why ``register_backward_hook`` is refused: torch's own gives the gradients of the last op's inputs."""
    return NotImplementedError(
        "Module.register_backward_hook: torch deprecated it, and its grad_input holds the gradients of the inputs "
        "of the last op forward ran (a Linear's: bias, input, weight), not the module's; use "
        "register_full_backward_hook(hook(module, grad_input, grad_output)), which graphc takes as torch's")
