"""Type promotion against torch: ~180 ops of two operands over every mix of 8 dtypes (a [3, 4] Tensor beside a
[3, 4] or 0-D Tensor, or a Python bool/int/out-of-int8 int/float), run eagerly (numpy kernels) in graphc and in
torch; prints the counts by cause and writes one line per disagreement with --out. Needs torch.

    .venv/bin/python scripts/promotion_sweep.py [--ops +,pow,masked_fill] [--out disagreements.txt]

Causes: graphc refuses what torch computes, torch refuses what graphc computes, dtype mismatch, value mismatch
(rtol 1e-5, 1e-2 where float16/bfloat16 are involved), match; both refusing is not counted. A float scalar
beside an integer Tensor keeps the Tensor's dtype or is refused in graphc by contract (API.md), counted apart.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
import warnings

import numpy as np

DTYPES = ["bool", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
SCALARS = [True, 3, 300, 2.5]
CAUSES = ["graphc refuses", "torch refuses", "dtype mismatch", "value mismatch", "match", "API contract"]
_RNG = np.random.default_rng(0)
_BASE = _RNG.integers(1, 5, (3, 4)) + _RNG.choice([0, 0.5], (3, 4))

# torch's functions of two operands, called the same way on torch and gc: M.name(a, b) and a.name(b)
FUNCTIONS = ["add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "float_power",
             "atan2", "arctan2", "hypot", "xlogy", "copysign", "fmax", "fmin", "maximum", "minimum", "logaddexp",
             "logaddexp2", "eq", "ne", "lt", "le", "gt", "ge", "greater", "less_equal", "not_equal", "equal",
             "isclose", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
             "logical_and", "logical_or", "logical_xor", "gcd", "lcm", "nextafter", "ldexp", "heaviside", "igamma",
             "igammac", "rsub", "subtract", "multiply", "divide", "dist", "polar", "complex", "clamp_min",
             "clamp_max", "outer", "kron", "dot", "inner", "matmul", "mm", "allclose"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<<", ">>", "==", "!=", "<", "<=", ">", ">="]
REFLECTED = ["+", "-", "*", "/", "//", "%", "**", "&", "<", "=="]


def _operator(symbol: str, reflected: bool):
    code = compile(f"b {symbol} a" if reflected else f"a {symbol} b", symbol, "eval")
    return lambda M, a, b: eval(code, {}, {"a": a, "b": b})  # noqa: S307 - the symbols above only


def _inplace(name: str):
    """``a.name(b)`` on a clone of ``a`` in torch (its leaf may not be written), on ``a`` in graphc."""
    return lambda M, a, b: getattr(a.clone() if M.__name__ == "torch" else a, name)(b)


OPS = {**{s: _operator(s, False) for s in OPERATORS}, **{"r" + s: _operator(s, True) for s in REFLECTED}}
for _name in FUNCTIONS:
    OPS[_name] = (lambda n: lambda M, a, b: getattr(M, n)(a, b))(_name)
    OPS["." + _name] = (lambda n: lambda M, a, b: getattr(a, n)(b))(_name)
OPS.update({
    "div_trunc": lambda M, a, b: M.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda M, a, b: M.div(a, b, rounding_mode="floor"),
    "add_alpha": lambda M, a, b: M.add(a, b, alpha=2), "xlog1py": lambda M, a, b: M.special.xlog1py(a, b),
    "where_ab": lambda M, a, b: M.where(a > 2, a, b), "where_ba": lambda M, a, b: M.where(a > 2, b, a),
    "lerp": lambda M, a, b: M.lerp(a, a * 3, b), "lerp2": lambda M, a, b: M.lerp(a, b, 0.25),
    "clamp": lambda M, a, b: M.clamp(a, b, b), "clamp_lo": lambda M, a, b: M.clamp(a, min=b),
    "clip": lambda M, a, b: M.clip(a, b, b), "addcmul": lambda M, a, b: M.addcmul(a, a, b, value=2),
    "addcdiv": lambda M, a, b: M.addcdiv(a, a, b), "addcmul_b": lambda M, a, b: M.addcmul(b, a, a),
    **{name: (lambda n: lambda M, a, b: getattr(M, n)([a, b]))(name)
       for name in ["cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack",
                    "row_stack"]},
    "block_diag": lambda M, a, b: M.block_diag(a, b),
    "einsum_mul": lambda M, a, b: M.einsum("...,...->...", a, b),
    "einsum_ij,kj": lambda M, a, b: M.einsum("ij,kj->ik", a, b),
    "einsum_outer": lambda M, a, b: M.einsum("ij,kl->ijkl", a, b),
    "tensordot1": lambda M, a, b: M.tensordot(a, b, dims=([1], [1])),
    "tensordot0": lambda M, a, b: M.tensordot(a, b, dims=0),
    "masked_fill": lambda M, a, b: a.masked_fill(a > 2, b),
    **{name: _inplace(name) for name in ["fill_", "add_", "mul_", "pow_", "copy_"]},
    "type_as": lambda M, a, b: a.type_as(b), "new_full": lambda M, a, b: a.new_full((2,), b),
    "full_like": lambda M, a, b: M.full_like(a, b),
})


def _make(M, dtype: str, zero_dim: bool):
    """The sweep's operand of ``dtype`` in module ``M``: [3, 4] (0-D: one element) of 1..5 in halves."""
    v = _BASE[0, 1] if zero_dim else _BASE
    v = v > 2.2 if dtype == "bool" else v if "float" in dtype else np.floor(v)
    return M.tensor(np.asarray(v, np.float64)).to(getattr(M, dtype))


