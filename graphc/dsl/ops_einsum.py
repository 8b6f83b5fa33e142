"""``gc.einsum``: one ONNX Einsum, and under the CPU's ``gc.autocast`` torch's CPU kernel: torch lists
``einsum`` for CUDA only, and on the CPU contracts the operands left to right, each pair that sums a
shared index (of size above 1) by ``bmm``, which autocast lowers, and the others by ``mul``, which
promotes (``ij,jk->ik`` gives bfloat16, ``ij,ij->ij`` and ``i,j->ij`` float32). Operands of several dtypes
outside autocast are contracted the same way: the ``mul`` pairs promote (``torch.promote_types``), a ``bmm``
pair of two dtypes is refused, as torch's CPU einsum refuses it."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from graphc.dsl.autocast import autocast_op, cast_as, is_autocast_enabled, promoted
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, emit, lift, same_dtype
from graphc.dsl.promotion import promote_types
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32


@in_float32
def _einsum(equation: str, *tensors: Tensor) -> Tensor:
    for t in tensors[1:]:
        same_dtype("Einsum", tensors[0], t)
    return emit("Einsum", list(tensors), {"equation": equation})


@autocast_op()
def einsum(equation: str, *operands: Any) -> Tensor:
    """``torch.einsum`` (explicit or implicit output). Signature: ai.onnx@12::Einsum"""
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    tensors = [lift(t) for t in operands]
    equation = equation.replace(" ", "")
    pair = _autocast_pair if is_autocast_enabled() else _promoted_pair if len({t.dtype for t in tensors}) > 1 else None
    if len(tensors) > 1 and pair is not None and equation.count(",") == len(tensors) - 1:
        return _pairwise(*_subscripts(equation, tensors), tensors, pair)
    if "..." in equation and equation.count(",") == len(tensors) - 1:  # ``...`` of several ranks, aligned right
        terms, out = _subscripts(equation, tensors)
        equation = ",".join(terms) + "->" + out
    return _einsum(equation, *tensors)


def _autocast_pair(summed: bool, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """A ``bmm`` pair cast as autocast casts one, a ``mul`` pair's float dtypes promoted."""
    return cast_as("bmm", a, b) if summed else promoted(a, b)


def _promoted_pair(summed: bool, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """A ``mul`` pair in ``torch.promote_types`` of the two (both have dims there: torch broadcasts every
    operand to the full rank first); a ``bmm`` pair of two dtypes refused, as torch's."""
    if a.dtype == b.dtype:
        return a, b
    if summed:
        raise op_error("Einsum", [a, b], f"torch's CPU einsum contracts these two by bmm, which takes one dtype, "
                       f"got {a.dtype} and {b.dtype}; cast one with .astype()", user_source())
    dtype = promote_types(a.dtype, b.dtype)
    return cast(a, dtype), cast(b, dtype)


def _subscripts(equation: str, tensors: Sequence[Tensor]) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, each ``...`` written as letters the equation does not
    use (right-aligned, as broadcasting aligns them) and an implicit output made explicit (torch's:
    the broadcast dims, then the indices used once, sorted)."""
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    named = [len(term.replace("...", "")) for term in terms]
    ranks = [t.ndim - n if "..." in term else 0 for term, t, n in zip(terms, tensors, named)]
    spare = "".join(c for c in string.ascii_letters if c not in equation)[:max(ranks)]
    full = [term.replace("...", spare[len(spare) - k:] if k else "") for term, k in zip(terms, ranks)]
    if not arrow:
        once = Counter(lhs.replace("...", "").replace(",", ""))
        out = "..." + "".join(sorted(c for c, k in once.items() if k == 1))
    return full, out.replace("...", spare)


def _size_one(t: Tensor, term: str, index: str) -> bool:
    return t.shape is not None and t.shape[term.index(index)] == 1


def _pairwise(terms: list[str], out: str, tensors: Sequence[Tensor], pair: Callable) -> Tensor:
    """``tensors`` contracted left to right as torch's CPU kernel: a pair summing a shared index is a
    ``bmm``, another a ``mul``; ``pair(summed, a, b)`` gives each pair's operands in the dtypes it takes."""
    acc, held = tensors[0], terms[0]
    for i in range(1, len(tensors)):
        t, term = tensors[i], terms[i]
        later = out + "".join(terms[i + 1:])
        keep = out if i == len(tensors) - 1 else "".join(dict.fromkeys(c for c in held + term if c in later))
        summed = [c for c in set(held) & set(term)
                  if c not in later and not _size_one(acc, held, c) and not _size_one(t, term, c)]
        a, b = pair(bool(summed), acc, t)
        acc, held = _einsum(f"{held},{term}->{keep}", a, b), keep
    return acc


__all__ = ["einsum"]
