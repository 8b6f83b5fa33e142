"""Complex values in the DSL (``gc.ComplexTensor``, held as real Tensors: ``graphc.dsl.tensor``): their
constructors (``gc.complex``, ``gc.polar``, ``gc.view_as_complex``, the factories' complex dtypes), the
arithmetic on the (real, imag) parts, reductions, indexing and writes through the ``view_as_real`` pair,
``einsum``/``matmul`` of complex operands, and the ``gc.*`` names that take either kind of Tensor.

Every op is real ops on the parts, so the gradients are the real ones: for a real loss, the (real, imag)
pair of torch's ``.grad`` of a complex leaf (its conjugate-Wirtinger convention)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import inplace, ops, ops_aliases, ops_array, ops_binary, ops_math, ops_torch_misc
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.tensor import ComplexTensor, Tensor, complex_refusal
from graphc.errors import CaptureError
from graphc.model.dtypes import COMPLEX_PARTS, as_dtype

_NUMBERS = (complex, np.complexfloating)  # complex scalars (``complex`` is torch's function below)
Part = Any  # a real Tensor, a Python number, or None for a zero imaginary part


# -- the two forms -----------------------------------------------------------------------------------------


def parts(z: ComplexTensor) -> tuple[Tensor, Tensor]:
    """``z``'s real and imaginary parts (real Tensors of its part dtype): those it was made of, until its pair
    (built from them: ``pair``) is written, by ``write`` or through a view."""
    if z._parts is not None and (z._pair is None or z._pair._ir is z._built):
        return z._parts
    z._parts = None
    return z._pair[..., 0], z._pair[..., 1]


def pair(z: ComplexTensor) -> Tensor:
    """``z`` as torch's ``view_as_real``: a real Tensor with a trailing dim of 2. Built from its parts in a
    control-flow body they were made outside, it is not kept (the body's values end with it) and counts as
    made where they were, so a write into it is refused as into any outer value (``inplace.outside_body``)."""
    if z._pair is not None:
        return z._pair
    built = ops.stack(list(z._parts), -1)
    if inplace.outside_body(z._parts[0]):
        built._scope = z._parts[0]._scope
    else:
        z._pair, z._built = built, built._ir
    return built


def of_parts(re: Part, im: Part) -> ComplexTensor:
    """The complex Tensor of two parts (``im`` None: zero), broadcast to one shape."""
    re = ops.lift(re, im if isinstance(im, Tensor) else None)
    im = ops_array.zeros_like(re) if im is None else ops.lift(im, re)
    if re.shape != im.shape:
        re, im = re + ops_array.zeros_like(im), im + ops_array.zeros_like(re)
    return ComplexTensor(parts=(re, im))


def is_complex_value(x: Any) -> bool:
    """Whether ``x`` is complex: a ComplexTensor, a Python or numpy complex number, a complex array."""
    return isinstance(x, (ComplexTensor, *_NUMBERS)) or \
        (isinstance(x, np.ndarray) and np.iscomplexobj(x))


def operand(x: Any) -> tuple[Part, Part]:
    """``x``'s (real, imaginary) parts, the imaginary one None where ``x`` is real."""
    if isinstance(x, ComplexTensor):
        return parts(x)
    if isinstance(x, _NUMBERS) or (isinstance(x, np.ndarray) and np.iscomplexobj(x)):
        return np.real(x), np.imag(x)
    if isinstance(x, Tensor) or isinstance(x, (bool, int, float, np.number, np.ndarray)):
        return x, None
    raise CaptureError(f"cannot use {type(x).__name__} {x!r} with a complex Tensor (at {user_source()})")


def as_complex(x: Any, like: Tensor) -> ComplexTensor:
    """``x`` (complex or real: a Tensor, number or array) as a complex Tensor, numbers of ``like``'s dtype."""
    re, im = operand(x)
    return of_parts(ops.lift(re, like), _lifted(im, like))


def _lifted(a: Part, like: Part) -> Part:
    """A numpy array or number operand as a Tensor of ``like``'s dtype, when ``like`` is one."""
    return ops.lift(a, like) if isinstance(a, np.ndarray) and isinstance(like, Tensor) else a


def _sum(a: Part, b: Part, sign: int = 1) -> Part:
    """``a + sign * b`` with None as zero."""
    if b is None:
        return a
    if a is None:
        return b if sign > 0 else -b
    return a + b if sign > 0 else a - b


def _prod(a: Part, b: Part) -> Part:
    return None if a is None or b is None else a * b


# -- arithmetic --------------------------------------------------------------------------------------------


def _binary(fn: Callable[[Part, Part, Part, Part], tuple[Part, Part]]) -> Callable[[Any, Any], ComplexTensor]:
    def op(a: Any, b: Any) -> ComplexTensor:
        (ar, ai), (br, bi) = operand(a), operand(b)
        like = next(p for p in (ar, br) if isinstance(p, Tensor))
        ar, ai, br, bi = (_lifted(p, like) for p in (ar, ai, br, bi))
        return of_parts(*fn(ar, ai, br, bi))
    return op


add = _binary(lambda ar, ai, br, bi: (ar + br, _sum(ai, bi)))
sub = _binary(lambda ar, ai, br, bi: (ar - br, _sum(ai, bi, -1)))
mul = _binary(lambda ar, ai, br, bi: (_sum(ar * br, _prod(ai, bi), -1), _sum(_prod(ar, bi), _prod(ai, br))))


def _div(ar: Part, ai: Part, br: Part, bi: Part) -> tuple[Part, Part]:
    """``a / b`` as torch's (Smith's): ``b``'s smaller part over its larger is ``r``, no square that overflows;
    by ``0`` it is ``(a.real / 0, a.imag / 0)``."""
    if bi is None:
        return ar / br, None if ai is None else ai / br
    like = next(p for p in (br, bi, ar) if isinstance(p, Tensor))  # ar where b is a complex number
    br, bi = ops.lift(br, like), ops.lift(bi, like)
    ar, ai = ops.lift(ar, like), ops.scalar(0.0, like) if ai is None else ops.lift(ai, like)
    by_real = ops.abs(br) >= ops.abs(bi)
    large, small = ops.where(by_real, br, bi), ops.where(by_real, bi, br)
    zero = large == ops.scalar(0.0, like)
    r = small / ops.where(zero, ops.scalar(1.0, like), large)
    scale = 1.0 / (large + small * r)
    s, t = ops.where(by_real, ar, ai), ops.where(by_real, ai, ar)
    im = (t - s * r) * scale
    nought = ops.where(zero, ops.scalar(0.0, like), ops.scalar(1.0, like))  # b's |parts| where 0, 1 elsewhere
    return (ops.where(zero, ar / nought, (s + t * r) * scale),
            ops.where(zero, ai / nought, ops.where(by_real, im, -im)))


div = _binary(_div)


def neg(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    return of_parts(-re, -im)


def real(z: ComplexTensor) -> Tensor:
    """``z.real``: a view of ``z``'s pair, as torch's, so a write into it writes ``z`` (``z.real.mul_(2)``)."""
    return pair(z)[..., 0]


def imag(z: ComplexTensor) -> Tensor:
    return pair(z)[..., 1]


def _part(index: int) -> property:
    """``z.real`` (``index`` 0) or ``z.imag`` (1); assigning one (``z.imag = v``, as ``z.imag += 1`` ends) writes
    ``v`` into it."""
    def set_(z: ComplexTensor, value: Any) -> None:
        inplace.setitem(pair(z), (..., index), value)
    return property(real if index == 0 else imag, set_)


def conj(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    return of_parts(re, -im)


def abs(z: ComplexTensor) -> Tensor:  # noqa: A001 - torch's name
    """``|z|``; at 0 its gradient is 0, as torch's (not sqrt's NaN)."""
    re, im = parts(z)
    squared = re * re + im * im
    zero = squared == ops.scalar(0.0, squared)
    return ops.where(zero, ops.scalar(0.0, squared), ops.sqrt(ops.where(zero, ops.scalar(1.0, squared), squared)))


def angle(z: ComplexTensor) -> Tensor:
    re, im = parts(z)
    return ops_binary.atan2(im, re)


def exp(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    scale = ops.exp(re)
    return of_parts(scale * ops_array.cos(im), scale * ops_array.sin(im))


def _reduce(reduce: Callable[..., Tensor]) -> Callable[..., ComplexTensor]:
    def op(z: ComplexTensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
           keepdim: bool | None = None, dtype: Any = None) -> ComplexTensor:
        if dtype is not None:
            raise CaptureError(f"{reduce.__name__} of a complex Tensor: dtype= is not supported (at {user_source()})")
        axis, keepdims = axis if dim is None else dim, keepdims if keepdim is None else keepdim
        re, im = parts(z)
        return of_parts(reduce(re, axis, keepdims), reduce(im, axis, keepdims))
    op.__name__ = reduce.__name__
    return op


sum = _reduce(ops.sum)  # noqa: A001 - torch's name
mean = _reduce(ops.mean)


def _products(fn: Callable[[Tensor, Tensor], Tensor], name: str, a: Any, b: Any) -> ComplexTensor:
    """``fn`` (bilinear: einsum, matmul) of two operands, either complex: four (or two) real products."""
    (ar, ai), (br, bi) = operand(a), operand(b)
    for part in (ar, br):
        if not isinstance(part, Tensor):
            raise CaptureError(f"{name} of a complex Tensor: expected Tensor operands, got {type(part).__name__} "
                               f"(at {user_source()})")
    apply = lambda x, y: None if x is None or y is None else fn(x, y)  # noqa: E731
    return of_parts(_sum(fn(ar, br), apply(ai, bi), -1), _sum(apply(ar, bi), apply(ai, br)))


def complex_matmul(a: Any, b: Any) -> ComplexTensor:
    return _products(ops.matmul, "matmul", a, b)


def complex_einsum(equation: str, *operands: Any) -> ComplexTensor:
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if len(operands) != 2:
        raise CaptureError(f"einsum of complex Tensors takes 2 operands, got {len(operands)}: write it as "
                           f"einsums of two (at {user_source()})")
    return _products(lambda x, y: ops_array.einsum(equation, x, y), "einsum", *operands)


# -- shapes, indexing and writes: through the view_as_real pair, so views and writes follow graphc's rules ----


def _pair_index(index: Any) -> Any:
    """An index of the complex shape as one of the pair's: ``...`` then stops short of the trailing dim."""
    items = index if isinstance(index, tuple) else (index,)
    return (*items, slice(None)) if any(i is Ellipsis for i in items) else index


def getitem(z: ComplexTensor, index: Any) -> ComplexTensor:
    return ComplexTensor(pair=pair(z)[_pair_index(index)])


def setitem(z: ComplexTensor, index: Any, value: Any) -> None:
    """``z[index] = value`` (complex or real), written into ``z``'s pair as graphc writes real Tensors
    (a bool mask over leading dims: ``inplace.masked_write``)."""
    target = pair(z)
    v = pair(as_complex(value, ops.lift(0.0, target)))
    if not inplace.masked_write(target, index, v):
        inplace.setitem(target, _pair_index(index), v)


def write(z: ComplexTensor, new: ComplexTensor) -> ComplexTensor:
    """``z`` rebound in place to ``new`` (its shape and dtype), through its views' bases as
    ``inplace.write`` writes real Tensors; returns ``z``."""
    inplace.write(pair(z), pair(new))
    return z


def _sizes(size: tuple) -> tuple:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size


def _rank(z: ComplexTensor) -> int:
    return z.ndim


def reshape(z: ComplexTensor, *shape: Any) -> ComplexTensor:
    return ComplexTensor(pair=ops.reshape(pair(z), (*_sizes(shape), 2)))


def permute(z: ComplexTensor, *dims: Any) -> ComplexTensor:
    n = _rank(z)
    return ComplexTensor(pair=ops.transpose(pair(z), [d % n for d in _sizes(dims)] + [n]))


def transpose(z: ComplexTensor, dim0: int, dim1: int) -> ComplexTensor:
    perm = list(range(_rank(z)))
    a, b = dim0 % len(perm), dim1 % len(perm)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(z, perm)


def unsqueeze(z: ComplexTensor, dim: int) -> ComplexTensor:
    return ComplexTensor(pair=ops.unsqueeze(pair(z), [dim % (_rank(z) + 1)]))


def detach(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    return ComplexTensor(parts=(ops.detach(re), ops.detach(im)))


# -- constructors ------------------------------------------------------------------------------------------


def _float_part(name: str, what: str, x: Any) -> Tensor:
    t = ops.lift(x)
    if t.dtype not in ("float32", "float64"):
        raise CaptureError(f"{name}: {what} must be float32 or float64 (torch's complex64/complex128 parts), "
                           f"got {t.dtype} (at {user_source()})")
    return t


def complex(real: Any, imag: Any) -> ComplexTensor:  # noqa: A001 - torch's name
    """``torch.complex``: ``real + i imag`` of two real Tensors of one float dtype."""
    re, im = _float_part("complex", "real", real), _float_part("complex", "imag", imag)
    _same_parts("complex", re, im)
    return of_parts(re, im)


def _same_parts(name: str, a: Tensor, b: Tensor) -> None:
    """Refuse two parts of different dtypes, as torch's ``name`` (it does not promote them)."""
    if a.dtype != b.dtype:
        raise CaptureError(f"{name}: both inputs must have the same dtype (torch does not promote them), got "
                           f"{a.dtype} and {b.dtype} (at {user_source()})")


@autocast_op()
def polar(abs: Any, angle: Any) -> ComplexTensor:  # noqa: A002 - torch's names
    """``torch.polar``: ``abs * (cos(angle) + i sin(angle))``."""
    r, theta = _float_part("polar", "abs", abs), _float_part("polar", "angle", angle)
    _same_parts("polar", r, theta)
    return of_parts(r * ops_array.cos(theta), r * ops_array.sin(theta))


def view_as_real(input: Any) -> Tensor:  # noqa: A002
    """``torch.view_as_real``: the complex Tensor's ``[..., 2]`` real layout (the Tensor graphc holds)."""
    if not isinstance(input, ComplexTensor):
        raise CaptureError(f"view_as_real is only supported for complex tensors (as in torch), got "
                           f"{ops.lift(input).type_str()} (at {user_source()})")
    return pair(input)


@autocast_op()
def view_as_complex(input: Any) -> ComplexTensor:  # noqa: A002
    """``torch.view_as_complex``: a float32/float64 Tensor whose last dim is 2 read as complex."""
    t = _float_part("view_as_complex", "input", input)
    if not t.shape or t.shape[-1] != 2:
        raise CaptureError(f"view_as_complex: the last dim of input must be 2 (real, imag), got "
                           f"{t.type_str()} (at {user_source()})")
    return ComplexTensor(pair=t)


view_as_real_copy, view_as_complex_copy = view_as_real, view_as_complex


def _part_dtype(dtype: Any) -> str | None:
    """The parts' dtype of a complex ``dtype``; None for a real (or no) dtype."""
    return None if dtype is None else COMPLEX_PARTS.get(str(as_dtype(dtype)))


# -- gc.* names that take real or complex Tensors -------------------------------------------------------


def either_kind(real_fn: Callable[..., Any], complex_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``real_fn``, or ``complex_fn`` where an argument is complex."""
    @functools.wraps(real_fn)
    def fn(*args: Any, **kwargs: Any) -> Any:
        if any(is_complex_value(a) for a in (*args, *kwargs.values())):
            return complex_fn(*args, **kwargs)
        return real_fn(*args, **kwargs)
    return fn


def by_complex_dtype(real_fn: Callable[..., Any], complex_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A factory: ``complex_fn(part dtype, ...)`` where ``dtype=`` (or a complex ``like``) is complex."""
    @functools.wraps(real_fn)
    def fn(*args: Any, dtype: Any = None, **kwargs: Any) -> Any:
        part = _part_dtype(dtype)
        if part is None and dtype is None and args and isinstance(args[0], ComplexTensor):
            part = COMPLEX_PARTS[args[0].dtype]
        if part is not None:
            return complex_fn(part, *args, **kwargs)
        return real_fn(*args, **kwargs) if dtype is None else real_fn(*args, dtype=dtype, **kwargs)
    return fn


zeros_any = by_complex_dtype(ops_array.zeros, lambda part, *size: ComplexTensor(
    pair=ops_array.zeros(*_sizes(size), 2, dtype=part)))
ones_any = by_complex_dtype(ops_array.ones, lambda part, *size: of_parts(ops_array.ones(*_sizes(size), dtype=part),
                                                                         None))
zeros_like_any = by_complex_dtype(ops_array.zeros_like, lambda part, x: of_parts(
    ops_array.zeros_like(parts(x)[0] if isinstance(x, ComplexTensor) else x, dtype=part), None))
exp_any = either_kind(ops.exp, exp)
abs_any = either_kind(ops.abs, abs)
sum_any = either_kind(ops.sum, sum)
mean_any = either_kind(ops.mean, mean)
matmul_any = either_kind(ops.matmul, complex_matmul)
einsum_any = either_kind(ops_array.einsum, complex_einsum)
real_any = either_kind(ops_aliases.real, real)
imag_any = either_kind(ops_aliases.imag, imag)
conj_any = either_kind(ops_aliases.conj, conj)
angle_any = either_kind(ops_torch_misc.angle, angle)
is_complex_any = either_kind(ops_aliases.is_complex, lambda x: True)
add_any = either_kind(ops_binary.add, add)
sub_any = either_kind(ops_binary.sub, sub)
mul_any = either_kind(ops_binary.mul, mul)
div_any = either_kind(ops_binary.div, div)
# (graphc/__init__.py loads these ``<name>_any`` as ``gc.<name>``, in place of the real-only functions)


def _of_part_dtype(dtype: str) -> Callable[[ComplexTensor], ComplexTensor]:
    """``z.cfloat()``/``z.cdouble()``: ``z`` with parts of ``dtype`` (float32/float64), as torch's complex casts."""
    return lambda z: of_parts(*(ops.cast(p, dtype) for p in parts(z)))


def _refused(name: str) -> Callable[..., Any]:
    def refused(z: ComplexTensor, *args: Any, **kwargs: Any) -> Any:
        raise complex_refusal(name, z)
    return refused


# ComplexTensor's operators and methods
METHODS = {
    "__add__": add, "__radd__": lambda a, b: add(b, a), "__sub__": sub, "__rsub__": lambda a, b: sub(b, a),
    "__mul__": mul, "__rmul__": lambda a, b: mul(b, a), "__truediv__": div, "__rtruediv__": lambda a, b: div(b, a),
    "__matmul__": complex_matmul, "__rmatmul__": lambda a, b: complex_matmul(b, a),
    "__neg__": neg, "__pos__": lambda a: a, "__abs__": abs, "__getitem__": getitem, "__setitem__": setitem,
    "__eq__": lambda a, b: eq(a, b), "__ne__": lambda a, b: ops_math.logical_not(eq(a, b)),
    "real": _part(0), "imag": _part(1), "conj": conj, "conj_physical": conj, "resolve_conj": conj,
    "abs": abs, "angle": angle, "exp": exp, "sum": sum, "mean": mean, "reshape": reshape, "view": reshape,
    "permute": permute, "transpose": transpose, "unsqueeze": unsqueeze, "detach": detach, "matmul": complex_matmul,
    "cfloat": _of_part_dtype("float32"), "cdouble": _of_part_dtype("float64"),
    **{name: _refused(name) for name in ("__lt__", "__le__", "__gt__", "__ge__",
                                         "__floordiv__", "__mod__", "__iter__", "__len__", "__index__")},
}


def eq(a: Any, b: Any) -> Tensor:
    """``a == b``: both parts equal."""
    (ar, ai), (br, bi) = operand(a), operand(b)
    zero = ops.lift(0.0, ar)
    return ops_math.logical_and(ar == br, (zero if ai is None else ai) == (zero if bi is None else bi))


for _name, _method in METHODS.items():
    setattr(ComplexTensor, _name, _method)

__all__ = ["complex", "polar", "view_as_real", "view_as_complex", "view_as_real_copy", "view_as_complex_copy"]
