"""``gc.autocast``: torch.autocast's mixed precision in the captured graph. Inside the block, each op
of ``autocast_policy.POLICY`` casts its floating Tensor arguments as the table says for the device
type (Cast nodes in the graph, so gradients flow back through them to float32 params), and runs
with autocast off inside, as torch's autocast kernels do. Mixed float dtypes meet in elementwise
ops then, which promote as torch's do (``promoted``). Outside any block nothing changes: the
wrappers only read the empty stack of states.

The state is per thread and per asyncio task (a ``ContextVar``), one per device type as torch's:
a ``"cuda"`` block inside a ``"cpu"`` block leaves the CPU state as it was. A capture has no
device, so the ops follow the device type of the innermost block whose device type is on
(``_active``): ``cuda`` inside ``cpu`` captures the CUDA policy, ``cuda(enabled=False)`` inside
``cpu`` the CPU one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

from graphc.dsl import autocast_policy as policy
from graphc.dsl.builder import Builder, current
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import NARROW, narrowed
from graphc.model.dtypes import as_dtype, to_onnx

F = TypeVar("F", bound=Callable[..., Any])
CASTABLE = NARROW | {"float32"}  # float64 is never cast (torch's autocast leaves it alone)


class _State(NamedTuple):
    device: str
    dtype: str
    enabled: bool


# the blocks open in this thread / asyncio task, the innermost last
_STATES: contextvars.ContextVar[tuple[_State, ...]] = contextvars.ContextVar("graphc_autocast", default=())
# Builder -> {(scope id, grad mode, id(value), dtype): (value, its Cast)}: one Cast per value and dtype
_CASTS: "weakref.WeakKeyDictionary[Builder, dict]" = weakref.WeakKeyDictionary()


def _dtype_name(dtype: Any) -> str:
    """A dtype given as graphc's, numpy's or torch's (``torch.bfloat16``) as graphc's name."""
    try:
        return str(as_dtype(dtype))
    except TypeError as exc:
        raise ValueError(f"gc.autocast: dtype {dtype!r} is not a dtype ({exc})") from None


def _device(fn: str, device_type: Any) -> None:
    if device_type not in policy.DEVICES:
        raise ValueError(f"gc.{fn}: device_type must be one of {', '.join(policy.DEVICES)}, got {device_type!r}")


class autocast:
    """``torch.autocast(device_type, dtype=None, enabled=True)``: a ``with`` block (or a decorator)
    in which the ops of ``autocast_policy.POLICY`` run in the dtype torch's autocast picks for
    ``device_type`` ("cpu": bfloat16 by default, or float16; "cuda": float16 by default, or
    bfloat16). Blocks nest; the innermost applies, ``enabled=False`` turns it off inside."""

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True):
        _device("autocast", device_type)
        if not isinstance(enabled, bool):
            raise ValueError(f"gc.autocast: enabled must be a bool, got {type(enabled).__name__} {enabled!r}")
        default, allowed = policy.DTYPES[device_type]
        name = default if dtype is None else _dtype_name(dtype)
        if name not in allowed:
            raise ValueError(f"gc.autocast: {device_type.upper()} autocast supports the dtypes "
                             f"{', '.join(allowed)}; got {name}")
        self.state = _State(device_type, name, enabled)

    def __enter__(self) -> None:
        _STATES.set((*_STATES.get(), self.state))

    def __exit__(self, *exc: object) -> None:
        _STATES.set(_STATES.get()[:-1])  # no token kept: one instance may be open in many threads

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _current(states: tuple[_State, ...], device: str) -> _State | None:
    """``device``'s state: its innermost block's (None outside any block of it)."""
    return next((s for s in reversed(states) if s.device == device), None)


def _active() -> _State | None:
    """The state the ops follow: the innermost block whose device type is on now (a later block of
    another device type does not turn it off), None where none is."""
    seen: set[str] = set()  # device types whose state is already read
    for state in reversed(_STATES.get()):
        if state.device not in seen:
            if state.enabled:
                return state
            seen.add(state.device)
    return None


@contextlib.contextmanager
def _off() -> Iterator[None]:
    """Autocast off for the block: the ops an autocast op is made of run on what it gives them."""
    token = _STATES.set(())
    try:
        yield
    finally:
        _STATES.reset(token)


def cast(t: Tensor, dtype: str) -> Tensor:
    """``t`` as ``dtype``: one Cast node per value and dtype in a capture (torch caches its casts too),
    per graph scope and grad mode (a Cast in a ``gc.no_grad`` block reads a detached copy)."""
    if t.dtype == dtype:
        return t
    builder = current()
    cache = _CASTS.setdefault(builder, {})
    key = (builder.scope.id, builder.gradients_enabled, id(t.value), dtype)
    if key not in cache:
        (value,) = builder.emit("Cast", [t.value], {"to": to_onnx(dtype)}, operands=[t])
        cache[key] = (t.value, Tensor(value, builder.eager_value(value)))  # keeps t.value (its id) alive
    return cache[key][1]


def _floats(args: Any) -> Iterator[Tensor]:
    """The castable float Tensors in ``args`` (lists and tuples of Tensors included)."""
    for a in args:
        if isinstance(a, Tensor) and a.dtype in CASTABLE:
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _floats(a)


def _cast_all(a: Any, dtype: str) -> Any:
    if isinstance(a, Tensor):
        return cast(a, dtype) if a.dtype in CASTABLE else a
    if isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a):
        return type(a)(_cast_all(x, dtype) for x in a)
    return a


def widest(dtypes: set[str]) -> str:
    """torch's promotion among float dtypes: float64 > float32 > float16, bfloat16 (the two: float32)."""
    for wide in ("float64", "float32"):
        if wide in dtypes:
            return wide
    return dtypes.pop() if len(dtypes) == 1 else "float32"


