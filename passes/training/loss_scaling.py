"""Loss scaling in train_step, as ``torch.amp.GradScaler`` on CPU: ``scaler.scale(loss).backward();
scaler.unscale_(opt); [clip]; scaler.step(opt); scaler.update()``.

The scale (``loss_scale``, a float32 scalar) and the growth tracker (``loss_scale.growth_tracker``,
int32) are train_step state, carried from step to step as the params are. ``spec`` is the
manifest's ``loss_scale`` (``graphc.compile.amp.loss_scale_json``).

* ``seed``: the backward starts from ``scale`` cast to the loss's dtype (the gradient of ``loss *
  scale``: a float16 loss's seed of 2**16 is inf, as torch's), so every gradient is the scaled
  loss's, in its own dtype.
* ``unscale``: each gradient (a flat buffer of the fused update, else a param's) times ``inv =
  float32(1 / float64(scale))``, computed in float32 for float16/bfloat16 gradients and rounded
  back, in float64 for float64 ones; ``found_inf`` is whether any entry of the *scaled* gradients
  is inf or NaN (torch's ``_amp_foreach_non_finite_check_and_unscale_``), read off one
  ``ReduceSum(g * 0)`` per buffer (0 for finite entries, NaN for any other), ORed.
* ``held_step`` and ``kept``: on ``found_inf`` each carried value keeps its input (the step's
  ``delta`` is 0 and ``shrink`` 1, so a param is written as ``param * 1 - 0``, bit for bit the
  same, by the node that writes it without loss scaling; the optimizer state and ``step`` by a
  ``Where``); ``guarded_params.Gates`` calls them, with a param's own skip condition too.
* ``update``: torch's ``_amp_update_scale_``: ``found_inf``: ``scale * backoff_factor``, tracker
  0; else the tracker + 1, and at ``growth_interval`` ``scale * growth_factor`` (kept only if
  finite) and tracker 0; the products in float64 rounded to float32, as torch's CPU kernel. A
  static scale stays as it is. ``loss_scale.skipped_steps`` (int64, state too) counts the skipped
  steps, for ``fit``'s records.
* ``scaled_gradients``: the gradients graph with those unscaling nodes taken off its outputs, for
  data-parallel workers, whose combined gradients the update graph checks and unscales once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import HALF_DTYPES, Emitter

__all__ = ["LOSS_SCALE", "SKIPPED", "TRACKER", "Scaler", "held_step", "initial_state", "kept", "scaled_gradients", "seed",
           "state_names"]

LOSS_SCALE = "loss_scale"
TRACKER = "loss_scale.growth_tracker"
SKIPPED = "loss_scale.skipped_steps"
_F32, _F64 = ir.DataType.FLOAT, ir.DataType.DOUBLE


def state_names(spec: dict | None) -> tuple[str, ...]:
    """The train_step state inputs loss scaling adds: the scale, the tracker of a dynamic one, the
    count of skipped steps."""
    if spec is None:
        return ()
    return (LOSS_SCALE, TRACKER, SKIPPED) if spec["kind"] == "dynamic" else (LOSS_SCALE, SKIPPED)


def initial_state(spec: dict | None) -> dict[str, np.ndarray]:
    """Their values before the first step (torch's: ``init_scale`` as float32, tracker 0 int32; 0
    steps skipped, int64)."""
    values = {LOSS_SCALE: np.array(spec["init_scale"], np.float32), TRACKER: np.array(0, np.int32),
              SKIPPED: np.array(0, np.int64)} if spec else {}
    return {n: values[n] for n in state_names(spec)}


def seed(b: Emitter, scale: ir.Value, loss: ir.Value) -> ir.Value:
    """The backward's seed factor: ``scale`` in the loss's dtype."""
    return scale if loss.dtype == scale.dtype else b.op("Cast", scale, to=loss.dtype, dtype=loss.dtype)


def _inverse(b: Emitter, scale: ir.Value) -> ir.Value:
    """``float32(1 / float64(scale))``, torch's ``scale.double().reciprocal().float()``."""
    wide = b.op("Reciprocal", b.op("Cast", scale, to=_F64, dtype=_F64), dtype=_F64)
    return b.op("Cast", wide, to=_F32, dtype=_F32)


def unscale(b: Emitter, scale: ir.Value, grads: Sequence[ir.Value], dtypes: Sequence[ir.DataType],
            check: bool = True) -> tuple[list[ir.Value], ir.Value | None]:
    """``grads`` (of ``dtypes``) times 1/scale, and (with ``check``) the bool scalar ``found_inf``."""
    inv = _inverse(b, scale)
    inv64 = b.op("Cast", inv, to=_F64, dtype=_F64) if _F64 in dtypes else None
    out, flags = [], []
    for g, dt in zip(grads, dtypes):
        if dt in HALF_DTYPES:
            wide = b.op("Mul", b.op("Cast", g, to=_F32, dtype=_F32), inv, dtype=_F32)
            out.append(b.op("Cast", wide, to=dt, dtype=dt))
        else:
            out.append(b.op("Mul", g, inv64 if dt == _F64 else inv, dtype=dt))
        if check:  # 0 where finite, NaN where not: a NaN sum says some entry was inf or NaN
            flag = b.op("ReduceSum", b.op("Mul", g, b.const(0, dt), dtype=dt), keepdims=0, dtype=dt)
            flags.append(flag if dt == _F32 else b.op("Cast", flag, to=_F32, dtype=_F32))
    if not check:
        return out, None
    total = b.op("Sum", *flags, dtype=_F32) if len(flags) > 1 else flags[0]
    return out, b.op("IsNaN", total, dtype=ir.DataType.BOOL)


