"""`gc.nn.Module` and `gc.nn.Parameter`, shaped after ``torch.nn``.

Sub-modules and parameters register in definition order; parameter names are attribute paths
(``fc1.weight``). Parameters are drawn when the module is initialised (``init_parameters(seed)``,
which ``gc.capture`` calls with its ``seed``); values assigned by the user (``p.data = arr`` or
``load_state_dict``) are kept. Inside capture, reading ``self.weight`` yields a ``gc.Tensor``
backed by an initializer named by the parameter's path.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import Builder, active, user_source
from graphc.dsl.devices import is_device
from graphc.dsl.inplace import write
from graphc.dsl.ops import detach
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype, to_numpy
from graphc.nn import init as _init


class Parameter:
    """A trainable tensor (``buffer=True``: state such as BatchNorm's running mean).

    Its dtype is ``dtype`` when given (``data`` cast to it); else ``data``'s, except that a float64
    array (numpy's default, which torch's float32 default would not give) is float32, so a float32
    model is not made float64 by an array; a ``gc.Tensor`` computed outside a capture keeps its dtype;
    float32 without ``data``. ``requires_grad=False`` (torch's frozen parameter) is read through
    ``gc.detach``: no gradient, not trained."""

    def __init__(self, data: Any = None, requires_grad: bool = True, *, shape: Any = None,
                 init: _init.Init | None = None, dtype: Any = None, buffer: bool = False):
        self.requires_grad = requires_grad
        self.persistent = True  # in state_dict (``Module.register_buffer(..., persistent=False)``: not)
        if data is not None:
            dtype = data.dtype if dtype is None and isinstance(data, Tensor) else dtype
            data = np.asarray(data)
            if dtype is None:
                dtype = "float32" if data.dtype == np.float64 else data.dtype
            shape = data.shape
            data = data.astype(to_numpy(as_dtype(dtype)))
        if shape is None:
            raise CaptureError("gc.nn.Parameter needs data or a shape")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = as_dtype("float32" if dtype is None else dtype)
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
            raise CaptureError(f"parameter {self.qualname or ''} has shape {self.shape}, got {arr.shape}")
        self._data = arr.astype(to_numpy(self.dtype))
        self.user_set = True

    def draw(self, rng: np.random.Generator) -> None:
        if not self.user_set:
            self._data = np.asarray(self.init(rng, self.shape, to_numpy(self.dtype)), order="C")

    def reinit(self, init: _init.Init) -> None:
        """Draw from ``init`` when the module is next initialised (``gc.capture``'s seed), forgetting
        any value held, as torch's ``nn.init.*_`` overwrite the tensor (``graphc.nn.init``)."""
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


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` did not match, as PyTorch returns it."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of DSL layers and models. Subclasses define ``forward``.

    A module starts in eval mode (PyTorch's start in train mode), so a capture is an inference
    graph unless ``.train()`` is called or ``gc.capture(..., training=True)`` is given."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", False)

    # -- registration ---------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise CaptureError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                               f"assigning {name!r}")
        params, modules = self.__dict__["_parameters"], self.__dict__["_modules"]
        if isinstance(value, Tensor) and name in params and params[name].buffer and active() is not None:
            write(getattr(self, name), value)  # torch: the buffer is now ``value``; captured, a write into it
            return
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, (Parameter, Module)):
            self.__dict__.pop(name, None)  # a plain attribute of that name (``self.bias = None``) would hide it
            (params if isinstance(value, Parameter) else modules)[name] = value
        else:
            _refuse_plain_container(self, name, value)
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_parameters" in d and name in d["_parameters"]:
            param = d["_parameters"][name]
            builder = active()
            if builder is None:
                return param
            tensor = _param_tensor(builder, self, name, param)
            return tensor if param.requires_grad or param.buffer else detach(tensor)
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        if name in d.get("_computed", {}):
            builder = active()
            called = None if builder is None else builder.called_values.get((id(self), name))
            return d["_computed"][name](self) if called is None else called
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        if name in d["_parameters"]:
            del d["_parameters"][name]
        elif name in d["_modules"]:
            del d["_modules"][name]
        else:
            object.__delattr__(self, name)

    def register_buffer(self, name: str, value: Any, persistent: bool = True, *, dtype: Any = None) -> None:
        """``self.<name>``: state that is not trained, in ``state_dict()`` unless not ``persistent`` (torch's
        rotary ``inv_freq``); ``value`` an array in its dtype, but float64 is float32 unless ``dtype="float64"``
        (``Parameter``'s rule), or a ``gc.Tensor`` computed here; None: no buffer."""
        buffer = None if value is None else Parameter(value, dtype=dtype, buffer=True)
        if buffer is not None:
            buffer.persistent = persistent
        self.__setattr__(name, buffer)

    def register_computed(self, name: str, compute: Any, per_call: bool = False) -> None:
        """Make ``self.<name>`` read ``compute(self)`` (``compute=None``: forget it): a weight made
        from other parameters each time it is read, as torch's parametrizations make it.
        ``per_call``: computed once per call of this module in a capture, before ``forward``, and
        read as that value until the next call, as torch's weight_norm/spectral_norm hooks set it
        in a forward pre-hook (a training-mode spectral norm's power iteration runs once per call
        however often forward reads the weight); read before any call, computed as without."""
        computed = self.__dict__.setdefault("_computed", {})
        per_call_names = self.__dict__.setdefault("_per_call", set())
        computed.pop(name, None)
        per_call_names.discard(name)
        if compute is not None:
            computed[name] = compute
            if per_call:
                per_call_names.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self.__setattr__(name, param)

    def add_module(self, name: str, module: "Module | None") -> None:
        self.__setattr__(name, module)

    register_module = add_module

    # -- traversal (PyTorch order: own parameters, then sub-modules depth-first) ---------------
    def named_modules(self, memo: set | None = None, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """``(path, module)`` for this module (path ``prefix``) and every sub-module, depth first."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, mod in self._modules.items():
            yield from mod.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        return iter(list(self._modules.items()))

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def _named_tensors(self, prefix: str = "", buffers: bool | None = None, remove_duplicate: bool = True,
                       recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Parameters (``buffers=False``), buffers (True) or both (None), in state_dict order: each
        module's parameters, then its buffers, then its sub-modules'."""
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            own = list(mod._parameters.items())
            for name, p in [*(i for i in own if not i[1].buffer), *(i for i in own if i[1].buffer)]:
                if (buffers is not None and p.buffer != buffers) or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(name, Parameter)`` for the trainable parameters (buffers not included), as PyTorch."""
        return self._named_tensors(prefix, False, remove_duplicate, recurse)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(name, buffer)`` for state that is not trained (BatchNorm's running statistics)."""
        return self._named_tensors(prefix, True, remove_duplicate, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def buffers(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_buffers(recurse=recurse))

    # -- state ----------------------------------------------------------------------------------
    def init_parameters(self, seed: int = 0, *, keep_drawn: bool = False) -> "Module":
        """Draw every parameter and buffer the user did not set, in definition order, from
        ``numpy.random.default_rng(seed)``; name each by its attribute path. ``keep_drawn`` (what
        ``gc.capture`` asks): one already drawn (by an earlier call or capture) keeps its values."""
        rng = np.random.default_rng(seed)
        seen: set[int] = set()
        for path, mod in self.named_modules():
            object.__setattr__(mod, "_path", path)
            for name, p in mod._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    p.qualname = f"{path}.{name}" if path else name
                    if not (keep_drawn and p._data is not None):
                        p.draw(rng)
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter and buffer by PyTorch's key (``layers.0.weight``, ``bn.running_mean``);
        a tensor shared by two modules appears under both keys, as in PyTorch."""
        if any(p.data is None for _, p in self._named_tensors()):
            self.init_parameters(0)
        return {name: p.numpy() for name, p in self._named_tensors(remove_duplicate=False) if p.persistent}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Set parameters and buffers from ``state`` (arrays by PyTorch's keys, e.g. a safetensors
        file PyTorch wrote). ``strict``: a key missing or unexpected is an error; a shape that
        differs always is. Nothing is set when an error is raised."""
        own = {k: p for k, p in self._named_tensors(remove_duplicate=False) if p.persistent}
        arrays = {k: np.asarray(v) for k, v in state.items() if k in own}
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        wrong = [f"{k}: the module has {own[k].shape}, the state {tuple(a.shape)}" for k, a in arrays.items()
                 if tuple(a.shape) != own[k].shape]
        problems = [f"size mismatch for {', '.join(wrong)}"] if wrong else []
        if strict:
            problems += [f"missing keys {missing}"] if missing else []
            problems += [f"unexpected keys {unexpected}"] if unexpected else []
        if problems:
            raise CaptureError(f"load_state_dict into {type(self).__name__}: " + "; ".join(problems))
        for key, array in arrays.items():
            own[key].data = array
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> "Module":
        """Training mode: Dropout drops, BatchNorm uses and updates batch statistics when captured."""
        for mod in self.modules():
            object.__setattr__(mod, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def apply(self, fn: Any) -> "Module":
        """``fn(module)`` for every sub-module, then this one, as torch's (``self.apply(init_weights)``)."""
        for mod in self.children():
            mod.apply(fn)
        fn(self)
        return self

    def to(self, *args: Any, dtype: Any = None, device: Any = None, non_blocking: bool = False) -> "Module":
        """torch's ``to(dtype)`` / ``to(device)`` / ``to(device, dtype)`` / ``to(tensor)`` (the dtype of a
        gc Tensor, numpy array or torch tensor): float parameters and buffers take ``dtype`` (integer ones,
        ``num_batches_tracked``, stay). A device (``"cpu"``, ``"cuda:0"``, a ``torch.device``) changes
        nothing: graphc chooses it per session (``backend="ort-cuda"``)."""
        for arg in args:
            if is_device(arg):
                continue
            arg = arg.dtype if _is_tensor(arg) else arg
            if dtype is not None:
                raise TypeError(f"Module.to got two dtypes, {dtype!r} and {arg!r}")
            dtype = arg
        if dtype is None:
            return self
        dt = as_dtype(dtype)
        if dt not in FLOAT_DTYPES:
            raise TypeError(f"Module.to takes a floating point dtype ({', '.join(sorted(FLOAT_DTYPES))}), as "
                            f"torch's, got {dt}")
        for _, p in self._named_tensors():
            if p.dtype in FLOAT_DTYPES:
                p.cast(dt)
        return self

    def type(self, dst_type: Any) -> "Module":
        """torch's ``type(dst_type)``: every parameter and buffer cast to ``dst_type``, integer buffers
        (``num_batches_tracked``) too; a dtype that is not floating point is refused while the module
        has parameters (torch's: they need gradients), naming the first."""
        dt = as_dtype(dst_type)
        tensors = list(self._named_tensors())
        if dt not in FLOAT_DTYPES:
            trained = [name for name, p in tensors if not p.buffer]
            if trained:
                raise TypeError(f"Module.type({dt}): parameter {trained[0]!r} must stay floating point (it "
                                f"is trained); only a module of buffers alone takes {dt}")
        for _, p in tensors:
            p.cast(dt)
        return self

    def double(self) -> "Module":
        return self.to(dtype="float64")

    def float(self) -> "Module":
        return self.to(dtype="float32")

    def half(self) -> "Module":
        return self.to(dtype="float16")

    def bfloat16(self) -> "Module":
        return self.to(dtype="bfloat16")

    # -- calling --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        builder = active()
        if builder is None:
            raise CaptureError(f"{type(self).__name__} can only be called inside gc.capture(...)")
        with builder.in_module(self.__dict__.get("_path")):
            for name in sorted(self.__dict__.get("_per_call", ())):  # torch's forward pre-hooks
                builder.called_values[id(self), name] = self.__dict__["_computed"][name](self)
                self.__dict__["_called"] = True  # reads outside a capture now see the computed value
            return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        """The name ``repr`` shows: the class's unless ``_repr_name`` is set (``MultiheadAttention``'s
        ``out_proj`` is a ``Linear`` shown by torch's name for it)."""
        return self.__dict__.get("_repr_name", type(self).__name__)

    def __repr__(self) -> str:
        """torch's: ``Name(extra)`` on one line, or the extra lines and then each ``(name): child``."""
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        if len(lines) == 1 and not self._modules:
            return f"{self._get_name()}({lines[0]})"
        return repr_block(self._get_name(), lines + [f"({name}): {mod!r}" for name, mod in self._modules.items()])


def repr_block(name: str, lines: list[str]) -> str:
    """``name(...)`` holding ``lines`` one per line, or ``name()`` with none, as torch prints."""
    return f"{name}(\n" + "\n".join(_indented(line) for line in lines) + "\n)" if lines else f"{name}()"


def _indented(text: str) -> str:
    """``text`` two spaces in, each of its lines (blank ones left empty, as torch's ``_addindent``)."""
    first, *rest = text.split("\n")
    return "\n".join(["  " + first] + ["  " + line if line.strip() else "" for line in rest])


def not_default(module: Module, **defaults: Any) -> list[str]:
    """``name=value`` for each attribute of ``module`` unlike its default, in the order given: the
    arguments torch's reprs show only when set."""
    return [f"{name}={getattr(module, name)!r}" for name, default in defaults.items()
            if getattr(module, name) != default]


def _is_tensor(arg: Any) -> bool:
    """A gc Tensor, numpy array or torch tensor: ``Module.to(tensor)`` takes its dtype."""
    return isinstance(arg, (Tensor, np.ndarray)) or (
        type(arg).__module__.split(".")[0] == "torch" and hasattr(arg, "dtype") and hasattr(arg, "shape"))


def _refuse_plain_container(owner: Module, name: str, value: Any) -> None:
    """A list, tuple or dict of Modules or Parameters is not registered (as in PyTorch): their
    parameters would be left out of ``state_dict()`` and of training. Refused, naming the fix."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    kinds = {type(v).__name__ for v in items if isinstance(v, (Module, Parameter))}
    if kinds:
        kind = "Parameter" if kinds == {"Parameter"} else "Module"
        fix = kind + ("Dict" if isinstance(value, dict) else "List")
        raise CaptureError(f"{type(owner).__name__}.{name} is a plain {type(value).__name__} holding "
                         f"{', '.join(sorted(kinds))}; it would not be registered (not in state_dict(), not "
                         f"trained, named by class at capture). Use gc.nn.{fix}(...) (at {user_source()})")


def _param_tensor(builder: Builder, owner: Module, attr: str, param: Parameter):
    """The Tensor for ``param`` in this capture (one initializer per Parameter object)."""
    tensor = builder.param_tensors.get(id(param))
    if tensor is not None:
        return tensor
    if param.data is None:  # a module not reached from the captured root: draw in use order
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
    if param.buffer:
        builder.buffers.append(tensor.value.name)
        if builder.rooted is not None and id(param) in builder.rooted:  # a training-mode forward may write it
            builder.buffer_tensors[id(tensor)] = (tensor, owner, value)
    return tensor
