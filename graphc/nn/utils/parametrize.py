"""``gc.nn.utils.parametrize``: torch.nn.utils.parametrize. ``register_parametrization(module, "weight", P())``
moves the weight to ``module.parametrizations.weight.original`` (``original0``, ``original1``, ... where ``P``'s
``right_inverse`` returns a tuple), and ``module.weight`` is then ``P(original)`` each time it is read (stacked
ones in registration order): in a capture, ``P``'s ops in the graph, which autodiff differentiates; outside a
capture, evaluated eagerly and given as a numpy array (torch's value). ``weight_norm``, ``spectral_norm`` and
``orthogonal`` (``parametrizations``) are parametrizations registered here. The module's class is not
changed (torch's becomes ``ParametrizedLinear``); ``type_before_parametrizations`` gives it all the same."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphc.dsl.builder import active, user_source
from graphc.dsl.ops_factories import as_tensor
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import as_dtype
from graphc.nn.containers import ModuleDict, ModuleList
from graphc.nn.hooks import call_hooked
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.norms import weight_value

__all__ = ["ParametrizationList", "cached", "is_parametrized", "register_parametrization", "remove_parametrizations",
           "type_before_parametrizations"]

_CACHE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("graphc_parametrize_cache", default=None)


def _call(p: Module, *args: Any) -> Any:
    """``p(*args)``: in a capture, its forward with its hooks, the nodes named in the reading module's scope
    (as they were before parametrizations were modules); outside one, its ``forward`` on eager Tensors."""
    if active() is not None:
        return call_hooked(p, p.forward, args, {})
    return p.forward(*(as_tensor(np.asarray(a)) for a in args))


def _meta(x: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a Tensor, Parameter or array."""
    if isinstance(x, (Tensor, Parameter)):
        return tuple(x.shape), str(as_dtype(x.dtype))
    x = np.asarray(x)
    return x.shape, str(as_dtype(x.dtype))


def _right_inverse(p: Module, value: Any) -> Any:
    """``p.right_inverse(value)`` on eager Tensors; ``value`` itself where ``p`` has none or it raises
    NotImplementedError, as torch's."""
    if not hasattr(p, "right_inverse"):
        return value
    try:
        return p.right_inverse(as_tensor(np.asarray(value)))
    except NotImplementedError:
        return value


def _check(what: str, got: Any, want: tuple[tuple[int, ...], str], why: str) -> None:
    """``got``'s shape and dtype are ``want``'s, else a CaptureError saying ``what`` differs and ``why``."""
    (shape, dtype), (want_shape, want_dtype) = _meta(got), want
    for kind, a, b in (("dtype", want_dtype, dtype), ("shape", want_shape, shape)):
        if a != b:
            raise CaptureError(f"{what} may not change the {kind} of the tensor{why}: got {b}, expected {a} "
                               f"(at {user_source()})")


class ParametrizationList(ModuleList):
    """What torch keeps under ``module.parametrizations.<name>``: the parametrizations (``0``, ``1``, ...,
    applied in that order) and the tensor(s) they start from (``original``; ``original0``, ``original1``, ...
    where the first's ``right_inverse`` returns a sequence). Made by ``register_parametrization``."""

    def __init__(self, modules: Sequence[Module], original: Parameter, unsafe: bool = False, *,
                 owner: str = "") -> None:
        super().__init__(modules)
        object.__setattr__(self, "_owner", owner)
        self.unsafe = unsafe
        want = _meta(original)
        new = original.numpy()
        for p in reversed(list(self)):
            new = _right_inverse(p, new)
        self.is_tensor = not isinstance(new, (list, tuple))
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            _check(f"right_inverse of {owner}, returning one tensor,", new, (_meta(new)[0], want[1]), "")
            self.original = _holding(original, new)
        else:
            for i, value in enumerate(new):
                setattr(self, f"original{i}", _like(original, value))
        if not unsafe:
            _check(f"registering a parametrization on {owner}", self.value(), want,
                   ", unless unsafe=True")

    def _names(self) -> list[str]:
        return ["original"] if self.is_tensor else [f"original{i}" for i in range(self.ntensors)]

    def originals(self) -> list[Parameter]:
        """The original Parameter(s), in order."""
        return [self._parameters[n] for n in self._names()]

    def value(self) -> Any:
        """The parametrized tensor: the parametrizations applied to the original(s) (in a capture, their
        Tensors; else their values, the result a numpy array); once per ``cached()`` block."""
        cache = _CACHE.get()
        key = (id(self), id(active()))
        if cache is not None and key in cache:
            return cache[key][1]
        first, *rest = list(self)
        x = _call(first, *(getattr(self, n) for n in self._names()))
        for p in rest:
            x = _call(p, x)
        x = x if active() is not None else np.asarray(x)
        if cache is not None:
            cache[key] = (self, x)  # self kept alive so its id is not reused within the block
        return x

    def right_inverse(self, value: Any) -> None:
        """torch's assignment ``module.<name> = value``: the parametrizations' ``right_inverse`` in reverse
        order, the result stored in the original(s)."""
        if active() is not None:
            raise CaptureError(f"{self._owner}: assigning to a parametrized tensor inside gc.capture; assign "
                               f"outside it (at {user_source()})")
        for p in reversed(list(self)):
            if not hasattr(p, "right_inverse"):
                raise CaptureError(f"{self._owner}: parametrization {type(p).__name__} does not implement "
                                   f"right_inverse, so the tensor cannot be assigned (at {user_source()})")
            value = p.right_inverse(as_tensor(np.asarray(value)))
        values = [value] if self.is_tensor else list(value)
        if len(values) != self.ntensors:
            raise CaptureError(f"{self._owner}: right_inverse returned {len(values)} tensors, expected "
                               f"{self.ntensors} (at {user_source()})")
        for param, v in zip(self.originals(), values):
            _check(f"assigning to {self._owner}", v, _meta(param), "")
            param.data = np.asarray(v)


