"""torch's elementwise functions of two or three Tensors under its names: arithmetic with
``alpha=``/``value=``/``rounding_mode=`` (``gc.add``, ``gc.div``, ``gc.addcmul``, ...), ``atan2``,
``hypot``, ``xlogy``, ``lerp``, ``copysign``, NaN-ignoring ``fmax``/``fmin``, ``float_power``,
comparisons as functions, ``isclose``/``allclose``/``equal``, bitwise ops and shifts on integer
Tensors, and ``gcd``/``lcm``. Everything broadcasts and lowers to standard ONNX ops; gradients
flow where torch's do. Operands promote as torch's (``ops.promote``); a Python scalar takes the
Tensors' dtype (graphc's contract), refused where that would change it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl import control
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import (binary, cast, constant, detach, emit, in_range, lift, log, maximum, minimum,
                            not_for_bool, operand_pair, promote, scalar, sqrt, unary, where)
from graphc.dsl.ops_divide import floor_divide, to_float, true_divide
from graphc.dsl.ops_elementwise import signbit
from graphc.dsl.ops_math import all as all_
from graphc.dsl.ops_math import isfinite, isnan, logaddexp, trunc
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, to_numpy

# -- arithmetic -------------------------------------------------------------------------------


def _scaled(t: Tensor, factor: Any, arg: str, fn: str) -> Tensor:
    """``t * factor`` (``t`` itself for 1); a float ``factor`` on an integer Tensor is refused, as torch."""
    if isinstance(factor, Tensor) or not isinstance(factor, (bool, int, float, np.number)):
        raise CaptureError(f"{fn} {arg}= takes a Python number, got {type(factor).__name__} (at {user_source()})")
    if t.dtype not in FLOAT_DTYPES and not float(factor).is_integer():
        raise CaptureError(f"{fn}: {arg}={factor!r} is not an integer, and the Tensors are {t.dtype}; cast them "
                           f"to a float dtype first (at {user_source()})")
    in_range(t.dtype, factor)
    return t if factor == 1 else t * scalar(factor, t)


def add(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:  # noqa: A002 - torch's names
    """``input + alpha * other``; on bool Tensors their logical or, as torch. Signature: ai.onnx@14::Add"""
    a, b = operand_pair(input, other)
    if a.dtype == "bool" and b.dtype == "bool" and isinstance(alpha, int) and alpha == 1:
        return emit("Or", [a, b])
    return binary("Add", a, _scaled(b, alpha, "alpha", "add"))


def sub(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:  # noqa: A002
    """``input - alpha * other``; bool Tensors are refused, as torch. Signature: ai.onnx@14::Sub"""
    a, b = operand_pair(input, other)
    if any(isinstance(t, (bool, np.bool_)) or isinstance(t, Tensor) and t.dtype == "bool" for t in (input, other)):
        raise op_error("Sub", [a, b], "sub of bool Tensors is not defined (as in torch); use gc.bitwise_xor or "
                       "gc.logical_xor", user_source())
    return binary("Sub", a, _scaled(b, alpha, "alpha", "sub"))


def mul(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input * other``; on bool Tensors their logical and, as torch. Signature: ai.onnx@14::Mul"""
    a, b = operand_pair(input, other)
    if a.dtype == "bool" and b.dtype == "bool":
        return emit("And", [a, b])
    return binary("Mul", a, b)


def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Tensor:  # noqa: A002
    """``input / other``: ``rounding_mode`` None is true division (integers become float32, as
    torch), ``"trunc"`` rounds towards zero and ``"floor"`` down, both keeping integer dtypes."""
    if rounding_mode is None:
        return true_divide(input, other)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode != "trunc":
        raise CaptureError(f"div rounding_mode={rounding_mode!r}; expected None, 'trunc' or 'floor' "
                           f"(at {user_source()})")
    a, b = operand_pair(input, other)
    return binary("Div", a, b) if a.dtype not in FLOAT_DTYPES else trunc(a / b)  # integer Div truncates


@autocast_op()
@in_float32
def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:  # noqa: A002
    """``input + value * tensor1 * tensor2``, the three promoted as torch's."""
    x, t1, t2 = promote(input, tensor1, tensor2)
    if x.dtype == "bool":
        raise not_for_bool("addcmul", [x, t1, t2], "addcmul")
    return add(x, _scaled(mul(t1, t2), value, "value", "addcmul"))


