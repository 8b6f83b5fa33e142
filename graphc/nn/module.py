"""`gc.nn.Module`, shaped after ``torch.nn.Module`` (``gc.nn.Parameter``: ``graphc.nn.parameter``).

Sub-modules and parameters register in definition order; parameter names are attribute paths
(``fc1.weight``). Parameters are drawn when the module is initialised (``init_parameters(seed)``,
which ``gc.capture`` calls with its ``seed``); values assigned by the user (``p.data = arr`` or
``load_state_dict``) are kept. Inside capture, reading ``self.weight`` yields a ``gc.Tensor``
backed by an initializer named by the parameter's path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import active, user_source
from graphc.dsl.devices import is_device
from graphc.dsl.seeding import initial_seed
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, DType, as_dtype
from graphc.nn.buffer import Buffer
from graphc.nn.backward_hooks import deprecated_hook_refused
from graphc.nn.hooks import RemovableHandle, add_hook, call_hooked
from graphc.nn.parameter import Parameter, held_array, read_param
from graphc.nn.reprs import repr_block
from graphc.nn.slots import (EXPECTED, check_name, children, empty, is_tensor, register, registered, set_buffer,
                             wrong_kind)

__all__ = ["IncompatibleKeys", "Module", "Parameter"]


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
        object.__setattr__(self, "_slots", {})  # registered names set to None (``graphc.nn.slots``)
        object.__setattr__(self, "training", False)

    # -- registration (what a registered name takes: ``graphc.nn.slots``) -------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise CaptureError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                               f"assigning {name!r}")
        d = self.__dict__
        kind, held = registered(d, name)
        if name in d.get("_assign", {}):  # a parametrized tensor: torch's right_inverse into its original
            d["_assign"][name](self, value)
        elif isinstance(value, Parameter):  # onto any name, as torch's
            register(d, "_parameters", name, value, "buffer" if value.buffer else "parameter")
        elif isinstance(value, Buffer):  # torch 2.x's nn.Buffer: register_buffer by assignment
            self.register_buffer(name, value.data, value.persistent)
        elif kind == "parameter" and value is not None:
            raise wrong_kind(self, name, kind, value)
        elif isinstance(value, Module):
            register(d, "_modules", name, value, "child module")
        elif kind == "child module" and value is not None:
            raise wrong_kind(self, name, kind, value)
        elif kind is not None and value is None:
            empty(d, name, kind)
        elif kind == "buffer":
            set_buffer(self, name, held, value)
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
            return read_param(builder, self, name, param)
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        if name in d.get("_slots", {}):
            return None
        if name in d.get("_computed", {}):
            builder = active()
            called = None if builder is None else builder.called_values.get((id(self), name))
            return d["_computed"][name](self) if called is None else called
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        registry = next((r for r in ("_parameters", "_modules", "_slots") if name in d[r]), None)
        if registry is None:
            object.__delattr__(self, name)
        else:
            del d[registry][name]

    def register_buffer(self, name: str, value: Any, persistent: bool = True, *, dtype: Any = None) -> None:
        """``self.<name>``: state that is not trained, in ``state_dict()`` unless not ``persistent`` (torch's
        rotary ``inv_freq``); ``value`` an array in its dtype, but float64 is float32 unless ``dtype="float64"``
        (``Parameter``'s rule), or a ``gc.Tensor`` computed here; None: the buffer's slot, empty until a tensor
        is assigned there (``graphc.nn.slots``), as torch's. A name holding something else is torch's KeyError."""
        check_name(self, name, "buffer")
        if value is not None and not is_tensor(value):
            raise TypeError(f"cannot assign {type(value).__name__!r} object to buffer {name!r} ({EXPECTED['buffer']} "
                            f"or None required)")
        if value is None:
            empty(self.__dict__, name, "buffer", persistent)
            return
        buffer = Parameter(value, dtype=dtype, buffer=True)
        buffer.persistent = persistent
        self.__setattr__(name, buffer)

    def register_computed(self, name: str, compute: Any, per_call: bool = False, assign: Any = None) -> None:
        """Make ``self.<name>`` read ``compute(self)`` (``compute=None``: forget it): a weight made
        from other parameters each time it is read, as torch's parametrizations make it.
        ``per_call``: computed once per call of this module in a capture, before ``forward``, and
        read as that value until the next call, as torch's weight_norm/spectral_norm hooks set it
        in a forward pre-hook (a training-mode spectral norm's power iteration runs once per call
        however often forward reads the weight); read before any call, computed as without. ``assign``:
        ``self.<name> = value`` calls ``assign(self, value)``, as a parametrization's ``right_inverse``."""
        computed = self.__dict__.setdefault("_computed", {})
        self.__dict__.setdefault("_assign", {}).pop(name, None)
        per_call_names = self.__dict__.setdefault("_per_call", set())
        computed.pop(name, None)
        per_call_names.discard(name)
        if compute is not None:
            computed[name] = compute
            if assign is not None:
                self.__dict__["_assign"][name] = assign
            if per_call:
                per_call_names.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """``self.<name> = param``; None: the parameter's slot (``graphc.nn.slots``), as torch's. A name holding
        something else is torch's KeyError, a ``param`` not a Parameter its TypeError."""
        check_name(self, name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign {type(param).__name__!r} object to parameter {name!r} (gc.nn.Parameter "
                            f"or None required)")
        if param is None:
            empty(self.__dict__, name, "parameter")
        else:
            self.__setattr__(name, param)

    def add_module(self, name: str, module: "Module | None") -> None:
        """``self.<name> = module``; None: the child module's slot (``graphc.nn.slots``), as torch's. A name holding
        something else is torch's KeyError, a ``module`` not a Module its TypeError."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        check_name(self, name, "child module")
        if module is None:
            empty(self.__dict__, name, "child module")
        else:
            self.__setattr__(name, module)

    register_module = add_module

    def get_submodule(self, target: str) -> "Module":
        """The sub-module at the dotted path ``target`` (``""``: this one); an ``AttributeError`` names the
        first step that is missing or not a Module, as torch's."""
        mod = self
        for item in target.split(".") if target else ():
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def set_submodule(self, target: str, module: "Module", strict: bool = False) -> None:
        """Put ``module`` at the dotted path ``target``, replacing a sub-module there or (not ``strict``)
        adding it to the parent, as torch's."""
        if not target:
            raise ValueError("Cannot set the submodule without a target name!")
        if not isinstance(module, Module):
            raise ValueError(f"`module` is not an nn.Module, found {type(module)}")
        parent_path, _, name = target.rpartition(".")
        parent = self.get_submodule(parent_path)
        if strict and not hasattr(parent, name):
            raise AttributeError(f"{parent._get_name()} has no attribute `{name}`")
        if hasattr(parent, name) and not isinstance(getattr(parent, name), Module):
            raise AttributeError(f"`{name}` is not an nn.Module")
        setattr(parent, name, module)

    def get_parameter(self, target: str) -> Any:
        """The parameter at the dotted path ``target`` (``fc.weight``), read as ``self.fc.weight`` is."""
        return self._get_tensor(target, buffer=False)

    def get_buffer(self, target: str) -> Any:
        """The buffer at the dotted path ``target`` (``bn.running_mean``), read as the attribute is."""
        return self._get_tensor(target, buffer=True)

    def _get_tensor(self, target: str, buffer: bool) -> Any:
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        held = mod._parameters.get(name)  # hasattr would read it (in a capture: its Tensor) before getattr again
        if held is None and not hasattr(mod, name):
            raise AttributeError(f"{mod._get_name()} has no attribute `{name}`")
        if held is None or held.buffer != buffer:
            raise AttributeError(f"`{name}` is " + ("not a buffer" if buffer else "not an nn.Parameter"))
        return getattr(mod, name)

    # -- traversal (PyTorch order: own parameters, then sub-modules depth-first) ---------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """``(path, module)`` for this module (path ``prefix``) and every sub-module, depth first; one
        reached twice (shared) is given once unless not ``remove_duplicate``. ``memo``: modules to skip, as
        torch's."""
        memo = set() if memo is None else memo
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, mod in self._modules.items():
            yield from mod.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self, remove_duplicate: bool = True) -> Iterator["Module"]:
        return (m for _, m in self.named_modules(remove_duplicate=remove_duplicate))

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """``(name, child)`` for each direct sub-module, one registered under two names given once, as torch's."""
        seen: set[int] = set()
        for name, mod in list(self._modules.items()):
            if id(mod) not in seen:
                seen.add(id(mod))
                yield name, mod

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def _named_tensors(self, prefix: str = "", buffers: bool | None = None, remove_duplicate: bool = True,
                       recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Parameters (``buffers=False``), buffers (True) or both (None), in state_dict order: each
        module's parameters, then its buffers, then its sub-modules'."""
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
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
    def init_parameters(self, seed: int | None = None, *, keep_drawn: bool = False) -> "Module":
        """Draw every parameter and buffer the user did not set, in definition order, from
        ``numpy.random.default_rng(seed)`` (None: ``gc.initial_seed()``, 0 unless ``gc.manual_seed`` set it); name
        each by its attribute path. ``keep_drawn`` (what ``gc.capture`` asks): one already drawn (by an earlier call
        or capture) keeps its values."""
        rng = np.random.default_rng(initial_seed() if seed is None else seed)
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

    def state_dict(self, *, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Any]:
        """Every persistent parameter and buffer by PyTorch's key (``layers.0.weight``, ``bn.running_mean``)
        after ``prefix``, as arrays (``keep_vars``: the ``Parameter`` objects), put into ``destination`` when
        given; a tensor or module shared by two modules appears under both keys, as in PyTorch."""
        if not all(p.drawn for _, p in self._named_tensors()):
            self.init_parameters()
        out = {} if destination is None else destination
        for name, p in self._named_tensors(remove_duplicate=False):
            if p.persistent:
                out[prefix + name] = p if keep_vars else p.numpy()
        return out

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Set parameters and buffers from ``state`` (arrays by PyTorch's keys, e.g. a safetensors
        file PyTorch wrote), cast to their dtypes (``assign``: each takes the state's dtype, as torch's
        ``assign=True`` takes the state's tensors). ``strict``: a key missing or unexpected is an error;
        a shape that differs always is. Nothing is set when an error is raised."""
        own = {k: p for k, p in self._named_tensors(remove_duplicate=False) if p.persistent}
        arrays = {k: held_array(own[k], v) for k, v in state.items() if k in own}
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
            if assign:
                own[key].cast(array.dtype)
            own[key].data = array
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> "Module":
        """Training mode: Dropout drops, BatchNorm uses and updates batch statistics when captured. Each
        child's ``train(mode)`` is called, as torch's (an override in a sub-module runs); returns self."""
        if not isinstance(mode, bool):
            raise ValueError(f"training mode is expected to be boolean, got {mode!r}")
        object.__setattr__(self, "training", mode)
        for mod in self.children():
            mod.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` on every parameter (torch's freezing for fine-tuning); returns self. A frozen
        parameter is read through ``gc.detach`` at capture: no gradient, not trained."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do, kept so a torch training loop runs: graphc's parameters hold no ``.grad`` (each
        gradient is an output of ``gc.grad``'s model or of a training step, computed afresh)."""

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
            arg = arg.dtype if is_tensor(arg) else arg
            if dtype is not None:
                raise TypeError(f"Module.to got two dtypes, {dtype!r} and {arg!r}")
            dtype = arg
        if dtype is None:
            return self
        dt = as_dtype(dtype)
        if dt not in FLOAT_DTYPES:
            raise TypeError(f"Module.to takes a floating point dtype ({', '.join(sorted(FLOAT_DTYPES))}), as "
                            f"torch's, got {dt}")
        return self._cast(dt, floats_only=True)

    def cpu(self) -> "Module":
        """Self, unchanged: graphc chooses the device per session (``gc.Session(model, backend=...)``)."""
        return self

    def cuda(self, device: Any = None) -> "Module":
        """Self, unchanged: run on the GPU with ``gc.Session(model, backend="ort-cuda")``."""
        return self

    def type(self, dst_type: Any) -> "Module":
        """torch's ``type(dst_type)``: every parameter and buffer cast to ``dst_type``, integer buffers
        (``num_batches_tracked``) too; a dtype that is not floating point is refused while the module
        has parameters (torch's: they need gradients), naming the first."""
        dt = as_dtype(dst_type)
        trained = next((name for name, _ in self._named_tensors(buffers=False)), None)
        if dt not in FLOAT_DTYPES and trained is not None:
            raise TypeError(f"Module.type({dt}): parameter {trained!r} must stay floating point (it "
                            f"is trained); only a module of buffers alone takes {dt}")
        return self._cast(dt, floats_only=False)

    def _cast(self, dt: DType, floats_only: bool) -> "Module":
        """Every parameter and buffer cast to ``dt``, only the floating point ones where ``floats_only``
        (``to``'s rule; ``type`` casts all); returns self."""
        for _, p in self._named_tensors():
            if p.dtype in FLOAT_DTYPES or not floats_only:
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
            return call_hooked(self, self.forward, args, kwargs)

    def register_forward_pre_hook(self, hook: Any, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` (``with_kwargs``: ``hook(module, args, kwargs)``) before each ``forward`` in a
        capture, as torch's; what it returns (not None) becomes the arguments. ``handle.remove()`` ends it."""
        return add_hook(self.__dict__.setdefault("_forward_pre_hooks", OrderedDict()), hook, prepend, with_kwargs)

    def register_forward_hook(self, hook: Any, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` (``with_kwargs``: ``hook(module, args, kwargs, output)``) after each
        ``forward`` in a capture, as torch's; what it returns (not None) becomes the output, so its ops are in
        the graph (torch's export keeps a hook's ops too). ``handle.remove()`` ends it."""
        return add_hook(self.__dict__.setdefault("_forward_hooks", OrderedDict()), hook, prepend, with_kwargs,
                        always_call)

    def register_full_backward_hook(self, hook: Any, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output)`` on the gradients of each call in a capture, as torch's:
        ``grad_input`` one per positional argument (None for one that is not a float Tensor), ``grad_output`` one
        per output Tensor; what it returns (not None) becomes ``grad_input`` (``graphc.nn.backward_hooks``)."""
        return add_hook(self.__dict__.setdefault("_backward_hooks", OrderedDict()), hook, prepend, False)

    def register_full_backward_pre_hook(self, hook: Any, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output)`` before the gradients pass through each call, as torch's; what it returns
        (not None) becomes ``grad_output``, which the module's parameters and inputs are differentiated by."""
        return add_hook(self.__dict__.setdefault("_backward_pre_hooks", OrderedDict()), hook, prepend, False)

    def register_backward_hook(self, hook: Any) -> RemovableHandle:
        raise deprecated_hook_refused()

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
        held = children(self.__dict__)  # a child set to None prints as (name): None, in its place
        if len(lines) == 1 and not held:
            return f"{self._get_name()}({lines[0]})"
        return repr_block(self._get_name(), lines + [f"({name}): {mod!r}" for name, mod in held.items()])


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
