"""``Parameter.data``: torch's in-place init methods (``normal_``, ``fill_``, ``mul_``, ...) on a parameter's value.

torch draws a layer's values when it is built; graphc draws them when the module is initialised (``gc.capture``'s
``seed``, ``init_parameters(seed)``), in definition order, so a model is the same for the same seed. ``.data`` keeps
that: while a value is held it is that array (``ParamData``, an ndarray whose in-place methods write into it); before,
it is a ``PendingData`` that records the methods into the Parameter's initialiser (drawing a value early would need a
seed the capture has not given yet), so ``self.weight.data.normal_(0, 0.02)`` in ``__init__`` is drawn at capture.
Random fills (``normal_``, ``uniform_``, ``nn.init``'s) are always drawn then, as graphc's ``nn.init`` are; the
others act on a held value now. Both index as torch does: ``weight.data[padding_idx].zero_()`` sets that row.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from graphc.errors import CaptureError
from graphc.model.dtypes import to_numpy
from graphc.nn import draws


class Sized:
    """torch's ``dim()`` and ``numel()`` from ``shape`` (a Parameter's and its ``.data``'s)."""

    shape: Any

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)


class InPlace(Sized):
    """torch's in-place methods over three primitives: ``_assign`` (a new value), ``_transform`` (one computed
    from the old) and ``_redraw`` (a random fill, drawn when the module is initialised)."""

    _param: Any
    _index: tuple | None  # the region of the parameter's value, as the keys that index it; None: not known

    def _where(self, fn: str) -> str:
        name = getattr(self._param, "qualname", None) or f"Parameter{list(getattr(self._param, 'shape', ()))}"
        return f"{name}.data{''.join(f'[{k!r}]' for k in self._index or ())}.{fn}"

    def _operand(self, other: Any, fn: str) -> np.ndarray:
        value = np.asarray(other)
        try:
            fits = np.broadcast_shapes(value.shape, self.shape) == tuple(self.shape)
        except ValueError:
            fits = False
        if not fits:
            raise CaptureError(f"{self._where(fn)}: expected a value that broadcasts to {list(self.shape)}, "
                               f"got shape {list(value.shape)}")
        return value

    def copy_(self, src: Any, non_blocking: bool = False) -> Any:
        """The value becomes ``src`` (a number, array or eager ``gc.Tensor``), broadcast and cast."""
        return self._assign(self._operand(src, "copy_"))

    def fill_(self, value: Any) -> Any:
        return self._assign(self._operand(value, "fill_"))

    def zero_(self) -> Any:
        return self._assign(np.zeros((), self.dtype))

    def _arith(self, fn: str, op: Any, other: Any, alpha: Any = 1) -> Any:
        value = self._operand(other, fn) * alpha if alpha != 1 else self._operand(other, fn)
        return self._transform(lambda old: op(old, value))

    def add_(self, other: Any, *, alpha: Any = 1) -> Any:
        return self._arith("add_", operator.add, other, alpha)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Any:
        return self._arith("sub_", operator.sub, other, alpha)

    def mul_(self, other: Any) -> Any:
        return self._arith("mul_", operator.mul, other)

    def div_(self, other: Any) -> Any:
        return self._arith("div_", operator.truediv, other)

    def clamp_(self, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - torch's keywords
        if min is None and max is None:
            raise CaptureError(f"{self._where('clamp_')}: at least one of 'min' or 'max' must not be None")
        low = None if min is None else self._operand(min, "clamp_")
        high = None if max is None else self._operand(max, "clamp_")
        return self._transform(lambda old: np.clip(old, low, high))

    clip_ = clamp_

    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Any:
        """N(mean, std), drawn when the module is initialised (``gc.capture``'s seed)."""
        return self._redraw(self._random(draws.normal(mean, std), "normal_", generator))

    def uniform_(self, from_: float = 0.0, to: float = 1.0, *, generator: Any = None) -> Any:
        """U(from_, to), drawn when the module is initialised (``gc.capture``'s seed)."""
        return self._redraw(self._random(draws.between(from_, to), "uniform_", generator))

    def _random(self, draw: draws.Init, fn: str, generator: Any) -> draws.Init:
        if generator is not None:
            raise CaptureError(f"{self._where(fn)}: generator= is not taken; graphc draws from gc.capture's seed "
                               f"(or init_parameters(seed))")
        return draw


def data_of(param: Any, index: tuple = ()) -> Any:
    """The ``.data`` of ``param``'s region ``index``: its value while one is held, else a ``PendingData``."""
    if param._data is None:
        return PendingData(param, index)
    view = param._data.view(ParamData)
    view._param, view._index = param, ()
    return _region(view, index)


def _view(array: np.ndarray, key: Any) -> np.ndarray:
    """``array[key]``, a 0-d array rather than a scalar where ``key`` picks one entry (torch's 0-d tensor)."""
    keys = key if isinstance(key, tuple) else (key,)
    return array[keys if any(k is Ellipsis for k in keys) else (*keys, Ellipsis)]


def _is_view(sub: np.ndarray, whole: np.ndarray) -> bool:
    return sub.size == 0 or np.may_share_memory(sub, whole)


def _region(array: np.ndarray, index: tuple) -> np.ndarray:
    for key in index:
        array = _view(array, key)
    return array


def _remade(param: Any, index: tuple, write: Any) -> None:
    """Draw ``param`` from its initialiser (or its held value) and then ``write(region, rng)`` into ``index``."""
    held = param._data
    base = param.init if held is None else (lambda rng, shape, dtype: held)

    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        out = np.array(base(rng, shape, dtype), dtype=dtype)
        region = _region(out, index)
        region[...] = write(region, rng)
        return out

    param.reinit(draw)


def _redraw_region(param: Any, index: tuple, draw: draws.Init) -> None:
    """A random fill of ``param``'s region ``index``, drawn when the module is initialised: all of it (``()``)
    becomes ``draw``'s, a region is written into the value drawn from its initialiser."""
    if not index:
        param.reinit(draw)
    else:
        _remade(param, index, lambda region, rng: draw(rng, region.shape, region.dtype))


def _probe(shape: Any) -> np.ndarray:
    """A read-only int8 array of ``shape`` (no memory), to learn what indexing does to that shape."""
    return np.broadcast_to(np.zeros((), np.int8), shape)


class ParamData(np.ndarray, InPlace):
    """A held value (or a view of it, by basic indexing) with torch's in-place methods. Arithmetic on it gives
    plain arrays; a copy made by indexing with a list or array changes only itself, as torch's."""

    def __array_finalize__(self, obj: Any) -> None:
        self._param, self._index = getattr(obj, "_param", None), None

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        plain = array.view(np.ndarray)
        return plain[()] if return_scalar else plain

    def __getitem__(self, key: Any) -> Any:
        out = _view(self.view(np.ndarray), key).view(ParamData)
        shared = self._index is not None and _is_view(out, self)
        out._param, out._index = self._param, (*self._index, key) if shared else None
        return out

    def _owned(self) -> bool:
        return self._param is not None and self._param._data is not None and \
            np.may_share_memory(self, self._param._data)

    def _assign(self, value: np.ndarray) -> "ParamData":
        self[...] = value
        if self._owned():
            self._param.user_set = True
        return self

    def _transform(self, fn: Any) -> "ParamData":
        return self._assign(fn(np.asarray(self)))

    def _redraw(self, draw: draws.Init) -> Any:
        if not self._owned() or self._index is None:
            raise CaptureError(f"{self._where('a random fill')}: this array is a copy or a reshaped view of the "
                               f"parameter, not a region of it; fill the parameter or a slice of its .data")
        _redraw_region(self._param, self._index, draw)
        return data_of(self._param, self._index)

    def clone(self, *, memory_format: Any = None) -> np.ndarray:
        """A plain copy (``p.data = other.data.clone()``)."""
        return np.array(self, dtype=self.dtype)


class PendingData(InPlace):
    """``.data`` of a Parameter not drawn yet: its shape and dtype, indexing, and the in-place methods, which
    become part of its initialiser; reading values is an error that says how to draw them."""

    def __init__(self, param: Any, index: tuple = ()):
        self._param, self._index = param, index
        self.shape = tuple(_region(_probe(param.shape), index).shape)
        self.dtype = np.dtype(to_numpy(param.dtype))
        self.ndim = len(self.shape)

    def __getitem__(self, key: Any) -> "PendingData":
        whole = _probe(self.shape)
        if not _is_view(_view(whole, key), whole):
            raise CaptureError(f"{self._where('__getitem__')}: indexing with {key!r} makes a copy, so an in-place "
                               f"method on it would not reach the parameter (nor does it in torch); use slices")
        return PendingData(self._param, (*self._index, key))

    def _live(self) -> Any:
        return None if self._param._data is None else data_of(self._param, self._index)

    def _assign(self, value: np.ndarray) -> Any:
        live = self._live()
        if live is not None:
            return live._assign(value)
        if not self._index:
            self._param.data = np.broadcast_to(value, self.shape)
            return data_of(self._param)
        _remade(self._param, self._index, lambda region, rng: value)
        return self

    def _transform(self, fn: Any) -> Any:
        live = self._live()
        if live is not None:
            return live._transform(fn)
        _remade(self._param, self._index, lambda region, rng: fn(region.copy()))
        return self

    def _redraw(self, draw: draws.Init) -> Any:
        live = self._live()
        if live is not None:
            return live._redraw(draw)
        _redraw_region(self._param, self._index, draw)
        return self

    def _unread(self, what: str) -> CaptureError:
        return CaptureError(f"{self._where(what)}: the parameter has no values yet: graphc draws them when the "
                            f"module is initialised (gc.capture's seed), not when it is built; call "
                            f"module.init_parameters(seed) first to read them. Its shape, dtype, indexing and the "
                            f"in-place methods (normal_, fill_, mul_, ...) work before")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise self._unread("reading values")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._unread(name)

    def __repr__(self) -> str:
        return f"PendingData({self.dtype}{list(self.shape)}, drawn when the module is initialised)"
