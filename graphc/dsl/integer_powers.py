"""Powers of integer Tensors as torch's: ``a ** b`` wrapping as C, by square and multiply (``ops.binary`` sends
integer ``Pow`` here), and torch's few powers of the wide unsigned dtypes (uint16/uint32/uint64)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl.builder import current, known_value, op_error, user_source
from graphc.dsl.control_while import while_loop
from graphc.dsl.ops import binary, cast, constant, emit, lift, reduction, unary, where
from graphc.dsl.ops_array import ones_like
from graphc.dsl.promotion import number_dtype
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES, to_numpy

WIDE_UNSIGNED = ("uint16", "uint32", "uint64")


def integer_power(a: Tensor, b: Tensor) -> Tensor:
    """``a ** b`` of integer Tensors of one dtype as torch's, wrapping as C: square and multiply. int8/int16/uint8
    (no ONNX Pow kernel) work in int32, each product wrapped back to the dtype; int32/int64 in their own, since
    onnxruntime's Pow of them goes through double (saturating, low bits lost past 2**53) and numpy's refuses
    negative powers. A constant 0-D power >= 0 unrolls into its multiplications (a scalar 2 or 3 of int32/int64
    stays one ONNX Pow: both backends multiply for it, exactly); a constant array of powers takes as many masked
    steps as its largest one's bits; a Tensor power loops while its largest power has bits left. A negative
    power is 1 of base 1, +-1 of base -1 (its parity's power) and 0 of the others.

    A Tensor power of [1M], onnxruntime CPU, 1 thread, median ms of one run (scripts/bench_lowerings.py --only
    int_power; ONNX Pow not exact), powers < 8 / full-range: int32 Pow 24/26, torch 18/176, this 37/150; int64
    Pow 22/25, torch 17/358, this 79/1056. Alternatives in that run: one masked step per dtype bit 249/430 and
    992/1546; the Loop without the negative powers' masks 27/134 and 59/869; halving a uint copy by BitShift
    instead of Div 26/139 and 49/475, but gc.vmap's Loop then needs a uint64 Where, which onnxruntime lacks;
    the low bit by Mod instead of BitwiseAnd 311/1700 int32 in an earlier run. Opset < 18 takes it by Mod.
    """
    known = known_value(b)
    narrow = a.dtype in ("int8", "int16", "uint8")
    work = "int32" if narrow else a.dtype
    wrap = (lambda t: cast(cast(t, a.dtype), work)) if narrow else (lambda t: t)  # noqa: E731
    base, power = cast(a, work), cast(b, work)
    one, two = constant(np.asarray(1, to_numpy(work))), constant(np.asarray(2, to_numpy(work)))
    if known is not None and known.ndim == 0 and known >= 0:
        if not narrow and int(known) in (2, 3):
            return emit("Pow", [a, b])
        return cast(_unrolled_power(base, int(known), one, wrap), a.dtype)
    def low_bit(t: Tensor) -> Tensor:
        return emit("BitwiseAnd", [t, one]) if current().opset >= 18 else emit("Mod", [t, two])

    negative = power < 0
    left = where(negative, low_bit(power), power)  # a negative power's parity is all that counts

    def step(out: Tensor, base: Tensor, left: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return where(cast(low_bit(left), "bool"), wrap(out * base), out), wrap(base * base), emit("Div", [left, two])

    state = (base * 0 + power * 0 + one, base, left)  # the broadcast shape
    if known is not None:
        for _ in range(int(np.abs(known.astype(np.int64)).max(initial=0)).bit_length()):
            state = step(*state)
    else:
        top = reduction("ReduceMax", left, None, False)
        *state, _ = while_loop(lambda *s: s[-1] > 0, lambda *s: (*step(*s[:3]), emit("Div", [s[3], two])),
                               (*state, top))
    out = where(negative & (unary("Abs", base) != one), constant(np.asarray(0, to_numpy(work))), state[0])
    return cast(out, a.dtype)


def _unrolled_power(base: Tensor, k: int, one: Tensor, wrap: Callable[[Tensor], Tensor]) -> Tensor:
    """``base ** k`` for a known ``k >= 0``: a product of the squarings its set bits pick, each one wrapped."""
    out = None
    while k:
        if k & 1:
            out = base if out is None else wrap(out * base)
        k >>= 1
        if k:
            base = wrap(base * base)
    return base * 0 + one if out is None else out


def wide_unsigned_power(a: Any, b: Any) -> Tensor:
    """``a ** b`` where ``a`` or ``b`` is a uint16/uint32/uint64 Tensor, as torch 2.13: beside a float (Tensor or
    Python number) it is that float's power (float32 for a number); a Python power 0 or 1 (or a bool) gives
    ones or ``a``, a Python base 1 ones; any other power torch's kernel refuses (not implemented for 'UInt16'),
    and so does graphc, naming the dtypes. A negative Python power is refused before (``ops.binary``)."""
    unsigned = a if isinstance(a, Tensor) and a.dtype in WIDE_UNSIGNED else b
    other = b if unsigned is a else a
    floating = other.dtype if isinstance(other, Tensor) else number_dtype(other)
    if floating in FLOAT_DTYPES:
        lifted = cast(unsigned, floating)
        return binary("Pow", lifted, b) if unsigned is a else binary("Pow", a, lifted)
    if unsigned is a and not isinstance(b, Tensor) and b in (0, 1):
        return ones_like(a) if b == 0 else emit("Identity", [a])
    if unsigned is b and not isinstance(a, Tensor) and a == 1:
        return ones_like(b)
    name = "UInt" + unsigned.dtype[4:]
    raise op_error("Pow", [lift(a), lift(b)], f"torch's pow of {unsigned.dtype} is not implemented (\"pow\" not "
                   f"implemented for '{name}') but for a Python power 0 or 1 or a float operand; cast first, e.g. "
                   "t.long() ** e or t.double() ** e", user_source())
