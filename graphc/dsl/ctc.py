"""``torch.nn.functional.ctc_loss``: the connectionist temporal classification loss.

The alpha (forward) recursion of Graves et al. in log space, over each example's extended label
sequence (a blank before, between and after its labels: 2S+1 states), one ``gc.scan`` step (an
ONNX ``Scan``) per time step. A state reads itself, the state before it, and the one two before
it when that is a different label (never across a blank or a repeated label). Steps past an
example's input length leave its states as they are; the loss reads the last state and the one
before it (the last label) at the example's target length. The gradient is autodiff's through the
Scan, the exact one with respect to ``log_probs`` (torch's adds ``exp(log_probs)``, which cancels
through a ``log_softmax``). log(0) is the finite ``_NEG``, so no log-sum-exp is ever of all ``-inf`` (its gradient would
be NaN); a loss that no path reaches is ``inf``, or 0 with ``zero_infinity`` (its gradient 0 then,
as torch's; without ``zero_infinity`` torch's gradient of such a loss is NaN, graphc's is 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl import ops, ops_array
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.control import scan
from graphc.dsl.losses import check_reduction
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError

__all__ = ["ctc_loss"]

_OP = "ctc_loss"
_NEG = -1e30  # log(0) as a number: exp(_NEG - m) is exactly 0 for any reached m
_UNREACHED = 1e29  # a negative log-likelihood past this read no path through the states
_INT_DTYPES = ("int64", "int32")


@autocast_op()
def ctc_loss(log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """``torch.nn.functional.ctc_loss``: ``log_probs`` (T, N, C) (or unbatched (T, C)) float32 or
    float64 log-softmax outputs; ``targets`` padded (N, S) or concatenated 1-D (the unbatched one
    too); ``input_lengths`` and ``target_lengths`` (N,) int Tensors (graph inputs, one length an
    example) or Python ints. ``reduction="mean"`` divides each loss by its target length (at least
    1) and averages over the batch. Signature: ai.onnx@21::Scan"""
    check_reduction(_OP, reduction)
    lp = ops.lift(log_probs)
    if lp.dtype not in ("float32", "float64"):
        raise op_error(_OP, [lp], f"log_probs must be float32 or float64, got {lp.dtype}", user_source())
    if lp.ndim not in (2, 3):
        raise op_error(_OP, [lp], f"log_probs must be (T, N, C) or unbatched (T, C), got rank {lp.ndim}",
                       user_source())
    classes = lp.shape[-1]
    if blank < 0 or (isinstance(classes, int) and blank >= classes):
        raise CaptureError(f"{_OP}: blank must be in [0, C = {classes}), got {blank} (at {user_source()})")
    batched = lp.ndim == 3
    lp = lp if batched else ops.unsqueeze(lp, [1])
    t_len = lp.shape[0]
    in_len, in_static = _lengths("input_lengths", input_lengths, batched, lp.shape[1])
    tgt_len, tgt_static = _lengths("target_lengths", target_lengths, batched, lp.shape[1])
    if in_static is not None and isinstance(t_len, int) and (in_static > t_len).any():
        raise CaptureError(f"{_OP}: input_lengths {in_static.tolist()} must be at most T = {t_len} "
                           f"(at {user_source()})")
    labels = _padded_targets(ops.lift(targets), tgt_len, tgt_static, batched, blank)
    loss = _negative_log_likelihood(lp, _extended(labels, blank), in_len, tgt_len, blank)
    loss = ops.where(loss > _UNREACHED, ops.scalar(0.0 if zero_infinity else np.inf, loss), loss)
    loss = ops.where(_bad_lengths(in_len, tgt_len, lp), ops.scalar(np.nan, loss), loss)
    if reduction == "mean":
        return ops.mean(loss / ops.cast(ops.maximum(tgt_len, 1), loss.dtype))
    if reduction == "sum":
        return ops.sum(loss)
    return loss if batched else ops.squeeze(loss, [0])


def _bad_lengths(in_len: Tensor, tgt_len: Tensor, lp: Tensor) -> Tensor:
    """(N,) bool: an input length outside [0, T] or a negative target length, which torch refuses
    ("Expected input_lengths to have value at most 6") and the graph would read as a wrong loss:
    ``ctc_loss`` makes that example's loss NaN (lengths given as Python ints are refused at capture)."""
    zero = ops.scalar(0, in_len)
    return (in_len < zero) | (in_len > ops_array.dim_length(lp, 0)) | (tgt_len < zero)


def _lengths(name: str, value: Any, batched: bool, n: Any) -> tuple[Tensor, np.ndarray | None]:
    """``value`` as an int64 (N,) Tensor, and its values where the Python caller gave them."""
    if isinstance(value, Tensor):
        if value.dtype not in _INT_DTYPES or value.ndim != (1 if batched else value.ndim) or value.ndim > 1:
            raise op_error(_OP, [value], f"{name} must be an int64 or int32 {'(N,)' if batched else '0-d or (1,)'} "
                           f"Tensor, got {value.dtype} of rank {value.ndim}", user_source())
        return ops.cast(ops.reshape(value, [-1]) if not batched else value, "int64"), None
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.ndim > 1 or (batched and array.ndim != 1) or \
            (not batched and array.size != 1) or (isinstance(n, int) and array.size != n) or (array < 0).any():
        raise CaptureError(f"{_OP}: {name} must be {'N = ' + str(n) if batched else 'one'} non-negative int(s), "
                           f"got {value!r} (at {user_source()})")
    array = array.reshape(-1).astype(np.int64)
    return ops.constant(array), array