def _like(original: Parameter, value: Any) -> Parameter:
    """A new parameter (or buffer, as ``original``) holding ``value``, with ``original``'s ``requires_grad``."""
    value = np.asarray(value)
    param = Parameter(value, requires_grad=original.requires_grad, dtype=value.dtype, buffer=original.buffer)
    param.persistent = original.persistent
    return param


def _holding(original: Parameter, value: Any) -> Parameter:
    """``original`` holding ``value`` (the same object, as torch's ``set_``); a new one of its kind where the
    shape differs."""
    value = np.asarray(value)
    if tuple(value.shape) != tuple(original.shape):
        return _like(original, value)
    original.data = value
    return original


def _entry(module: Module, name: str) -> ParametrizationList:
    return module._modules["parametrizations"]._modules[name]


def tensor_value(module: Module, name: str, fn: str) -> Any:
    """``module.<name>`` outside a capture (a parameter drawn now if it is not yet), parametrized or not; a
    CaptureError naming the module where it has no such tensor, as torch's ValueError."""
    held = module._parameters.get(name)
    if held is None and not is_parametrized(module, name):
        raise CaptureError(f"{fn}: module {type(module).__name__} does not have a parameter, a buffer, or a "
                           f"parametrized element with name {name!r} (at {user_source()})")
    if held is not None:
        weight_value(held)
    return getattr(module, name)


def register_parametrization(module: Module, tensor_name: str, parametrization: Module, *,
                             unsafe: bool = False) -> Module:
    """torch's ``register_parametrization``: ``module.<tensor_name>`` becomes ``parametrization`` of it (stacked
    after any registered before). Unless ``unsafe``, the result must keep the tensor's shape and dtype (checked
    once, now; a ``right_inverse`` too); refused naming the module and tensor, as torch's ValueError (a
    ``gc.CaptureError`` is one). ``parametrization`` takes ``module``'s training mode. Returns ``module``."""
    owner = f"{type(module).__name__}.{tensor_name}"
    if active() is not None:
        raise CaptureError(f"register_parametrization({owner}) inside gc.capture: register it when the module "
                           f"is built (at {user_source()})")
    if not isinstance(parametrization, Module):
        raise TypeError(f"register_parametrization({owner}): the parametrization must be a gc.nn.Module, got "
                        f"{type(parametrization).__name__}")
    parametrization.train(module.training)
    if is_parametrized(module, tensor_name):
        entry = _entry(module, tensor_name)
        if not unsafe:
            y = getattr(module, tensor_name)
            x = np.asarray(_call(parametrization, y))
            _check(f"registering a parametrization on {owner}", x, _meta(y), ", unless unsafe=True")
            if hasattr(parametrization, "right_inverse"):
                _check(f"the right_inverse of a parametrization on {owner}", _right_inverse(parametrization, x),
                       _meta(y), ", unless unsafe=True")
        entry.append(parametrization)
        entry.unsafe = entry.unsafe or unsafe
        return module
    original = tensor_value(module, tensor_name, "register_parametrization")
    entry = ParametrizationList([parametrization], original, unsafe, owner=owner)
    delattr(module, tensor_name)
    if "parametrizations" not in module._modules:
        module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = entry
    module.register_computed(tensor_name, lambda m: _entry(m, tensor_name).value(),
                             assign=lambda m, value: _entry(m, tensor_name).right_inverse(value))
    return module


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    """Whether ``module`` has a parametrization on ``tensor_name`` (None: on any tensor)."""
    held = module._modules.get("parametrizations")
    if not isinstance(held, ModuleDict):
        return False
    return len(held) > 0 if tensor_name is None else tensor_name in held


def remove_parametrizations(module: Module, tensor_name: str, leave_parametrized: bool = True) -> Module:
    """torch's ``remove_parametrizations``: ``module.<tensor_name>`` a plain parameter (or buffer) again, of the
    parametrized value (``leave_parametrized``; one original: the same object, as torch's ``set_``) or the
    original (only where there is one, else refused as torch's). Every parametrization on it goes."""
    if not is_parametrized(module, tensor_name):
        raise CaptureError(f"remove_parametrizations: module {type(module).__name__} does not have a "
                           f"parametrization on {tensor_name!r} (at {user_source()})")
    entry = _entry(module, tensor_name)
    if not entry.is_tensor and not leave_parametrized:
        raise CaptureError(f"remove_parametrizations({type(module).__name__}.{tensor_name}): cannot leave "
                           f"unparametrized (leave_parametrized=False) a tensor parametrized in terms of "
                           f"{entry.ntensors} tensors (at {user_source()})")
    originals = entry.originals()
    if leave_parametrized:
        value = getattr(module, tensor_name)
        tensor = _holding(originals[0], value) if entry.is_tensor else _like(originals[0], value)
        tensor.requires_grad = any(p.requires_grad for p in originals)
    else:
        tensor = originals[0]
    module.register_computed(tensor_name, None)
    del module.parametrizations[tensor_name]
    setattr(module, tensor_name, tensor)
    if not module.parametrizations:
        delattr(module, "parametrizations")
    return module


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """torch's ``parametrize.cached()``: inside the block each parametrized tensor is computed once (per
    capture) and that value read again; blocks nest, the outermost ends the cache."""
    if _CACHE.get() is not None:
        yield
        return
    token = _CACHE.set({})
    try:
        yield
    finally:
        _CACHE.reset(token)


def type_before_parametrizations(module: Module) -> type:
    """``type(module)``: graphc leaves a parametrized module's class as it was."""
    return type(module)
