"""Containers with ``torch.nn``'s names, indexing and state_dict keys: ``Sequential``,
``ModuleList``, ``ModuleDict``, ``ParameterList``; and ``Identity``.

Entries register as sub-modules (or parameters) named ``"0"``, ``"1"``, ... or by their keys, so
``layers.0.weight`` is the key PyTorch uses for the same tree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from graphc.errors import GraphError
from graphc.nn.module import Module, Parameter


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
            raise GraphError(f"{type(self).__name__} holds Modules, got {type(module).__name__}")
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


class ModuleDict(Module):
    """Sub-modules by name (insertion order), with ``dict``'s methods."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, m in (modules.items() if isinstance(modules, Mapping) else modules):
            self.add_module(str(key), m)


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


class Identity(Module):
    """Returns its input; constructor arguments are accepted and ignored, as in PyTorch."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


__all__ = ["Identity", "ModuleDict", "ModuleList", "ParameterList", "Sequential"]