def _padded_targets(targets: Tensor, lengths: Tensor, static: np.ndarray | None, batched: bool,
                    blank: int) -> Tensor:
    """The labels as (N, S), ``blank`` past each example's target length: padded targets as they
    are; concatenated ones gathered from their offsets (S is the longest target where the lengths
    are Python ints, else the concatenation's length)."""
    if targets.dtype not in _INT_DTYPES or targets.ndim != (2 if batched and targets.ndim == 2 else 1):
        raise op_error(_OP, [targets], f"targets must be int64 or int32, (N, S) padded or 1-D concatenated, got "
                       f"{targets.dtype} of rank {targets.ndim}", user_source())
    targets = ops.cast(targets, "int64")
    size = targets.shape[-1]
    if targets.ndim == 2:
        if static is not None and isinstance(size, int) and (static > size).any():
            raise CaptureError(f"{_OP}: target_lengths {static.tolist()} must be at most S = {size}, the padded "
                               f"targets' width (at {user_source()})")
        within = ops_array.arange(ops_array.dim_length(targets, 1)) < ops.unsqueeze(lengths, [1])
        return ops.where(within, targets, ops.scalar(blank, targets))
    if static is not None and isinstance(size, int) and int(static.sum()) != size:
        raise CaptureError(f"{_OP}: concatenated targets must hold sum(target_lengths) = {int(static.sum())} "
                           f"labels, got {size} (at {user_source()})")
    width = int(static.max(initial=0)) if static is not None else ops_array.dim_length(targets, 0)
    positions = ops.unsqueeze(ops_array.arange(width), [0])
    ends = ops.unsqueeze(lengths, [1])
    starts = ops.unsqueeze(ops_array.cumsum(lengths, 0), [1]) - ends
    past = ops_array.dim_length(targets, 0)  # the blank appended below
    index = ops.where(positions < ends, starts + positions, past)
    with_blank = ops.concat([targets, ops.constant(np.asarray([blank], np.int64))], 0)
    return ops.emit("Gather", [with_blank, index], {"axis": 0})


def _extended(labels: Tensor, blank: int) -> Tensor:
    """(N, 2S+1): ``blank, l1, blank, l2, ..., lS, blank``."""
    pairs = ops.stack([ops_array.full_like(labels, blank), labels], 2)
    return ops_array.pad(ops.flatten(pairs, 1), [0, 1], value=blank)


def _logsumexp(terms: list[Tensor]) -> Tensor:
    """log(sum(exp(terms))), shifted by their (detached: it cancels) maximum."""
    top = terms[0]
    for t in terms[1:]:
        top = ops.maximum(top, t)
    top = ops.detach(top)
    total = ops.exp(terms[0] - top)
    for t in terms[1:]:
        total = total + ops.exp(t - top)
    return top + ops.log(total)


def _negative_log_likelihood(lp: Tensor, ext: Tensor, in_len: Tensor, tgt_len: Tensor, blank: int) -> Tensor:
    """-log p(labels | log_probs) for each example, (N,): the alpha recursion (module docstring)."""
    steps = ops_array.dim_length(lp, 0)
    index = ops.emit("Expand", [ops.unsqueeze(ext, [0]), ops.concat([steps, ops.const_i64([1, 1])], 0)])
    emissions = ops_array.gather(lp, 2, index)  # (T, N, K): each state's label's log-probability
    before_two = ops_array.pad(ext, [2, 0], value=blank)[:, :-2]
    skips = (ext != ops.scalar(blank, ext)) & (ext != before_two)
    state = ops_array.arange(ops_array.dim_length(ext, 1))
    neg = ops.scalar(_NEG, lp)
    never_started = ops.where(state == ops.scalar(0, state), ops.scalar(0.0, lp), neg)  # input length 0
    first = ops.where(state < ops.scalar(2, state), emissions[0], neg)
    alpha = ops.where(ops.unsqueeze(in_len > ops.scalar(0, in_len), [1]), first, never_started)
    running = ops.unsqueeze(ops_array.arange(1, steps), [1]) < ops.unsqueeze(in_len, [0])  # (T-1, N)

    def step(alpha: Tensor, inputs: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple]:
        emitted, live = inputs
        shifted = ops_array.pad(alpha, [2, 0], value=_NEG)
        reached = _logsumexp([alpha, shifted[:, 1:-1], ops.where(skips, shifted[:, :-2], neg)]) + emitted
        return ops.where(ops.unsqueeze(live, [1]), reached, alpha), ()

    alpha, _ = scan(step, alpha, (emissions[1:], running))
    last = ops.unsqueeze(tgt_len * ops.scalar(2, tgt_len), [1])
    end = ops_array.gather(alpha, 1, last)
    label = ops_array.gather(alpha, 1, ops.maximum(last - ops.scalar(1, last), ops.scalar(0, last)))
    label = ops.where(ops.unsqueeze(tgt_len > ops.scalar(0, tgt_len), [1]), label, neg)
    return -ops.squeeze(_logsumexp([end, label]), [1])
