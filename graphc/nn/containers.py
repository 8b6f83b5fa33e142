"""Containers with ``torch.nn``'s names, indexing and state_dict keys: ``Sequential``,
``ModuleList``, ``ModuleDict``, ``ParameterList``, ``ParameterDict``; and ``Identity``.

Entries register as sub-modules (or parameters) named ``"0"``, ``"1"``, ... or by their keys, so
``layers.0.weight`` is the key PyTorch uses for the same tree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from graphc.dsl.methods_torch import TYPE_NAMES
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter
from graphc.nn.reprs import repr_block


def _index(i: int, n: int, kind: str) -> int:
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for a {kind} of length {n}")
    return i % n


class _ModuleSequence(Module):
    """Sub-modules registered as ``"0"``, ``"1"``, ...: indexing, slicing, ``len``, iteration."""

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, i: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(i, slice):
            return type(self)(items[i])
        return items[_index(i, len(items), type(self).__name__)]

    def __setitem__(self, i: int, module: Module) -> None:
        self.add_module(str(_index(i, len(self), type(self).__name__)), module)

    def __delitem__(self, i: int) -> None:
        items = list(self._modules.values())
        del items[_index(i, len(items), type(self).__name__)]
        self._modules.clear()
        self.extend(items)

    def __iadd__(self, modules: Iterable[Module]) -> "_ModuleSequence":
        return self.extend(modules)

    def append(self, module: Module) -> "_ModuleSequence":
        if not isinstance(module, Module):
            raise CaptureError(f"{type(self).__name__} holds Modules, got {type(module).__name__}")
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "_ModuleSequence":
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        self.extend(items)


class ModuleList(_ModuleSequence):
    """A list of sub-modules (``forward`` is yours to write)."""

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        self.extend(modules or ())

    def __repr__(self) -> str:
        """torch's: a run of entries that print alike is one line, ``(0-5): 6 x Linear(...)``."""
        runs: list[list] = []  # [first index, last index, text]
        for i, text in enumerate(map(repr, self)):
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        return repr_block(self._get_name(), [f"({a}): {t}" if a == b else f"({a}-{b}): {b - a + 1} x {t}"
                                             for a, b, t in runs])


class Sequential(_ModuleSequence):
    """Sub-modules applied in order: ``Sequential(a, b, c)`` (named ``"0"``, ``"1"``, ...) or
    ``Sequential(OrderedDict(name=module, ...))``; indexing, slicing, ``len`` and iteration as
    ``ModuleList``."""

    def __init__(self, *modules: Any):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            self.extend(modules)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        return super().__getitem__(i)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x


class _Dict(Module):
    """Entries by key, in insertion order, with ``dict``'s methods; ``_store`` names the
    registry they live in (``_modules`` or ``_parameters``); a key set again keeps its place."""

    _store = "_modules"

    def _entries(self) -> dict:
        return self.__dict__[self._store]

    def _entry(self, value: Any) -> Any:
        return value

    def __len__(self) -> int:
        return len(self._entries())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries()))

    def __contains__(self, key: str) -> bool:
        return key in self._entries()

    def __getitem__(self, key: str) -> Any:
        if key not in self._entries():
            raise KeyError(key)
        return Module.__getattr__(self, key)  # a parameter is its Tensor inside capture

    def __setitem__(self, key: str, value: Any) -> None:
        value = self._entry(value)
        if key in self._entries():
            self._entries()[key] = value
        else:
            self.__setattr__(key, value)

    def __delitem__(self, key: str) -> None:
        del self._entries()[key]

    def keys(self):
        return self._entries().keys()

    def values(self) -> list[Any]:
        return [self[k] for k in self]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def pop(self, key: str) -> Any:
        value = self[key]
        del self[key]
        return value

    def clear(self) -> None:
        self._entries().clear()

    def _pairs(self, entries: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[Any, Any]]:
        return entries.items() if isinstance(entries, Mapping) else entries

    def update(self, entries: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        for key, value in self._pairs(entries):
            self[str(key)] = value


class ModuleDict(_Dict):
    """Sub-modules by name (insertion order), with ``dict``'s methods."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)


class ParameterDict(_Dict):
    """Parameters by name, with ``dict``'s methods, as ``torch.nn.ParameterDict``: arrays are
    wrapped in ``Parameter``s; ``pdict[key]`` inside capture is the Tensor, and the initializer is
    named ``<path>.<key>`` as PyTorch's ``state_dict`` key. A plain ``dict`` given to ``update``
    (or the constructor) is taken in sorted key order, as torch does; an ``OrderedDict``, a
    ``ParameterDict`` or pairs in their own order."""

    _store = "_parameters"

    def __init__(self, parameters: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def _entry(self, value: Any) -> Parameter:
        return value if isinstance(value, Parameter) else Parameter(value)

    def _pairs(self, entries: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[Any, Any]]:
        if isinstance(entries, Mapping) and not isinstance(entries, (OrderedDict, ParameterDict)):
            return sorted(entries.items())
        return super()._pairs(entries)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def extra_repr(self) -> str:
        return _entries_repr(self._parameters, lambda dtype: f"torch.{TYPE_NAMES.get(dtype, dtype + 'Tensor')}")


class ParameterList(Module):
    """Parameters registered as ``"0"``, ``"1"``, ...; ``plist[i]`` inside capture is the Tensor."""

    def __init__(self, values: Iterable[Any] | None = None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def __len__(self) -> int:
        return len(self._parameters)

    def __getitem__(self, i: int) -> Any:
        return getattr(self, str(_index(i, len(self), "ParameterList")))

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def append(self, value: Any) -> "ParameterList":
        self.register_parameter(str(len(self)), value if isinstance(value, Parameter) else Parameter(value))
        return self

    def extend(self, values: Iterable[Any]) -> "ParameterList":
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return _entries_repr(self._parameters, lambda dtype: f"torch.{dtype}")


# torch's legacy tensor type names, which ParameterDict's repr shows (torch.FloatTensor)

def _entries_repr(params: Mapping[str, Parameter], type_name: Any) -> str:
    """torch's lines for a ParameterList's or ParameterDict's entries: ``  (key): Parameter containing:
    [torch.float32 of size 2x3]``, the type as ``type_name(dtype)`` gives it."""
    return "\n".join(f"  ({key}): Parameter containing: [{type_name(p.dtype)} of size {'x'.join(map(str, p.shape))}]"
                     for key, p in params.items())


class Identity(Module):
    """Returns its input; constructor arguments are accepted and ignored, as in PyTorch."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


__all__ = ["Identity", "ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]
