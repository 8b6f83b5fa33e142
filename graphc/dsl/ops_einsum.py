"""``gc.einsum``: one ONNX Einsum, and under the CPU's ``gc.autocast`` torch's CPU kernel: torch lists
``einsum`` for CUDA only, and on the CPU contracts the operands left to right, each pair that sums a
shared index (of size above 1) by ``bmm``, which autocast lowers, and the others by ``mul``, which
promotes (``ij,jk->ik`` gives bfloat16, ``ij,ij->ij`` and ``i,j->ij`` float32)."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from graphc.dsl.autocast import autocast_op, cast_as, is_autocast_enabled, promoted
from graphc.dsl.ops import emit, lift, same_dtype
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
    if len(tensors) > 1 and is_autocast_enabled() and equation.count(",") == len(tensors) - 1:
        return _pairwise(*_subscripts(equation, tensors), tensors)
    return _einsum(equation, *tensors)


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


def _pairwise(terms: list[str], out: str, tensors: Sequence[Tensor]) -> Tensor:
    """``tensors`` contracted left to right as torch's CPU kernel: a pair summing a shared index is a
    ``bmm`` (cast as autocast casts one), another a ``mul`` (its float dtypes promoted)."""
    acc, held = tensors[0], terms[0]
    for i in range(1, len(tensors)):
        t, term = tensors[i], terms[i]
        later = out + "".join(terms[i + 1:])
        keep = out if i == len(tensors) - 1 else "".join(dict.fromkeys(c for c in held + term if c in later))
        summed = [c for c in set(held) & set(term)
                  if c not in later and not _size_one(acc, held, c) and not _size_one(t, term, c)]
        a, b = cast_as("bmm", acc, t) if summed else promoted(acc, t)
        acc, held = _einsum(f"{held},{term}->{keep}", a, b), keep
    return acc


__all__ = ["einsum"]
