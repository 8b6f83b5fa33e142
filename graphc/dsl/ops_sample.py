"""torch's sampling functions, drawn anew on each run: ``rand``, ``randn``, ``randint``, their
``_like`` forms, ``randperm``, ``normal``, ``bernoulli``, ``multinomial``, and the Tensor methods
that refill a tensor in place (``uniform_``, ``normal_``, ``exponential_``, ...).

Every draw is one ``RandomUniform``/``RandomNormal`` node (its ``Like`` form on a
``ConstantOfShape`` where the size has dim names), or ``Multinomial``, with a ``seed`` attribute
from ``ops_random.node_seed``; the other distributions are transforms of it. float16/bfloat16 are
drawn as float32 and cast (onnxruntime has float32 and float64 kernels only). Nothing is
differentiable: as torch's ``normal(mean, std)`` and ``bernoulli(p)``, whose gradients are zero,
the results are detached."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.devices import factory
from graphc.dsl.dim_sizes import sized
from graphc.dsl.inplace import into
from graphc.dsl.ops import cast, const_i64, constant, detach, emit, lift, log, maximum, minimum, scalar
from graphc.dsl.ops_array import ir_tensor
from graphc.dsl.ops_math import ceil, floor
from graphc.dsl.ops_random import node_seed
from graphc.dsl.ops_reshape import broadcast_tensors, squeeze, unsqueeze
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import COMPLEX_PARTS, FLOAT_DTYPES, as_dtype, finfo

_DRAWN = ("float32", "float64")  # the dtypes RandomUniform/RandomNormal run in on both backends
_EXACT_INTS = 2 ** 53  # randint's widest range: a float64 uniform's resolution


def _fail(fn: str, operands: list, msg: str) -> CaptureError:
    return op_error(fn, operands, msg, user_source())


def _float_dtype(fn: str, dtype: Any) -> Any:
    dt = as_dtype(dtype)
    if dt not in FLOAT_DTYPES:
        why = "graphc draws complex samples in rand, randn and their _like forms only" if dt in COMPLEX_PARTS \
            else "torch refuses it too"
        raise _fail(fn, [], f"dtype must be a floating point type, got {dt} ({why})")
    return dt


def _shape_of(x: Tensor) -> tuple[list, Tensor | None]:
    """``x``'s shape as ``_sizes`` gives one: with ``x``'s Shape where a dim is not static."""
    if x.shape is None:
        raise _fail("random", [x], "needs the input's rank")
    static = all(isinstance(d, int) for d in x.shape)
    return list(x.shape), None if static else emit("Shape", [x])


def _draw(kind: str, shape: list, shape_t: Tensor | None, dtype: Any, **attrs: float) -> Tensor:
    """``kind`` ("RandomUniform" or "RandomNormal", ``attrs`` its low/high or mean/scale) noise of
    ``shape`` in float ``dtype``. Signature: ai.onnx@1::RandomUniform"""
    dtype = as_dtype(dtype)
    drawn = dtype if dtype in _DRAWN else as_dtype("float32")
    attrs = {k: float(v) for k, v in attrs.items()} | {"dtype": drawn.onnx, "seed": node_seed()}
    if shape_t is None:
        noise = emit(kind, [], attrs | {"shape": shape})
    else:
        zeros = emit("ConstantOfShape", [shape_t], {"value": ir_tensor(np.zeros(1, np.float32))},
                     out_types=[("float32", shape)])
        noise = emit(f"{kind}Like", [zeros], attrs, out_types=[(drawn, shape)])
    return noise if drawn == dtype else cast(noise, dtype)


def _exponential(shape: list, shape_t: Tensor | None, dtype: Any) -> Tensor:
    """Exp(1) noise: ``-log(u)``, ``u`` uniform on [tiny, 1), so it is finite."""
    tiny = float(np.finfo(np.float32).tiny)
    return -log(_draw("RandomUniform", shape, shape_t, dtype, low=tiny, high=1.0))


def _integers(fn: str, low: int, high: int, shape: list, shape_t: Tensor | None, dtype: Any) -> Tensor:
    """Uniform integers in [low, high) as ``dtype``: ``low + floor(u (high - low))`` in float64."""
    if not high > low:
        raise _fail(fn, [], f"expects low < high, got low={low}, high={high}")
    if high - low > _EXACT_INTS:
        raise _fail(fn, [], f"range [{low}, {high}) has more than 2**53 values, more than a float64 draw resolves")
    u = _draw("RandomUniform", shape, shape_t, "float64")
    k = minimum(floor(u * float(high - low)), float(high - low - 1))  # u * n rounds up to n at worst
    return cast(k + float(low), dtype)


# -- torch's factories -------------------------------------------------------------------------


@factory
def rand(*size: Any, dtype: Any = None) -> Tensor:
    """Uniform on [0, 1), float32 unless ``dtype``. ``size``: ints or input dim names (``x.shape[0]``)."""
    return _draw("RandomUniform", *sized(size, "rand"), _float_dtype("rand", dtype or "float32"))


@factory
def randn(*size: Any, dtype: Any = None) -> Tensor:
    """Standard normal, float32 unless ``dtype``. Signature: ai.onnx@1::RandomNormal"""
    return _draw("RandomNormal", *sized(size, "randn"), _float_dtype("randn", dtype or "float32"))


def _low_high(low: Any, high: Any) -> tuple[int, int]:
    """torch's ``(high)`` or ``(low, high)``."""
    return (0, int(low)) if high is None else (int(low), int(high))