def _operands():
    for da in DTYPES:
        yield from (((da, False), (db, zb)) for db in DTYPES for zb in (False, True))
        yield from (((da, False), s) for s in SCALARS)


def _name(x) -> str:
    return f"{x[0]}{'[]' if x[1] else '[3,4]'}" if isinstance(x, tuple) else repr(x)


def _run(M, op: str, a, b):
    """(dtype name, values) of ``op`` on the operands ``a``, ``b`` in module ``M`` (torch or gc)."""
    out = OPS[op](M, _make(M, *a), _make(M, *b) if isinstance(b, tuple) else b)
    if isinstance(out, bool):
        return "bool", np.asarray(out)
    out = out[0] if isinstance(out, tuple) else out
    dtype = str(out.dtype).replace("torch.", "")
    if M.__name__ == "torch" and "complex" not in dtype:
        out = out.to(M.float64)
    values = np.asarray(out.numpy())
    return dtype, values if "complex" in dtype else values.astype(np.float64)


def _compare(op: str, a, b, torch, gc) -> tuple[str, str]:
    """(cause, a line describing a disagreement or '') of one op on one operand mix."""
    try:
        want = _run(torch, op, a, b)
    except Exception as exc:  # noqa: BLE001 - any refusal counts
        want = exc
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            got = _run(gc, op, a, b)
    except Exception as exc:  # noqa: BLE001
        got = exc
    case = f"{op} {_name(a)} {_name(b)}"
    contract = isinstance(b, float) and a[0] in ("int8", "int32", "int64")
    if isinstance(want, Exception):
        return ("", "") if isinstance(got, Exception) else \
            ("torch refuses", f"COMPUTES {case}: torch {type(want).__name__}: {str(want)[:80]}")
    if isinstance(got, Exception):
        return ("API contract", "") if contract else \
            ("graphc refuses", f"REFUSE {case}: torch {want[0]}; {type(got).__name__}: {str(got)[:140]}")
    if got[0] != want[0]:
        return ("API contract", "") if contract else ("dtype mismatch", f"DTYPE {case}: graphc {got[0]} torch {want[0]}")
    half = any(d in ("float16", "bfloat16") for d in (a[0], b[0] if isinstance(b, tuple) else "", want[0]))
    try:
        same = got[1].shape == want[1].shape and np.allclose(got[1], want[1], rtol=1e-2 if half else 1e-5,
                                                             atol=1e-5, equal_nan=True)
    except (TypeError, ValueError):
        same = False
    if same:
        return "match", ""
    return "value mismatch", f"VALUE {case} ({want[0]}): graphc {np.ravel(got[1])[:4]} torch {np.ravel(want[1])[:4]}"


def sweep(ops: list[str]) -> tuple[collections.Counter, list[str]]:
    """Counts by cause and the disagreement lines of ``ops`` over every operand mix."""
    import torch

    import graphc as gc

    counts, lines = collections.Counter(), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a, b in _operands():
            for op in ops:
                cause, line = _compare(op, a, b, torch, gc)
                counts[cause] += bool(cause)
                lines += [line] if line else []
    return counts, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help=f"comma-separated subset of the {len(OPS)} ops (default: all)")
    parser.add_argument("--out", help="write one line per disagreement to this file")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else list(OPS)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        parser.error(f"unknown ops {unknown}; known: {' '.join(OPS)}")
    counts, lines = sweep(ops)
    for cause in CAUSES:
        print(f"{cause:16s} {counts[cause]}")
    if args.out:
        with open(args.out, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
