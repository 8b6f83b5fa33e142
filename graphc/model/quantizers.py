"""The record ``gc.capture`` keeps of a model's fake quantizations (model metadata ``FAKE_QUANTIZERS_KEY``, a
JSON list): each ``gc.nn.FakeQuantize`` that fake-quantizes, by module path, whether its observer had seen
data when captured (``observed``) and, where the captured graph runs the observer (training mode), the names
of the statistics training updates (``stats``: ``min_val``, ``max_val``). An export reads it to find the
quantizations that would deploy their initial scale 1.0 and zero point 0."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

__all__ = ["FAKE_QUANTIZERS_KEY", "never_observed", "first_few", "uncalibrated"]

FAKE_QUANTIZERS_KEY = "graphc.fake_quantizers"
SHOWN = 3  # names listed in a message before "and N more"


def never_observed(min_val: np.ndarray, max_val: np.ndarray) -> bool:
    """Whether an observer's statistics are still their initial ``inf``/``-inf`` (torch's test before it
    warns "must run observer before calling calculate_qparams"), every channel of a per-channel one."""
    return bool(np.all(np.asarray(min_val) == np.inf) and np.all(np.asarray(max_val) == -np.inf))


def first_few(names: Sequence[str]) -> str:
    """``a, b, c and 4 more`` (``SHOWN`` names, then the count of the others)."""
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def uncalibrated(model: ir.Model, tensors: Mapping[str, np.ndarray] | None = None) -> list[str]:
    """The module paths of ``model``'s recorded fake quantizations whose observer never saw data: their
    ``stats`` as in ``tensors`` (trained state) or else ``model``'s initializers, where recorded and
    present; else as captured."""
    found = []
    for entry in json.loads(model.metadata_props.get(FAKE_QUANTIZERS_KEY, "[]")):
        stats = [_array(model, tensors or {}, name) for name in entry.get("stats", ())]
        seen = not never_observed(*stats) if stats and all(s is not None for s in stats) else entry["observed"]
        if not seen:
            found.append(entry["module"])
    return found


def _array(model: ir.Model, tensors: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    if name in tensors:
        return np.asarray(tensors[name])
    value = model.graph.initializers.get(name)
    return None if value is None or value.const_value is None else value.const_value.numpy()