def held_step(b: Emitter, skip: ir.Value, delta: ir.Value, shrink: ir.Value | None) -> tuple[ir.Value, ir.Value | None]:
    """A step that leaves the param as it is where the bool scalar ``skip`` holds: delta 0 and
    shrink 1 (``param * 1 - 0``, bit for bit the param, by the node that writes it anyway)."""
    delta = b.op("Where", skip, b.const(0, delta.dtype), delta, dtype=delta.dtype)
    if shrink is not None:
        shrink = b.op("Where", skip, b.const(1, shrink.dtype), shrink, dtype=shrink.dtype)
    return delta, shrink


def kept(b: Emitter, skip: ir.Value, old: ir.Value, new: ir.Value) -> ir.Value:
    """``new``, or ``old`` where the bool scalar ``skip`` holds (optimizer state, a step count)."""
    return b.op("Where", skip, old, new, dtype=new.dtype if new.dtype is not None else old.dtype)


@dataclass
class Scaler:
    """The loss-scaling nodes of one train_step: its scale input and ``found_inf``."""

    b: Emitter
    spec: dict
    scale: ir.Value
    found_inf: ir.Value | None = None

    def unscale(self, grads: Sequence[ir.Value], dtypes: Sequence[ir.DataType],
                found_inf: ir.Value | None = None) -> list[ir.Value]:
        """``grads`` unscaled; ``found_inf``: the bool scalar to skip on (every shard's, ORed, for a
        sharded update), else it is read off ``grads``."""
        grads, found = unscale(self.b, self.scale, grads, dtypes, check=found_inf is None)
        self.found_inf = found if found_inf is None else found_inf
        return grads

    def update(self, tracker: ir.Value | None, skipped: ir.Value) -> dict[str, ir.Value]:
        """{state input name: its next value}: the scale's, the tracker's, the skipped steps'."""
        b, spec, found = self.b, self.spec, self.found_inf
        count_skip = {SKIPPED: b.op("Add", skipped, b.op("Cast", found, to=ir.DataType.INT64, dtype=ir.DataType.INT64),
                                    dtype=ir.DataType.INT64)}
        if spec["kind"] != "dynamic":
            return {LOSS_SCALE: self.scale, **count_skip}
        wide = b.op("Cast", self.scale, to=_F64, dtype=_F64)

        def times(factor: float) -> ir.Value:
            return b.op("Cast", b.op("Mul", wide, b.const(factor, _F64), dtype=_F64), to=_F32, dtype=_F32)

        grown = times(spec["growth_factor"])
        finite = b.op("Not", b.op("IsInf", grown))  # a finite scale times a finite factor is never NaN
        successful = b.op("Add", tracker, b.const(1, np.int32), dtype=ir.DataType.INT32)
        grow = b.op("Equal", successful, b.const(spec["growth_interval"], np.int32))
        scale = b.op("Where", grow, b.op("Where", finite, grown, self.scale, dtype=_F32), self.scale, dtype=_F32)
        zero = b.const(0, np.int32)
        count = b.op("Where", grow, zero, successful, dtype=ir.DataType.INT32)
        return {LOSS_SCALE: b.op("Where", found, times(spec["backoff_factor"]), scale, dtype=_F32),
                TRACKER: b.op("Where", found, zero, count, dtype=ir.DataType.INT32), **count_skip}


def scaled_gradients(model: ir.Model) -> ir.Model:
    """A copy of a loss-scaled gradients graph whose ``<param>_grad`` outputs are the scaled
    loss's gradients: each output's ``unscale`` product (``Mul(g, inv)``, for a half float
    ``Cast(Mul(Cast(g), inv))``) replaced by its ``g``. Any other structure is a ``PassError``."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    from graphc.errors import PassError
    from graphc.passes.training.graph_outputs import expose

    model = model.clone()
    graph = model.graph
    outputs = list(graph.outputs)
    for i, out in enumerate(outputs):
        if not out.name.endswith("_grad"):
            continue
        node, half = out.producer(), False
        if node is not None and node.op_type == "Cast":
            node, half = node.inputs[0].producer(), True
        if node is None or node.op_type != "Mul" or not node.name.startswith(f"{LOSS_SCALE}/"):
            raise PassError(f"gradients graph output {out.name!r} is not unscaled as loss scaling emits it")
        grad = node.inputs[0]
        if half:
            grad = grad.producer().inputs[0]
        name, out.name = out.name, None
        graph.outputs.clear()
        graph.outputs.extend(outputs[:i])
        expose(graph, grad, name, like=out)
        outputs[i] = graph.outputs[-1]
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    RemoveUnusedNodesPass()(model)
    return model
