"""Adam's and AdamW's moments as their state holds them: the slot names of each form, and
checkpoints of earlier forms turned into today's.

PyTorch keeps averages, ``exp_avg = (1-b1) * sum_i b1^(t-i) g_i`` and ``exp_avg_sq`` likewise of
``g*g`` (and with amsgrad ``max_exp_avg_sq``, the running maximum of the second). graphc keeps
the sums, ``exp_sum = exp_avg / (1-b1)`` and ``exp_sum_sq = exp_avg_sq / (1-b2)`` (amsgrad's
``max_exp_sum_sq``: a max commutes with the positive factor): ``b*sum + x``, one full-size pass
fewer than the average's ``b*avg + (1-b)*x``, the factors moving onto the step's scalars. A
float16 or bfloat16 param's second moment stays the average: its sum nears ``g*g / (1-b2)``,
past float16's range from |g| = 8 at b2 = 0.999 (the average lasts to 256), and a param whose
sum is inf stops moving without a word; float32's sum overflows from |g| ~ 5.8e17 (the average
from 1.8e19). A spec's JSON asks for an average with ``"first_moment": "average"`` (a scheduled
beta1, training artifacts of format 3 and before) or ``"second_moment": "average"`` (artifacts
of format 5 and before)."""

from __future__ import annotations

from collections.abc import Container, Mapping

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import HALF_DTYPES

SUM, AVERAGE = "sum", "average"
# (slot as a sum, slot as PyTorch's average, index of its beta in ``betas``)
FIRST = ("exp_sum", "exp_avg", 0)
SECOND = ("exp_sum_sq", "exp_avg_sq", 1)
MAX_SECOND = ("max_exp_sum_sq", "max_exp_avg_sq", 1)  # amsgrad's
_AS_SUM = {average: (total, beta) for total, average, beta in (FIRST, SECOND, MAX_SECOND)}


def forms(optimizer: dict, dtype: ir.DataType | None = None) -> tuple[str, str]:
    """The forms (``SUM`` or ``AVERAGE``) of the first and second moment that an Adam or AdamW
    spec (its JSON) keeps for params of ``dtype`` (None: float32)."""
    second = AVERAGE if dtype in HALF_DTYPES else optimizer.get("second_moment", SUM)
    return optimizer.get("first_moment", SUM), second


def slots(first: str, second: str, amsgrad: bool) -> tuple[str, ...]:
    """The state slots of moments of these forms: first, second and, with amsgrad, its maximum."""
    def named(moment, form):
        return moment[0] if form == SUM else moment[1]
    return (named(FIRST, first), named(SECOND, second), *((named(MAX_SECOND, second),) if amsgrad else ()))


def sum_name(name: str, wanted: Container[str]) -> str:
    """The name today's graphs give ``name``, a tensor of a checkpoint that ``wanted`` (names)
    should fit: ``<p>.exp_sum`` for ``<p>.exp_avg``, ``<p>.exp_sum_sq`` for ``<p>.exp_avg_sq``,
    ``<p>.max_exp_sum_sq`` for ``<p>.max_exp_avg_sq`` (earlier graphc's averages) where
    ``wanted`` has the sum and not the average; else ``name`` itself."""
    param, _, slot = name.rpartition(".")
    if slot not in _AS_SUM or not param:
        return name
    renamed = f"{param}.{_AS_SUM[slot][0]}"
    return renamed if renamed in wanted and name not in wanted else name


def moments_as_sums(tensors: Mapping[str, np.ndarray], optimizer: dict,
                    wanted: Container[str]) -> dict[str, np.ndarray]:
    """``tensors`` (a checkpoint's, named per param) with each moment that ``sum_name`` renames
    turned into its sum, the average over ``1 - beta`` (rounded once): checkpoints saved by
    earlier graphc resume. Other tensors as they are."""
    if optimizer["kind"] not in ("adam", "adamw"):
        return dict(tensors)
    betas = optimizer.get("betas", (0.9, 0.999))
    out = {}
    for name, array in tensors.items():
        new = sum_name(name, wanted)
        beta = None if new == name else betas[_AS_SUM[name.rpartition(".")[2]][1]]
        out[new] = array if beta is None else array / array.dtype.type(1.0 - beta)
    return out


def moments_rebased(tensors: Mapping[str, np.ndarray], was: dict, now: dict) -> dict[str, np.ndarray]:
    """``tensors`` (a checkpoint's, named per param, its moments already in today's names) of a
    run with spec ``was`` resumed by graphs of spec ``now``: each moment kept as a sum rescaled
    from ``was``'s beta to ``now``'s, so it holds the same average (torch's ``exp_avg`` and
    ``exp_avg_sq``, which changed betas keep). Averages and other tensors as they are."""
    if any(spec.get("kind") not in ("adam", "adamw") for spec in (was, now)):
        return dict(tensors)
    b_was, b_now = (spec.get("betas", (0.9, 0.999)) for spec in (was, now))
    by_slot = {total: beta for total, _, beta in (FIRST, SECOND, MAX_SECOND)}
    out = {}
    for name, array in tensors.items():
        beta = by_slot.get(name.rpartition(".")[2])
        same = beta is None or b_was[beta] == b_now[beta]
        out[name] = array if same else array * array.dtype.type((1.0 - b_was[beta]) / (1.0 - b_now[beta]))
    return out
