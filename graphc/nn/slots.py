"""What ``Module.__setattr__`` does to a name already registered, as ``torch.nn.Module``'s: a tensor onto a
buffer replaces it in its place and persistence, and None empties a parameter's, buffer's or child module's
slot without unregistering it (torch's ``_buffers[name] = None``): the name reads None, is left out of
``state_dict()`` and the traversals, and what is assigned there later registers as that kind again, in the
same place (a buffer with the same persistence), while the wrong kind is torch's ``TypeError``. Also the names
``register_buffer``/``register_parameter``/``add_module`` refuse (``check_name``) and the children ``repr`` prints,
None ones included (``children``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import active, user_source
from graphc.dsl.inplace import write
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.parameter import Parameter

EXPECTED = {"parameter": "gc.nn.Parameter", "buffer": "a gc Tensor, numpy array, torch tensor",
            "child module": "gc.nn.Module"}  # what each kind of registered name takes, besides None


class Slot(NamedTuple):
    """A registered name set to None: its ``kind`` (a key of ``EXPECTED``), a buffer's persistence and dtype
    (None: ``register_buffer``'s rule), and the names after it in its registry then (where it goes back)."""

    kind: str
    persistent: bool = True
    dtype: Any = None
    followers: tuple[str, ...] = ()


def registered(d: dict, name: str) -> tuple[str | None, Any]:
    """In a Module's ``__dict__`` ``d``: ``name``'s kind (a key of ``EXPECTED``; None: not registered) and
    what holds it, its Parameter, Module or ``Slot``."""
    if name in d["_parameters"]:
        held = d["_parameters"][name]
        return ("buffer" if held.buffer else "parameter"), held
    if name in d["_modules"]:
        return "child module", d["_modules"][name]
    slot = d["_slots"].get(name)
    return (None if slot is None else slot.kind), slot


def register(d: dict, registry: str, name: str, value: Any, kind: str) -> None:
    """``d[registry][name] = value``, a ``kind``: in the place of what it replaces, or of its slot, when that
    is of the same kind, as torch's; else last. Whatever else held ``name`` is dropped."""
    held_kind, held = registered(d, name)
    if held_kind == kind and not isinstance(held, Slot):
        d[registry][name] = value
        return
    unregister(d, name)
    put_back(d[registry], name, value, held.followers if held_kind == kind else ())


def empty(d: dict, name: str, kind: str, persistent: bool | None = None) -> None:
    """``name`` set to None: a slot of ``kind`` in the place of what its registry holds there, else of the
    slot of that kind already there; ``persistent`` (not None) sets a buffer's, as ``register_buffer(name,
    None, persistent)``. Whatever else held ``name`` is dropped."""
    store = d["_modules"] if kind == "child module" else d["_parameters"]
    held, old = store.get(name), d["_slots"].get(name)
    if held is not None:
        keys = list(store)
        slot = Slot(kind, getattr(held, "persistent", True), getattr(held, "dtype", None),
                    tuple(keys[keys.index(name) + 1:]))
    else:
        slot = old if old is not None and old.kind == kind else Slot(kind)
    unregister(d, name)
    d["_slots"][name] = slot if persistent is None else slot._replace(persistent=persistent)


def unregister(d: dict, name: str) -> None:
    """``name`` held by nothing: no parameter, buffer, module, slot or plain attribute (a plain
    ``self.bias = None`` would hide a Parameter assigned later)."""
    for registry in ("_parameters", "_modules", "_slots"):
        d[registry].pop(name, None)
    d.pop(name, None)


def put_back(store: dict, name: str, value: Any, followers: tuple[str, ...]) -> None:
    """``store[name] = value`` in the place its slot held: before the first of ``followers`` still in
    ``store``, else last (torch's dict kept the None entry there)."""
    at = next((key for key in store if key in followers), None)
    entries = list(store.items())
    store.clear()
    for key, held in entries:
        if key == at:
            store[name] = value
        store[key] = held
    store.setdefault(name, value)


def check_name(owner: Any, name: Any, kind: str) -> None:
    """torch's refusals of ``name`` for ``register_buffer``/``register_parameter``/``add_module`` (a ``kind``): not a
    str, holding ".", empty, or already naming something other than that kind (another kind's registered name, its
    slot, a plain or class attribute, a computed weight): ``KeyError: "attribute 'x' already exists"``."""
    word = "module" if kind == "child module" else kind
    if not isinstance(name, str):
        raise TypeError(f"{word} name should be a string. Got {type(name).__name__}")
    if "." in name:
        raise KeyError(f'{word} name can\'t contain "."' + (f", got: {name}" if word == "module" else ""))
    if name == "":
        raise KeyError(f'{word} name can\'t be empty string ""')
    d = owner.__dict__
    held_kind, _ = registered(d, name)
    if held_kind != kind and (held_kind is not None or name in d or name in d.get("_computed", {})
                              or hasattr(type(owner), name)):
        raise KeyError(f"attribute '{name}' already exists")


def children(d: dict) -> dict[str, Any]:
    """A Module's ``__dict__`` ``d``: its child modules by name, each emptied one's slot as None in its place, as
    torch's ``_modules`` holds them (its ``repr`` prints ``(name): None``)."""
    out = dict(d["_modules"])
    for name, slot in d["_slots"].items():
        if slot.kind == "child module":
            put_back(out, name, None, slot.followers)
    return out


def wrong_kind(owner: Any, name: str, kind: str, value: Any) -> TypeError:
    """torch's refusal of ``value`` onto the registered ``name``, a ``kind``."""
    return TypeError(f"cannot assign {type(value).__name__!r} as {kind} {name!r} of {type(owner).__name__} "
                     f"({EXPECTED[kind]} or None expected)")


def set_buffer(owner: Any, name: str, held: Parameter | Slot, value: Any) -> None:
    """``owner.<name> = value`` onto a buffer (``held``) or a buffer's slot: the buffer is now ``value`` (a gc
    Tensor, numpy array or torch tensor), in its place and persistence; in a capture, a write into the buffer
    held. A float64 array onto a float64 buffer stays float64, else ``register_buffer``'s dtype rule."""
    if not is_tensor(value):
        raise wrong_kind(owner, name, "buffer", value)
    if active() is not None and isinstance(held, Parameter):
        target = getattr(owner, name)
        if isinstance(value, Tensor) and value.dtype != target.dtype:  # torch would rebind; a capture's state keeps it
            raise CaptureError(f"buffer {name}: the result's dtype {value.dtype} is not the written tensor's "
                               f"{target.dtype} (at {user_source()}); a buffer keeps its dtype in a capture: "
                               f"cast the value, .to({target.dtype!r})")
        write(target, value if isinstance(value, Tensor) else np.asarray(value))
        return
    keep64 = held.dtype == "float64" and not isinstance(value, Tensor) and np.asarray(value).dtype == np.float64
    buffer = Parameter(value, dtype="float64" if keep64 else None, buffer=True)
    buffer.persistent = held.persistent
    buffer.qualname = getattr(held, "qualname", None)
    register(owner.__dict__, "_parameters", name, buffer, "buffer")


def is_tensor(arg: Any) -> bool:
    """A gc Tensor, numpy array or torch tensor: ``Module.to(tensor)`` takes its dtype."""
    return isinstance(arg, (Tensor, np.ndarray)) or (
        type(arg).__module__.split(".")[0] == "torch" and hasattr(arg, "dtype") and hasattr(arg, "shape"))