@factory
def randint(low: Any = 0, high: Any = None, size: Any = None, *, dtype: Any = None) -> Tensor:
    """Integers uniform on [low, high): ``randint(high, size)`` or ``randint(low, high, size)``; int64 unless
    ``dtype``."""
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    if size is None:
        raise _fail("randint", [], "needs a size, e.g. randint(10, (3, 4))")
    dtype = as_dtype(dtype or "int64")
    if dtype == "bool":
        raise _fail("randint", [], "dtype bool is refused, as torch does")
    return _integers("randint", *_low_high(low, high), *sized((size,), "randint"), dtype)


@factory
def rand_like(input: Tensor, *, dtype: Any = None) -> Tensor:  # noqa: A002 - torch's name
    """``rand`` of ``input``'s shape (symbolic dims too) and dtype."""
    x = lift(input)
    return _draw("RandomUniform", *_shape_of(x), _float_dtype("rand_like", dtype or x.dtype))


@factory
def randn_like(input: Tensor, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """``randn`` of ``input``'s shape and dtype."""
    x = lift(input)
    return _draw("RandomNormal", *_shape_of(x), _float_dtype("randn_like", dtype or x.dtype))


@factory
def randint_like(input: Tensor, low: Any = 0, high: Any = None, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """``randint`` of ``input``'s shape, in ``input``'s dtype (as torch: a float input gives floats)."""
    x = lift(input)
    return _integers("randint_like", *_low_high(low, high), *_shape_of(x), as_dtype(dtype or x.dtype))


@factory
def randperm(n: Any, *, dtype: Any = None) -> Tensor:
    """A random permutation of ``0 .. n-1`` (``n`` an int or an input dim name): the order that sorts
    ``n`` float64 uniforms (TopK). Signature: ai.onnx@11::TopK"""
    shape, shape_t = sized((n,), "randperm")
    keys = _draw("RandomUniform", shape, shape_t, "float64")
    k = const_i64(shape) if shape_t is None else shape_t
    order = emit("TopK", [keys, k], {"axis": 0}, num_outputs=2)[1]
    return cast(order, dtype) if dtype is not None and as_dtype(dtype) != "int64" else order


@factory
def normal(mean: Any = 0.0, std: Any = 1.0, size: Any = None, *, dtype: Any = None) -> Tensor:
    """``mean + std * N(0, 1)``: of ``size`` for numbers, of the broadcast shape when ``mean`` or ``std``
    is a Tensor. No gradient reaches ``mean`` or ``std`` (torch's are zero)."""
    if not isinstance(mean, Tensor) and not isinstance(std, Tensor):
        if size is None:
            raise _fail("normal", [], "with a number mean and std needs a size, as torch")
        if not std >= 0:
            raise _fail("normal", [], f"expects std >= 0, got std={std}")
        return _draw("RandomNormal", *sized((size,), "normal"), _float_dtype("normal", dtype or "float32"),
                     mean=mean, scale=std)
    if size is not None:
        raise _fail("normal", [], "takes no size with a Tensor mean or std (the shape is theirs), as torch")
    like = mean if isinstance(mean, Tensor) else std
    _float_dtype("normal", like.dtype)
    if not isinstance(std, Tensor) and not std >= 0:
        raise _fail("normal", [like], f"expects std >= 0, got std={std}")
    mean, std = broadcast_tensors(detach(lift(mean, like)), detach(lift(std, like)))
    return mean + std * _draw("RandomNormal", *_shape_of(mean), mean.dtype)


def _probabilities(fn: str, x: Tensor, p: Any) -> Tensor:
    """``p`` (a number in [0, 1], or a Tensor or numpy array) in the dtype ``x``'s noise is drawn in."""
    if isinstance(p, np.ndarray):
        p = lift(p)
    if isinstance(p, Tensor):
        return cast(detach(p), "float64" if p.dtype == "float64" else "float32")
    if not 0 <= p <= 1:
        raise _fail(fn, [x], f"expects p in [0, 1], got p={p}")
    return constant(np.asarray(p, np.float32))


def bernoulli(input: Tensor, p: Any = None) -> Tensor:  # noqa: A002
    """1 with probability ``input`` (or ``p``), else 0, in ``input``'s dtype: ``u < p``, ``u`` uniform."""
    x = lift(input)
    if p is None and x.dtype not in FLOAT_DTYPES:
        raise _fail("bernoulli", [x], f"input must be floating point (the probabilities), got {x.dtype}")
    probs = _probabilities("bernoulli", x, x if p is None else p)
    u = _draw("RandomUniform", *_shape_of(x), probs.dtype)
    return cast(emit("Less", [u, probs]), x.dtype)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False) -> Tensor:  # noqa: A002
    """``num_samples`` category indices (int64) per row of the non-negative weights ``input`` ([C] or
    [B, C]). Without replacement: the ``num_samples`` largest ``w / e``, ``e ~ Exp(1)`` (Gumbel-top-k,
    in draw order); with: ONNX ``Multinomial`` on float32 ``log(w)``. Signature: ai.onnx@7::Multinomial"""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        raise _fail("multinomial", [x], f"input must be floating point (the weights), got {x.dtype}")
    if x.shape is None or x.ndim not in (1, 2):
        raise _fail("multinomial", [x], "input must be 1-D or 2-D (the weights of each row)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples <= 0:
        raise _fail("multinomial", [x], f"num_samples must be an int > 0, got {num_samples!r}")
    categories = x.shape[-1]
    if not replacement and isinstance(categories, int) and num_samples > categories:
        raise _fail("multinomial", [x], f"num_samples ({num_samples}) > the {categories} categories, without "
                                        "replacement")
    w = detach(x if x.dtype in _DRAWN else cast(x, "float32"))
    if not replacement:
        keys = w / _exponential(*_shape_of(w), w.dtype)
        return emit("TopK", [keys, const_i64([num_samples])], {"axis": -1}, num_outputs=2)[1]
    rows = w if w.ndim == 2 else unsqueeze(w, 0)
    logits = log(rows if rows.dtype == "float32" else cast(rows, "float32"))  # onnxruntime's kernel: float32
    drawn = emit("Multinomial", [logits], {"sample_size": int(num_samples), "dtype": as_dtype("int64").onnx,
                                              "seed": node_seed()})
    return drawn if w.ndim == 2 else squeeze(drawn, 0)


# -- Tensor methods that refill the tensor -----------------------------------------------------


def _refill(fn: str, x: Tensor, floats_only: bool = True) -> tuple[list, Tensor | None]:
    if floats_only and x.dtype not in FLOAT_DTYPES:
        raise _fail(fn, [x], f"needs a floating point tensor, got {x.dtype} (torch refuses it too)")
    return _shape_of(x)


def _positive(fn: str, x: Tensor, name: str, value: float) -> None:
    if not value > 0:
        raise _fail(fn, [x], f"expects {name} > 0, got {name}={value}")


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """``self`` refilled uniform on [a, b) (torch's ``from``, ``to``)."""
    if not a <= b:
        raise _fail("uniform_", [self], f"expects from <= to, got from={a}, to={b}")
    return into(self, _draw("RandomUniform", *_refill("uniform_", self), self.dtype, low=a, high=b), True)


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """``self`` refilled N(mean, std^2)."""
    if not std >= 0:
        raise _fail("normal_", [self], f"expects std >= 0, got std={std}")
    return into(self, _draw("RandomNormal", *_refill("normal_", self), self.dtype, mean=mean, scale=std), True)


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0) -> Tensor:
    """``self`` refilled ``exp(N(mean, std^2))``."""
    _positive("log_normal_", self, "std", std)
    z = _draw("RandomNormal", *_refill("log_normal_", self), self.dtype, mean=mean, scale=std)
    return into(self, emit("Exp", [z]), True)


def exponential_(self: Tensor, lambd: float = 1.0) -> Tensor:
    """``self`` refilled Exp(lambd): ``-log(u) / lambd``."""
    _positive("exponential_", self, "lambd", lambd)
    e = _exponential(*_refill("exponential_", self), self.dtype)
    return into(self, e / scalar(lambd, e), True)


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0) -> Tensor:
    """``self`` refilled Cauchy(median, sigma): ``median + sigma z1 / z2`` for standard normals."""
    _positive("cauchy_", self, "sigma", sigma)
    shape, shape_t = _refill("cauchy_", self)
    z1, z2 = (_draw("RandomNormal", shape, shape_t, self.dtype) for _ in range(2))
    return into(self, scalar(median, z1) + scalar(sigma, z1) * z1 / z2, True)


