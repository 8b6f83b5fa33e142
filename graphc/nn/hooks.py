"""A module's forward hooks and pre-hooks, as torch's ``register_forward_hook`` / ``register_forward_pre_hook``,
and where its backward hooks (``graphc.nn.backward_hooks``) wrap a call.

They are Python code run while the module is called in a capture, so what they compute becomes part of
the graph, as torch's hooks become part of an exported program."""

from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict
from typing import Any, NamedTuple

from graphc.nn import backward_hooks

_IDS = itertools.count()


class Hook(NamedTuple):
    """One registered hook and how torch calls it."""

    fn: Any
    with_kwargs: bool
    always_call: bool


class RemovableHandle:
    """What ``register_forward_hook`` returns: ``remove()`` (or leaving a ``with`` block) takes the hook off."""

    def __init__(self, hooks: OrderedDict) -> None:
        self.id = next(_IDS)
        self._hooks = hooks

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def add_hook(hooks: OrderedDict, fn: Any, prepend: bool, with_kwargs: bool,
             always_call: bool = False) -> RemovableHandle:
    """Put ``fn`` last in ``hooks`` (first when ``prepend``) and return its handle."""
    if not callable(fn):
        raise TypeError(f"a hook must be callable, got {type(fn).__name__}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = Hook(fn, bool(with_kwargs), bool(always_call))
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def call_hooked(module: Any, forward: Any, args: tuple, kwargs: dict) -> Any:
    """``forward(*args, **kwargs)`` between ``module``'s pre-hooks and hooks, in torch's order and with
    torch's rules: a pre-hook's result (not None) replaces the positional arguments (one value is made a
    tuple), or with ``with_kwargs`` is ``(args, kwargs)``; a hook's result (not None) replaces the output.
    Hooks registered with ``always_call`` also run when ``forward`` raises (their own errors then warn). The
    backward hooks take the arguments the pre-hooks gave and the output the hooks gave, as torch's."""
    pre, post = module.__dict__.get("_forward_pre_hooks"), module.__dict__.get("_forward_hooks")
    if not pre and not post and not module.__dict__.get("_backward_hooks") and \
            not module.__dict__.get("_backward_pre_hooks"):
        return forward(*args, **kwargs)
    result, called = None, set()
    try:
        for hook in list((pre or {}).values()):
            if hook.with_kwargs:
                new = hook.fn(module, args, kwargs)
                if new is not None:
                    if not (isinstance(new, tuple) and len(new) == 2):
                        raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, "
                                           f"new_kwargs), but got {new}.")
                    args, kwargs = new
            else:
                new = hook.fn(module, args)
                if new is not None:
                    args = new if isinstance(new, tuple) else (new,)
        backward = backward_hooks.start(module, args)
        args = args if backward is None else backward.args
        result = forward(*args, **kwargs)
        for hook_id, hook in list((post or {}).items()):
            called.add(hook_id)
            new = hook.fn(module, args, kwargs, result) if hook.with_kwargs else hook.fn(module, args, result)
            result = result if new is None else new
        return result if backward is None else backward.finish(result)
    except Exception:
        for hook_id, hook in list((post or {}).items()):
            if hook.always_call and hook_id not in called:
                try:
                    hook.fn(module, args, kwargs, result) if hook.with_kwargs else hook.fn(module, args, result)
                except Exception as e:  # noqa: BLE001 - torch's: the first error is the one raised
                    warnings.warn(f"module forward hook with ``always_call=True`` raised an exception that was "
                                  f"silenced as another error was raised in forward: {e}", stacklevel=2)
        raise
