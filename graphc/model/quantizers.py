"""The record ``gc.capture`` keeps of a model's fake quantizations (model metadata ``FAKE_QUANTIZERS_KEY``, a
JSON list): each ``gc.nn.FakeQuantize`` that fake-quantizes, by module path, whether its observer had seen
data when captured (``observed``) and, where the captured graph runs the observer (training mode), the names
of the statistics training updates (``stats``: ``min_val``, ``max_val``). An export, a deploy and a server read
it to find the quantizations that would deploy their initial scale 1.0 and zero point 0; ``gc.optimize`` keeps
it, so an optimized capture is refused there too, and an exported or deployed file no longer holds it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from graphc.errors import first_few

__all__ = ["FAKE_QUANTIZERS_KEY", "never_calibrated", "never_observed", "uncalibrated", "without_record"]

FAKE_QUANTIZERS_KEY = "graphc.fake_quantizers"


def never_observed(min_val: np.ndarray, max_val: np.ndarray) -> bool:
    """Whether an observer's statistics are still their initial ``inf``/``-inf`` (torch's test before it
    warns "must run observer before calling calculate_qparams"), every channel of a per-channel one."""
    return bool(np.all(np.asarray(min_val) == np.inf) and np.all(np.asarray(max_val) == -np.inf))


def never_calibrated(names: Sequence[str]) -> str:
    """What is wrong with the fake quantizations ``names`` and how to calibrate them, for the refusals of
    ``graphc.compile.export.check_calibrated`` and ``graphc run``'s warning."""
    n = len(names)
    return (f"{n} fake quantization{'s were' if n > 1 else ' was'} never calibrated ({first_few(names)}): the "
            "observers never saw data (min_val inf, max_val -inf), so the model would quantize with the scale and "
            "zero point they were built with (1.0 and 0 unless set by hand) and compute garbage; a gc.capture "
            "without training=True never runs them (gc.nn modules start in eval mode): capture with training=True, "
            "then train or calibrate (Trainer steps at lr=0 update the observers, not the weights)")


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


def without_record(model: ir.Model) -> ir.Model:
    """``model`` without the record: itself where it has none, else a copy (the caller's model unchanged). A
    deployed file holds what was checked, not what capture saw."""
    if FAKE_QUANTIZERS_KEY not in model.metadata_props:
        return model
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    del copy.metadata_props[FAKE_QUANTIZERS_KEY]
    return copy