def geometric_(self: Tensor, p: float) -> Tensor:
    """``self`` refilled with the trial of the first success, on {1, 2, ...}: ``ceil(log(u) / log(1 - p))``
    (at least 1), in ``self``'s dtype (integers too, as torch)."""
    if not 0 < p < 1:
        raise _fail("geometric_", [self], f"expects p in (0, 1), got p={p}")
    shape, shape_t = _refill("geometric_", self, floats_only=False)
    e = _exponential(shape, shape_t, "float64")
    trials = maximum(ceil(e / float(-np.log1p(-p))), 1.0)
    return into(self, cast(trials, self.dtype), True)


def bernoulli_(self: Tensor, p: Any = 0.5) -> Tensor:
    """``self`` refilled with 1 at probability ``p`` (a number or a Tensor broadcast to ``self``), else 0."""
    probs = _probabilities("bernoulli_", self, p)
    u = _draw("RandomUniform", *_shape_of(self), probs.dtype)
    return into(self, cast(emit("Less", [u, probs]), self.dtype), True)


def _random_bound(x: Tensor) -> int:
    """torch's ``random_()`` range end (exclusive): 2**digits + 1 for floats, the type's max + 1 for integers."""
    if x.dtype in FLOAT_DTYPES:
        return 2 ** (finfo(x.dtype).nmant + 1) + 1
    return _int_range(x)[1] + 1


def _int_range(x: Tensor) -> tuple[int, int]:
    """The least and greatest value of ``x``'s integer (or bool) dtype."""
    return (0, 1) if x.dtype == "bool" else (int(np.iinfo(x.dtype.numpy).min), int(np.iinfo(x.dtype.numpy).max))


def random_(self: Tensor, *bounds: int) -> Tensor:
    """``self`` refilled with integers uniform on [from, to): ``random_()`` (torch's default range),
    ``random_(to)`` or ``random_(from, to)``."""
    if len(bounds) > 2:
        raise _fail("random_", [self], f"takes at most (from, to), got {len(bounds)} bounds")
    low, high = (0, _random_bound(self)) if not bounds else _low_high(*bounds) if len(bounds) == 2 \
        else (0, int(bounds[0]))
    if self.dtype not in FLOAT_DTYPES and not (_int_range(self)[0] <= low and high - 1 <= _int_range(self)[1]):
        raise _fail("random_", [self], f"[{low}, {high}) is out of {self.dtype}'s bounds")
    return into(self, _integers("random_", low, high, *_shape_of(self), self.dtype), True)


__all__ = ["bernoulli", "multinomial", "normal", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
           "randperm"]
