"""`gc.nn.Parameter`, shaped after ``torch.nn.Parameter``: a trainable tensor or a module's buffer, whose value
is drawn when its module is initialised unless the user set it, and the Tensor that reads it in a capture."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

from graphc.dsl.builder import Builder, active, user_source
from graphc.dsl.grad_hooks import (HookHandle, PostAccumulateHook, TensorHook, apply_hook, hook_label,
                                   no_grad_error, refuse_in_body, refuse_outside_region, refuse_uncallable)
from graphc.dsl.ops import detach
from graphc.dsl.tensor import ComplexTensor, Size, Tensor
from graphc.errors import CaptureError
from graphc.model.complex_io import real_pair
from graphc.model.dtypes import COMPLEX_PARTS, as_dtype, to_numpy
from graphc.nn import draws
from graphc.nn.param_data import Sized, data_of


class Parameter(Sized):
    """A trainable tensor (``buffer=True``: state such as BatchNorm's running mean).

    Its dtype is ``dtype`` when given (``data`` cast to it); else ``data``'s, except that a float64
    array (numpy's default, which torch's float32 default would not give) is float32, so a float32
    model is not made float64 by an array; a ``gc.Tensor`` computed outside a capture or a Parameter keeps its
    dtype; float32 without ``data``. ``requires_grad=False`` (torch's frozen parameter) is read through
    ``gc.detach``: no gradient, not trained."""

    def __init__(self, data: Any = None, requires_grad: bool = True, *, shape: Any = None,
                 init: draws.Init | None = None, dtype: Any = None, buffer: bool = False):
        self.requires_grad = requires_grad
        self.persistent = True  # in state_dict (``Module.register_buffer(..., persistent=False)``: not)
        if data is not None:
            dtype = data.dtype if dtype is None and isinstance(data, (Tensor, Parameter)) else dtype
            data = np.asarray(data)
            if dtype is None:
                dtype = {np.float64: "float32", np.complex128: "complex64"}.get(data.dtype.type, data.dtype)
            shape = data.shape
            data = data.astype(to_numpy(as_dtype(dtype)))
        if shape is None:
            raise CaptureError("gc.nn.Parameter needs data or a shape")
        dtype = as_dtype("float32" if dtype is None else dtype)
        self.complex = dtype in COMPLEX_PARTS
        if self.complex:
            dtype, shape, data = as_dtype(COMPLEX_PARTS[dtype]), (*shape, 2), None if data is None else real_pair(data)
        self.shape = Size(int(d) for d in shape)
        self.dtype = dtype
        self.init = init or draws.zeros
        self.buffer = buffer
        self._data: np.ndarray | None = data
        self.user_set = data is not None
        self.qualname: str | None = None
        self.grad_hooks: OrderedDict[object, tuple[Any, str]] = OrderedDict()  # register_hook's, in order

    @property
    def data(self) -> Any:
        """torch's ``.data``: the value, an ndarray whose in-place methods (``normal_``, ``fill_``, ``mul_``, ...)
        write into it; before the module draws it, a handle that records them (``graphc.nn.param_data``)."""
        return data_of(self)

    @data.setter
    def data(self, value: Any) -> None:
        arr = held_array(self, value)
        if tuple(arr.shape) != self.shape:
            raise CaptureError(f"parameter {self.qualname or ''} has shape {self.shape}, got {arr.shape}")
        self._data = arr.astype(to_numpy(self.dtype))
        self.user_set = True

    @property
    def drawn(self) -> bool:
        """Whether a value is held (drawn, loaded or set); ``.data`` reads values only then."""
        return self._data is not None

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The value (``np.asarray(param)``), so a Parameter goes where an array does, as a torch one."""
        return np.array(self.numpy(), dtype=dtype, copy=copy)

    def size(self, dim: int | None = None) -> Any:
        """torch's ``size()``: the shape, or its ``dim`` entry."""
        return self.shape if dim is None else self.shape[dim]

    def requires_grad_(self, requires_grad: bool = True) -> "Parameter":
        """Set ``requires_grad`` (False: frozen, read through ``gc.detach``); returns self, as torch's."""
        self.requires_grad = bool(requires_grad)
        return self

    def register_hook(self, hook: Any) -> HookHandle:
        """torch's ``register_hook`` on a Parameter: ``hook(grad)`` (a new gradient, or None: unchanged) applied to
        this parameter's gradient in every capture that reads it (``graphc.dsl.grad_hooks``), so ``gc.grad`` gives,
        and a training graph's update steps by, the hooked gradient; several in registration order. ``remove()``
        takes it off (the captures made meanwhile keep it)."""
        where = f"Parameter.register_hook at {user_source()}"
        refuse_uncallable(hook, where)
        if self.buffer or not self.requires_grad or self.complex:
            why = "a buffer" if self.buffer else "complex" if self.complex else "frozen (requires_grad=False)"
            raise no_grad_error(where, f"parameter {self.qualname or ''} is {why}")
        builder = active()
        if builder is not None and len(builder.scopes) > 1:
            refuse_in_body(where, f"parameter {self.qualname}" if self.qualname else "this parameter")
        if builder is not None:
            refuse_outside_region(builder, None, where, f"parameter {self.qualname}" if self.qualname else
                                  "this parameter")
        key = object()
        label = f"the hook {hook_label(hook)} registered at {user_source()}"
        self.grad_hooks[key] = (hook, label)
        handle = HookHandle(lambda: self.grad_hooks.pop(key, None))
        if builder is not None and id(self) in builder.param_tensors:  # already read in this capture
            handle.add(apply_hook(builder, builder.param_tensors[id(self)], hook, label, _marker(hook)))
        return handle

    def register_post_accumulate_grad_hook(self, hook: Any) -> HookHandle:
        """torch's ``hook(param)``, run once the gradient is in ``param.grad``: ``hook`` gets the parameter with
        ``.grad`` the gradient (after every ``register_hook`` hook registered before the capture), and what it
        leaves there (assigned, or changed in place: ``p.grad.clamp_(-1, 1)``) is the gradient ``gc.grad`` gives
        and a training graph steps by; it returns None, as torch's must. A training graph zeroes gradients
        every step, so ``.grad`` holds the step's gradient. ``gc.Trainer(accumulate=k)`` and ``workers=N`` refuse such
        artifacts (``refuse_post_accumulate_hooks``)."""
        return self.register_hook(_PostAccumulate(self, hook, f"Parameter.register_post_accumulate_grad_hook "
                                                              f"at {user_source()}"))

    def draw(self, rng: np.random.Generator) -> None:
        if not self.user_set:
            self._data = np.asarray(self.init(rng, self.shape, to_numpy(self.dtype)), order="C")

    def reinit(self, init: draws.Init) -> None:
        """Draw from ``init`` when the module is next initialised (``gc.capture``'s seed), forgetting
        any value held, as torch's ``nn.init.*_`` overwrite the tensor (``graphc.nn.draws``)."""
        self.init, self._data, self.user_set = init, None, False

    def cast(self, dtype: Any) -> None:
        """Hold the value (and draw it, if not drawn yet) in ``dtype``."""
        self.dtype = as_dtype(dtype)
        if self._data is not None:
            self._data = self._data.astype(to_numpy(self.dtype))

    def numpy(self) -> np.ndarray:
        if self._data is None:
            raise CaptureError(f"parameter {self.qualname or ''} is not initialised; call init_parameters(seed)")
        return self._data

    def __repr__(self) -> str:
        kind = "Buffer" if self.buffer else "Parameter"
        return f"{kind}({self.dtype}{list(self.shape)})"


def _in_place(name: str) -> Any:
    def method(self: Parameter, *args: Any, **kwargs: Any) -> Parameter:
        getattr(self.data, name)(*args, **kwargs)
        return self

    method.__name__ = name
    method.__doc__ = f"``torch.Tensor.{name}`` on the parameter outside a capture (``with torch.no_grad(): " \
                     f"w.{name}(...)``), as ``.data.{name}``; returns self."
    return method


for _name in ("copy_", "fill_", "zero_", "add_", "sub_", "mul_", "div_", "clamp_", "clip_", "normal_", "uniform_"):
    setattr(Parameter, _name, _in_place(_name))


class _PostAccumulate:
    """A post-accumulate hook as a gradient hook: ``hook`` called with ``_Accumulated``, its ``.grad`` returned."""

    def __init__(self, param: Parameter, hook: Any, where: str) -> None:
        refuse_uncallable(hook, where)
        self.param, self.hook, self.where = param, hook, where
        self.__qualname__, self.__code__ = getattr(hook, "__qualname__", type(hook).__name__), getattr(
            hook, "__code__", None)

    def __call__(self, grad: Tensor) -> Tensor:
        seen = _Accumulated(self.param, grad)
        if self.hook(seen) is not None:
            raise CaptureError(f"{self.where}: post accumulate grad hooks should return None (as torch's); change "
                               "p.grad in place or assign it")
        if seen.grad is None:
            raise CaptureError(f"{self.where}: the hook set .grad to None; torch then skips the parameter's update, "
                               "which a training graph cannot: freeze it with requires_grad_(False)")
        return seen.grad


def _marker(hook: Any) -> type:
    """The Function ``apply_hook`` marks ``hook`` with: a post-accumulate hook's own."""
    return PostAccumulateHook if isinstance(hook, _PostAccumulate) else TensorHook


class _Accumulated:
    """The parameter as a post-accumulate hook sees it: its attributes, and ``.grad`` the gradient."""

    def __init__(self, param: Parameter, grad: Tensor) -> None:
        self._param, self.grad = param, grad

    def __getattr__(self, name: str) -> Any:
        return getattr(self._param, name)


def held_array(param: Parameter, value: Any) -> np.ndarray:
    """``value`` as ``param`` holds it: torch's complex array of a complex parameter as its real pair."""
    array = np.asarray(value)
    return real_pair(array) if getattr(param, "complex", False) and np.iscomplexobj(array) else array


def param_tensor(builder: Builder, owner: Any, attr: str, param: Parameter) -> Tensor:
    """The Tensor for ``param`` in this capture (one initializer per Parameter object; a complex one's real pair)."""
    tensor = builder.param_tensors.get(id(param))
    if tensor is not None:
        return tensor
    if not param.drawn:  # a module not reached from the captured root: draw in use order
        param.draw(builder.rng)
    if builder.rooted is not None and id(param) in builder.rooted:
        value = builder.add_initializer(param.qualname, param.numpy())
    else:  # a module the captured function closes over: name it by its class, made unique
        if builder.rooted is not None:
            warnings.warn(f"{type(owner).__name__}.{attr} is used in forward but its module is not a registered "
                          f"sub-module of the captured Module, so it is not in state_dict() (PyTorch would not "
                          f"train it either); register it as an attribute or in gc.nn.ModuleList/ModuleDict "
                          f"(at {user_source()})", stacklevel=2)
        value = builder.add_initializer(f"{type(owner).__name__.lower()}.{attr}", param.numpy(), exact=False)
    tensor = Tensor(value, eager_value=param.numpy() if builder.scopes[0].eager else None)
    tensor._scope = builder.scopes[0].id  # an initializer, the main graph's, wherever first read
    builder.param_tensors[id(param)] = tensor
    # post-accumulate hooks after the others, as torch runs them
    for hook, label in sorted(param.grad_hooks.values(), key=lambda h: isinstance(h[0], _PostAccumulate)):
        apply_hook(builder, tensor, hook, label, _marker(hook))
    if param.buffer:
        builder.buffers.append(tensor.value.name)
        if builder.rooted is not None and id(param) in builder.rooted:  # a training-mode forward may write it
            builder.buffer_tensors[id(tensor)] = (tensor, owner, value)
    return tensor


def read_param(builder: Builder, owner: Any, attr: str, param: Parameter) -> Tensor:
    """What ``owner.<attr>`` reads in this capture: ``param_tensor``, or for a frozen parameter
    (``requires_grad=False``) its ``gc.detach``, one per graph scope that every read there shares (a
    body's Identity cannot serve the graph around it)."""
    tensor = param_tensor(builder, owner, attr, param)
    if not (param.requires_grad or param.buffer):
        key = (id(param), builder.scope.id)
        if key not in builder.param_tensors:
            builder.param_tensors[key] = detach(tensor)
        tensor = builder.param_tensors[key]
    return ComplexTensor(pair=tensor) if getattr(param, "complex", False) else tensor


def is_tensor(obj: Any) -> bool:
    """``torch.is_tensor``: whether ``obj`` is a ``gc.Tensor`` or a ``gc.nn.Parameter`` (torch's Parameter is a
    Tensor); a numpy array is not, as torch's answer for one."""
    return isinstance(obj, (Tensor, Parameter))