@autocast_op()
@in_float32
def addcdiv(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:  # noqa: A002
    """``input + value * tensor1 / tensor2``, the three promoted as torch's; integer (and bool) ``tensor1`` and
    ``tensor2`` are refused, as torch."""
    if not any(isinstance(t, float) or isinstance(t, Tensor) and t.dtype in FLOAT_DTYPES for t in (tensor1, tensor2)):
        raise op_error("Div", [lift(tensor1), lift(tensor2)], "addcdiv takes a float tensor1 or tensor2 (torch no "
                       "longer divides integers in addcdiv)", user_source())
    x, t1, t2 = promote(input, tensor1, tensor2)
    return add(x, _scaled(binary("Div", t1, t2), value, "value", "addcdiv"))


@in_float32
def lerp(input: Any, end: Any, weight: Any) -> Tensor:  # noqa: A002
    """``input + weight * (end - input)``; ``weight`` a number or a Tensor, each of the three
    gets its gradient. The three promote as torch's; float Tensors only, as torch."""
    _unpromoted("lerp", input, end)
    if any(isinstance(t, Tensor) and t.dtype == "bool" for t in (input, end)):  # a float weight would promote them
        raise not_for_bool("lerp", [lift(input), lift(end)], "lerp")
    if isinstance(weight, Tensor) and weight.ndim:
        _unpromoted("lerp", input, weight)
    a, b, w = _floats("lerp", input, end, weight)
    return a + w * (b - a)


def float_power(input: Any, exponent: Any) -> Tensor:  # noqa: A002
    """``input ** exponent`` in float64 (both cast first, numpy arrays too), torch's dtype whatever the inputs'.
    Signature: ai.onnx@15::Pow"""
    a, b = operand_pair(*map(_float64, (input, exponent)))
    return emit("Pow", [a, b])


def _float64(x: Any) -> Any:
    """A Tensor or numpy array ``x`` as a float64 Tensor; a number as it is (it takes the other's dtype)."""
    if isinstance(x, np.ndarray):
        return constant(x.astype(np.float64))
    return cast(x, "float64") if isinstance(x, Tensor) else x


def _floats(fn: str, *operands: Any) -> list[Tensor]:
    """``operands`` promoted as torch's (``promote``), which must give a float dtype, as torch's ``fn`` needs."""
    promoted = promote(*operands)
    if promoted[0].dtype not in FLOAT_DTYPES:
        dtypes = " and ".join(t.dtype if isinstance(t, Tensor) else type(t).__name__ for t in operands)
        raise op_error(fn, promoted, f"{fn} takes float Tensors, got {dtypes} (which promote to "
                       f"{promoted[0].dtype})", user_source())
    return promoted


def _unpromoted(fn: str, a: Any, b: Any) -> None:
    """Refuse Tensors ``a`` and ``b`` of two dtypes where torch's ``fn`` does not promote them."""
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
        raise op_error(fn, [a, b], f"dtype mismatch {a.dtype} vs {b.dtype}: torch's {fn} does not promote "
                       f"Tensors of two dtypes; cast one with .astype()", user_source())


def _float_pair(fn: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """``_floats`` of two operands."""
    a, b = _floats(fn, a, b)
    return a, b


def to_float_pair(fn: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` promoted as torch's (``promote``), bool or integer made float32, as torch's ``fn``: a
    Tensor first, so that an int constant keeps its value (``xlogy(int8_t, 300)``, as torch's)."""
    return operand_pair(*(to_float(x, y) if isinstance(x, Tensor) else x for x, y in ((a, b), (b, a))))


# -- float functions of two inputs ------------------------------------------------------------


@autocast_op()
def atan2(input: Any, other: Any) -> Tensor:  # noqa: A002
    """The angle of the point ``(other, input)``, in ``[-pi, pi]``, signed zeros and infinities as
    torch's; integers become float32. Where ``|other| >= |input|`` it is ``atan(input / other)``,
    turned by pi when ``other``'s sign bit is set, else ``sign(input) pi/2 - atan(other / input)``,
    so no division is by 0 and the gradient is torch's (0 at the origin, where ``y * 0`` is divided)."""
    y, x = to_float_pair("atan2", input, other)
    one = scalar(1, x)
    by_x = abs_(x) >= abs_(y)
    divides = by_x & (x != scalar(0, x))  # x == 0 where by_x means y == 0
    near = unary("Atan", where(divides, y, y * scalar(0, y)) / where(divides, x, one))
    near = where(signbit(x), near + where(signbit(y), scalar(-math.pi, x), scalar(math.pi, x)), near)
    far = unary("Sign", y) * scalar(math.pi / 2, x) - unary("Atan", x / where(by_x, one, y))
    corner = unary("Sign", y) * where(signbit(x), scalar(3 * math.pi / 4, x), scalar(math.pi / 4, x))
    return where(unary("IsInf", x) & unary("IsInf", y), corner, where(by_x, near, far))


def hypot(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``sqrt(input**2 + other**2)`` without overflow, as C's ``hypot``: ``m sqrt(1 + (n / m)**2)``
    with ``m``, ``n`` the larger and smaller magnitude; infinite where either is (even with a nan).
    Float Tensors only, as torch."""
    a, b = _float_pair("hypot", input, other)
    big, small = maximum(abs_(a), abs_(b)), minimum(abs_(a), abs_(b))
    ratio = small / where(big == scalar(0, big), scalar(1, big), big)
    length = where(isnan(a) | isnan(b), a + b, big * sqrt(scalar(1, a) + ratio * ratio))
    return where(unary("IsInf", a) | unary("IsInf", b), scalar(math.inf, a), length)


def xlogy(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input * log(other)``, 0 where ``input`` is 0 unless ``other`` is nan (then nan), as torch;
    integers become float32. Where ``0 * log(other)`` would not be 0 (``other`` <= 0 or inf) the log
    reads 1, so no nan gradient leaks from it; elsewhere the gradient to ``input`` is ``log(other)``,
    at 0 too, as torch's (the 0 is ``0 * log(other) + 0``: +0, as torch's, with that gradient)."""
    x, y = to_float_pair("xlogy", input, other)
    zero = (x == scalar(0, x)) & unary("Not", isnan(y))
    product = x * log(where(zero & ((y <= scalar(0, y)) | unary("IsInf", y)), scalar(1, y), y))
    return where(zero, product + scalar(0, x), product)


def copysign(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``|input|`` with the sign of ``other`` (-0.0 counts as negative, as torch); integers become
    float32. The gradient to ``input`` is the sign change (0 at 0), none to ``other``, as torch's."""
    a, b = to_float_pair("copysign", input, other)
    return where(signbit(b), -abs_(a), abs_(a))


def fmax(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Elementwise max that ignores nan (nan only where both are); the gradient goes to ``input``
    where ``input >= other`` or ``other`` is nan, else to ``other``, as torch routes it."""
    a, b = operand_pair(input, other)
    return where((a >= b) | isnan(b), a, b)


def fmin(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Elementwise min that ignores nan, as ``fmax``."""
    a, b = operand_pair(input, other)
    return where((a <= b) | isnan(b), a, b)


def heaviside(input: Any, values: Any) -> Tensor:  # noqa: A002
    """0 where ``input < 0``, 1 where ``> 0``, ``values`` where ``== 0``; no gradient (torch
    defines none), so the result is detached."""
    _unpromoted("heaviside", input, values)
    x, v = operand_pair(input, values)
    zero = scalar(0, x)
    return detach(where(x == zero, v, cast(x > zero, x.dtype)))


def logaddexp2(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``log2(2**input + 2**other)`` without overflow: ``logaddexp`` in units of ``ln 2``."""
    a, b = _float_pair("logaddexp2", input, other)
    ln2 = scalar(math.log(2), a)
    return logaddexp(a * ln2, b * ln2) / ln2


# -- comparisons ------------------------------------------------------------------------------


def eq(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@19::Equal"""
    return binary("Equal", input, other)


def ne(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@1::Not"""
    return unary("Not", eq(input, other))


def lt(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@13::Less"""
    return binary("Less", input, other)


def le(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@16::LessOrEqual"""
    return binary("LessOrEqual", input, other)


def gt(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@13::Greater"""
    return binary("Greater", input, other)


def ge(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Signature: ai.onnx@16::GreaterOrEqual"""
    return binary("GreaterOrEqual", input, other)


def isclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
            equal_nan: bool = False) -> Tensor:
    """Where ``|input - other| <= atol + rtol * |other|`` (or the two are equal, infinities
    included; nan equal to nan with ``equal_nan``), as torch; integers compare in float32."""
    _unpromoted("isclose", input, other)
    a, b = operand_pair(input, other)
    check_tolerances(rtol, atol)
    close = binary("Equal", a, b)
    if equal_nan:
        close = close | (isnan(a) & isnan(b))
    if rtol == 0 and atol == 0:
        return close
    fa, fb = to_float(a), to_float(b)
    error = abs_(fa - fb)
    return close | (isfinite(error) & (error <= scalar(atol, fb) + scalar(rtol, fb) * abs_(fb)))


def check_tolerances(rtol: Any, atol: Any) -> None:
    """Refuse an ``isclose`` tolerance that is not a number >= 0, naming it."""
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not isinstance(tol, (int, float)) or tol < 0:
            raise CaptureError(f"isclose {name}={tol!r}; expected a number >= 0 (at {user_source()})")


def allclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
             equal_nan: bool = False) -> Tensor:
    """Whether ``isclose`` holds everywhere: a bool scalar Tensor (torch returns a Python bool,
    which a graph cannot: ``bool(t)`` of a traced Tensor is refused; branch with ``gc.cond``)."""
    return all_(isclose(input, other, rtol, atol, equal_nan))


def equal(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """Whether the two have the same shape and values: a bool scalar Tensor (torch returns a
    Python bool, which a graph cannot). Shapes that differ at capture give a constant False, as
    torch; symbolic dims must be the same names."""
    a, b = operand_pair(input, other)
    if len(a.shape) != len(b.shape) or any(isinstance(m, int) and isinstance(n, int) and m != n
                                           for m, n in zip(a.shape, b.shape)):
        return constant(np.asarray(False))
    if tuple(a.shape) != tuple(b.shape):
        raise op_error("equal", [a, b], "the shapes may differ at run time; equal needs them the same at capture "
                       "(give both inputs the same dim names)", user_source())
    return all_(binary("Equal", a, b))


# -- bitwise ----------------------------------------------------------------------------------

_UNSIGNED = {"int8": "uint8", "int16": "uint16", "int32": "uint32", "int64": "uint64"}
_BITWISE = {"bitwise_and": ("And", "BitwiseAnd"), "bitwise_or": ("Or", "BitwiseOr"),
            "bitwise_xor": ("Xor", "BitwiseXor"), "bitwise_not": ("Not", "BitwiseNot")}


def _integers(fn: str, operands: list[Tensor], bool_ok: bool = True) -> None:
    """Refuse float (and for shifts bool) Tensors, and integer ones below opset 18 (no Bitwise* ops)."""
    dtype = operands[0].dtype
    if dtype in FLOAT_DTYPES or (dtype == "bool" and not bool_ok):
        kinds = "integer or bool" if bool_ok else "integer"
        raise op_error(fn, operands, f"{fn} takes {kinds} Tensors, got {dtype}", user_source())
    if dtype != "bool" and current().opset < 18:
        raise op_error(fn, operands, f"{fn} on integer Tensors needs opset >= 18 (ONNX Bitwise ops), "
                       f"capturing at opset {current().opset}", user_source())


def _bitwise(fn: str, *operands: Any) -> Tensor:
    ts = list(operand_pair(*operands)) if len(operands) == 2 else [lift(operands[0])]
    _integers(fn, ts)
    logical, bitwise = _BITWISE[fn]
    return emit(logical if ts[0].dtype == "bool" else bitwise, ts)


def bitwise_and(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``&``: And on bool Tensors, BitwiseAnd (opset 18) on integer ones."""
    return _bitwise("bitwise_and", input, other)


def bitwise_or(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``|``: Or on bool Tensors, BitwiseOr (opset 18) on integer ones."""
    return _bitwise("bitwise_or", input, other)


def bitwise_xor(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``^``: Xor on bool Tensors, BitwiseXor (opset 18) on integer ones."""
    return _bitwise("bitwise_xor", input, other)


def bitwise_not(input: Any) -> Tensor:  # noqa: A002
    """``~``: Not on a bool Tensor, BitwiseNot (opset 18) on an integer one."""
    return _bitwise("bitwise_not", input)


def _shift_operands(fn: str, input: Any, other: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The operands, the shift amount clamped to ``[0, bits - 1]`` (both as the unsigned type of
    the same width: ONNX BitShift takes only those) and where the amount was out of that range
    (negative or the bit width or more, which torch reads as a huge shift)."""
    a, b = operand_pair(input, other)
    _integers(fn, [a, b], bool_ok=False)
    bits = np.iinfo(to_numpy(a.dtype)).bits
    out_of_range = (b < scalar(0, b)) | (b >= scalar(bits, b))
    unsigned = _UNSIGNED.get(a.dtype, a.dtype)
    return a, cast(a, unsigned), cast(where(out_of_range, scalar(bits - 1, b), b), unsigned), out_of_range


def bitwise_left_shift(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input << other`` as torch: the bits wrap as in C (on the unsigned type of the same width);
    a shift that is negative or the bit width or more gives 0. Signature: ai.onnx@11::BitShift"""
    a, ua, shift, out_of_range = _shift_operands("bitwise_left_shift", input, other)
    shifted = cast(emit("BitShift", [ua, shift], {"direction": "LEFT"}), a.dtype)
    return where(out_of_range, scalar(0, a), shifted)


def bitwise_right_shift(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input >> other`` as torch, arithmetic: signed values keep their sign (``-8 >> 1`` is -4,
    ``-1 >> k`` is -1): a negative ``input`` is complemented, shifted logically, complemented back.
    A shift out of ``[0, bits)`` is a shift by ``bits - 1`` (0 or -1). Signature: ai.onnx@11::BitShift"""
    a, ua, shift, _ = _shift_operands("bitwise_right_shift", input, other)
    if a.dtype in _UNSIGNED:  # signed
        sign = cast(where(a < scalar(0, a), scalar(-1, a), scalar(0, a)), ua.dtype)
        return cast(emit("BitwiseXor", [emit("BitShift", [emit("BitwiseXor", [ua, sign]), shift],
                                              {"direction": "RIGHT"}), sign]), a.dtype)
    return emit("BitShift", [ua, shift], {"direction": "RIGHT"})


# -- integer number theory --------------------------------------------------------------------


def gcd(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Greatest common divisor (>= 0; ``gcd(0, 0)`` is 0) of integer Tensors: Euclid's steps in an
    ONNX Loop, as many as the dtype's largest values can need (the steps for consecutive
    Fibonacci numbers), each a no-op once the remainder is 0."""
    a, b = operand_pair(input, other)
    if a.dtype in FLOAT_DTYPES or a.dtype == "bool":
        raise op_error("gcd", [a, b], f"gcd takes integer Tensors, got {a.dtype}", user_source())
    a, b = abs_(a + b * scalar(0, b)), abs_(b + a * scalar(0, a))  # both in the broadcast shape

    def step(_, carry):
        x, y = carry
        done = y == scalar(0, y)
        # x % -1 is 0, as x % 1, but the CPU traps INT_MIN % -1 (a -1 remainder after |INT_MIN|, still INT_MIN)
        divisor = where(done | (y == scalar(-1, y)), scalar(1, y), y)
        return where(done, x, y), where(done, y, emit("Mod", [x, divisor]))

    return abs_(control.fori_loop(0, _euclid_steps(a.dtype), step, (a, b))[0])  # negative after a |INT_MIN|


def lcm(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Least common multiple, ``|input / gcd| * |other|`` (0 where the gcd is 0), as torch."""
    a, b = operand_pair(input, other)
    g = gcd(a, b)
    zero = g == scalar(0, g)
    # |a / g| * |b|, not |a / g * b|: a product past the dtype wraps as torch's (abs before narrowing)
    return where(zero, scalar(0, g), abs_(binary("Div", a, where(zero, scalar(1, g), g))) * abs_(b))


def _euclid_steps(dtype: str) -> int:
    """Euclid's steps enough for every pair of ``dtype``: one more than the index of the first
    Fibonacci number past the dtype's largest value (Lamé)."""
    top, steps, (f0, f1) = int(np.iinfo(to_numpy(dtype)).max) + 1, 0, (0, 1)
    while f1 <= top:
        f0, f1, steps = f1, f0 + f1, steps + 1
    return steps + 1


# torch's other names for the same functions
subtract, multiply, divide = sub, mul, div
arctan2, not_equal, less, less_equal, greater, greater_equal = atan2, ne, lt, le, gt, ge

__all__ = [
    "add", "addcdiv", "addcmul", "allclose", "arctan2", "atan2", "bitwise_and", "bitwise_left_shift", "bitwise_not",
    "bitwise_or", "bitwise_right_shift", "bitwise_xor", "copysign", "div", "divide", "eq", "equal", "float_power",
    "floor_divide", "fmax", "fmin", "gcd", "ge", "greater", "greater_equal", "gt", "heaviside", "hypot", "isclose",
    "lcm", "le", "lerp", "less", "less_equal", "logaddexp2", "lt", "mul", "multiply", "ne", "not_equal", "sub",
    "subtract", "true_divide", "xlogy",
]