def _target(kind: str, state: _State, args: tuple, kwargs: dict) -> str | None:
    """The dtype ``kind`` casts the float arguments to, None where nothing is cast."""
    found = {t.dtype for t in _floats((*args, *kwargs.values()))}
    if not found:
        return None
    if kind == policy.LOWER:
        return state.dtype
    if kind == policy.PROMOTE:
        return widest(found) if len(found) > 1 else None
    if kind == policy.GIVEN:
        return None
    return "float32"  # FP32; MIXED, whose result goes back to its input's narrow dtype


def autocast_op(name: str | None = None, *, named: Callable[[dict[str, Any]], str | None] | None = None
                ) -> Callable[[F], F]:
    """Decorator: the function runs under ``POLICY[name]`` (default: its own name) inside
    ``gc.autocast``, with autocast off inside it; outside, as written. ``named`` instead gives the
    op from the call's arguments (by parameter name, defaults filled) for a function that is several
    of torch's ops (``gc.pad``: ``reflection_pad2d``, ...); None or an op not in ``POLICY``: as written."""

    def wrap(fn: F) -> F:
        op = name or fn.__name__
        if named is None and op not in policy.POLICY:
            raise KeyError(f"autocast_op: {op!r} is not in autocast_policy.POLICY")
        signature = inspect.signature(fn) if named is not None else None

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = _active()
            if state is None:
                return fn(*args, **kwargs)
            kind = _kind(op if signature is None else _named(signature, named, args, kwargs), state.device)
            if kind is None:
                return fn(*args, **kwargs)
            first = next(_floats((*args, *kwargs.values())), None)
            back = first.dtype if kind == policy.MIXED and first is not None and first.dtype in NARROW else None
            dtype = _target(kind, state, args, kwargs)
            if kind == policy.MIXED and back is None:
                dtype = None  # a float32 input: the norm runs as written
            with _off():
                if dtype is not None:
                    args = tuple(_cast_all(a, dtype) for a in args)
                    kwargs = {k: _cast_all(v, dtype) for k, v in kwargs.items()}
                out = fn(*args, **kwargs)
            return out if back is None else narrowed(out, back)

        wrapper.autocast_op = op  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return wrap


def cast_as(op: str, *tensors: Any) -> tuple[Any, ...]:
    """``tensors`` cast as ``POLICY[op]`` casts its arguments under the active block (as given outside
    one): for an op that torch's kernel builds from listed ones (the CPU's ``einsum`` from ``bmm``)."""
    state = _active()
    kind = None if state is None else _kind(op, state.device)
    dtype = None if kind is None else _target(kind, state, tensors, {})
    return tensors if dtype is None else tuple(_cast_all(t, dtype) for t in tensors)


def _named(signature: inspect.Signature, named: Callable, args: tuple, kwargs: dict) -> str | None:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the function itself reports the bad call
    bound.apply_defaults()
    return named(bound.arguments)


def _kind(op: str | None, device: str) -> str | None:
    return policy.kind(op, device) if op in policy.POLICY else None


def promoted(a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` in one float dtype where autocast is on and both are float Tensors of two
    dtypes (torch's elementwise promotion, which autocast's mixed dtypes rely on); else as given."""
    if not (_STATES.get() and _active() and isinstance(a, Tensor) and isinstance(b, Tensor)) or a.dtype == b.dtype:
        return a, b
    dtypes = {a.dtype, b.dtype}
    if not dtypes <= CASTABLE | {"float64"}:
        return a, b
    dtype = widest(dtypes)
    return cast(a, dtype), cast(b, dtype)


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """``torch.is_autocast_enabled(device_type)``: whether ``device_type``'s autocast is on in this
    thread / task; without one, whether the ops captured now follow any autocast policy."""
    if device_type is None:
        return _active() is not None
    _device("is_autocast_enabled", device_type)
    state = _current(_STATES.get(), device_type)
    return state is not None and state.enabled


__all__ = ["autocast", "autocast_op", "cast", "cast_as", "is_autocast_enabled", "promoted", "widest"]
