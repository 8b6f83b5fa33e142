"""`gc.nn.Module` and `gc.nn.Parameter`, shaped after ``torch.nn``.

Sub-modules and parameters register in definition order; parameter names are attribute paths
(``fc1.weight``). Parameters are drawn when the module is initialised (``init_parameters(seed)``,
which ``gc.capture`` calls with its ``seed``); values assigned by the user (``p.data = arr`` or
``load_state_dict``) are kept. Inside capture, reading ``self.weight`` yields a ``gc.Tensor``
backed by an initializer named by the parameter's path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from graphc.dsl.builder import Builder, active
from graphc.dsl.tensor import Tensor
from graphc.dtypes import as_dtype, to_numpy
from graphc.errors import GraphError
from graphc.nn import init as _init


class Parameter:
    """A trainable tensor (``buffer=True``: state such as BatchNorm's running mean)."""

    def __init__(self, data: Any = None, *, shape: Any = None, init: _init.Init | None = None,
                 dtype: Any = "float32", buffer: bool = False):
        if data is not None:
            data = np.asarray(data)
            dtype = as_dtype(data.dtype) if data.dtype != np.float64 else as_dtype(dtype)
            shape = data.shape
            data = data.astype(to_numpy(dtype))
        if shape is None:
            raise GraphError("gc.nn.Parameter needs data or a shape")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = as_dtype(dtype)
        self.init = init or _init.zeros
        self.buffer = buffer
        self._data: np.ndarray | None = data
        self.user_set = data is not None
        self.qualname: str | None = None

    @property
    def data(self) -> np.ndarray | None:
        """The value (None until initialised or assigned)."""
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        arr = np.asarray(value)
        if tuple(arr.shape) != self.shape:
            raise GraphError(f"parameter {self.qualname or ''} has shape {self.shape}, got {arr.shape}")
        self._data = arr.astype(to_numpy(self.dtype))
        self.user_set = True

    def draw(self, rng: np.random.Generator) -> None:
        if not self.user_set:
            self._data = np.ascontiguousarray(self.init(rng, self.shape, to_numpy(self.dtype)))

    def numpy(self) -> np.ndarray:
        if self._data is None:
            raise GraphError(f"parameter {self.qualname or ''} is not initialised; call init_parameters(seed)")
        return self._data

    def __repr__(self) -> str:
        kind = "Buffer" if self.buffer else "Parameter"
        return f"{kind}({self.dtype}{list(self.shape)})"


class Module:
    """Base class of DSL layers and models. Subclasses define ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", False)

    # -- registration ---------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise GraphError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                             f"assigning {name!r}")
        params, modules = self.__dict__["_parameters"], self.__dict__["_modules"]
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_parameters" in d and name in d["_parameters"]:
            param = d["_parameters"][name]
            builder = active()
            return param if builder is None else _param_tensor(builder, self, name, param)
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name: str, value: Any) -> None:
        self.__setattr__(name, Parameter(value, buffer=True))

    def add_module(self, name: str, module: "Module") -> None:
        self.__setattr__(name, module)

    # -- traversal (PyTorch order: own parameters, then sub-modules depth-first) ---------------
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, mod in self._modules.items():
            yield from mod.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def named_parameters(self, prefix: str = "", buffers: bool = True) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        for mod_prefix, mod in self.named_modules(prefix):
            for name, p in mod._parameters.items():
                if id(p) in seen or (p.buffer and not buffers):
                    continue
                seen.add(id(p))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters(buffers=False)]

    def children(self) -> list["Module"]:
        return list(self._modules.values())

    # -- state ----------------------------------------------------------------------------------
    def init_parameters(self, seed: int = 0) -> "Module":
        """Draw every parameter the user did not set, in definition order, from
        ``numpy.random.default_rng(seed)``; name each by its attribute path."""
        rng = np.random.default_rng(seed)
        for name, p in self.named_parameters():
            p.qualname = name
            p.draw(rng)
        for path, mod in self.named_modules():
            object.__setattr__(mod, "_path", path)
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        if any(p.data is None for _, p in self.named_parameters()):
            self.init_parameters(0)
        return {name: p.numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]
        if strict and (missing or unexpected):
            raise GraphError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for key, value in state.items():
            if key in own:
                own[key].data = np.asarray(value)

    def train(self, mode: bool = True) -> "Module":
        for _, mod in self.named_modules():
            object.__setattr__(mod, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    # -- calling --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        builder = active()
        if builder is None:
            raise GraphError(f"{type(self).__name__} can only be called inside gc.capture(...)")
        with builder.in_module(self.__dict__.get("_path")):
            return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, mod in self._modules.items():
            sub = repr(mod).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


def _param_tensor(builder: Builder, owner: Module, attr: str, param: Parameter):
    """The Tensor for ``param`` in this capture (one initializer per Parameter object)."""
    tensor = builder.param_tensors.get(id(param))
    if tensor is not None:
        return tensor
    if param.data is None:  # a module not reached from the captured root: draw in use order
        param.draw(builder.rng)
    if id(param) in builder.rooted:
        value = builder.add_initializer(param.qualname, param.numpy())
    else:  # a module the captured function closes over: name it by its class, made unique
        value = builder.add_initializer(f"{type(owner).__name__.lower()}.{attr}", param.numpy(), exact=False)
    tensor = Tensor(value, eager_value=param.numpy() if builder.scopes[0].eager else None)
    builder.param_tensors[id(param)] = tensor
    if param.buffer:
        builder.buffers.append(tensor.value.name)
    return tensor
