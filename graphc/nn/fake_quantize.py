"""``gc.nn.FakeQuantize`` with torch.ao.quantization's observers (``MinMaxObserver``,
``MovingAverageMinMaxObserver``, ``PerChannelMinMaxObserver``): statistics, ``scale`` and ``zero_point`` are
buffers under torch's ``state_dict`` keys, updated by the training graphs (buffer writes, as BatchNorm's
running statistics) and read as stored in eval mode; ``calculate_qparams`` is torch's."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.builder import Builder, active, op_error, user_source
from graphc.dsl.ops_fake_quantize import (
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
)
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError, UncalibratedWarning, first_few
from graphc.model.quantizers import FAKE_QUANTIZERS_KEY, never_observed
from graphc.nn.module import Module, Parameter

# torch's default ranges (quant_min, quant_max), and with reduce_range
_RANGES = {"quint8": ((0, 255), (0, 127)), "qint8": ((-128, 127), (-64, 63))}
_SCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric")


class _Observer(Module):
    """torch's ``UniformQuantizationObserverBase``: the range, ``eps`` (a buffer) and ``calculate_qparams``."""

    def __init__(self, dtype: str, qscheme: str, reduce_range: bool, quant_min: int | None, quant_max: int | None,
                 eps: float, shape: tuple):
        super().__init__()
        if dtype not in _RANGES:
            raise CaptureError(f"{type(self).__name__}: dtype must be one of {sorted(_RANGES)}, got {dtype!r}")
        if qscheme not in _SCHEMES:
            raise CaptureError(f"{type(self).__name__}: qscheme must be one of {_SCHEMES}, got {qscheme!r}")
        if (quant_min is None) != (quant_max is None):
            raise CaptureError(f"{type(self).__name__}: give both quant_min and quant_max or neither")
        if quant_min is None:
            quant_min, quant_max = _RANGES[dtype][bool(reduce_range)]
        elif reduce_range:
            raise CaptureError(f"{type(self).__name__}: reduce_range with a custom quant_min/quant_max is not "
                               f"supported (torch halves the custom range); give the reduced range")
        elif not quant_min <= 0 <= quant_max:
            raise CaptureError(f"{type(self).__name__}: Used-specified quantization range must include 0, got "
                               f"[{quant_min}, {quant_max}]")
        if qscheme.startswith("per_channel") != bool(shape):
            raise CaptureError(f"{type(self).__name__}: qscheme {qscheme!r} is not supported here")
        self.dtype, self.qscheme, self.reduce_range = dtype, qscheme, reduce_range
        self.quant_min, self.quant_max = int(quant_min), int(quant_max)
        self.eps = Parameter(np.array([eps], np.float32), buffer=True)
        self.min_val = Parameter(np.full(shape, np.inf, np.float32), buffer=True)
        self.max_val = Parameter(np.full(shape, -np.inf, np.float32), buffer=True)

    def calculate_qparams(self) -> tuple[Tensor, Tensor]:
        """torch's ``_calculate_qparams``: ``(scale float32, zero_point int32)``, ``(1, 0)`` before any
        observation (min_val inf, max_val -inf)."""
        lo, hi = ops.lift(self.min_val), ops.lift(self.max_val)
        zero = ops.scalar(0.0, lo)
        neg, pos = ops.minimum(lo, zero), ops.maximum(hi, zero)
        eps = ops.reshape(ops.lift(self.eps), [])
        qmin, qmax = self.quant_min, self.quant_max
        if self.qscheme.endswith("symmetric"):
            scale = ops.maximum(ops.maximum(-neg, pos) / ops.scalar((qmax - qmin) / 2, lo), eps)
            mid = (qmin + qmax) // 2 if self.dtype == "quint8" else 0
            zp = ops.lift(np.full(self.min_val.shape, mid, np.int32))
        else:
            scale = ops.maximum((pos - neg) / ops.scalar(float(qmax - qmin), lo), eps)
            zp = ops.scalar(qmin, lo) - ops.unary("Round", neg / scale)
            zp = ops.cast(ops.clip(zp, float(qmin), float(qmax)), "int32")
        unseen = (lo == ops.scalar(np.inf, lo)) & (hi == ops.scalar(-np.inf, hi))
        scale = ops.where(unseen, ops.scalar(1.0, scale), scale)
        zp = ops.where(unseen, ops.scalar(0, zp), zp)
        shape = [1] if scale.ndim == 0 else [-1]
        return ops.reshape(scale, shape), ops.reshape(zp, shape)

    def _observe(self, cur_min: Tensor, cur_max: Tensor) -> None:
        with_old = self._combine(ops.lift(self.min_val), ops.lift(self.max_val), cur_min, cur_max)
        self.min_val.copy_(with_old[0])
        self.max_val.copy_(with_old[1])

    def forward(self, x: Any) -> Tensor:
        x = ops.detach(ops.lift(x))
        xf = ops.cast(x, "float32") if x.dtype != "float32" else x
        self._observe(*self._minmax(xf))
        return x


class MinMaxObserver(_Observer):
    """torch's ``MinMaxObserver``: the running min and max of everything observed."""

    def __init__(self, dtype: str = "quint8", qscheme: str = "per_tensor_affine", reduce_range: bool = False,
                 quant_min: int | None = None, quant_max: int | None = None, eps: float = float(np.finfo(np.float32).eps)):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, ())

    def _minmax(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return ops.min(x), ops.max(x)

    def _combine(self, old_min, old_max, cur_min, cur_max):
        return ops.minimum(cur_min, old_min), ops.maximum(cur_max, old_max)


class MovingAverageMinMaxObserver(MinMaxObserver):
    """torch's ``MovingAverageMinMaxObserver``: the first batch's min and max, then
    ``old + averaging_constant * (new - old)``."""

    def __init__(self, averaging_constant: float = 0.01, dtype: str = "quint8", qscheme: str = "per_tensor_affine",
                 reduce_range: bool = False, quant_min: int | None = None, quant_max: int | None = None,
                 eps: float = float(np.finfo(np.float32).eps)):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.averaging_constant = averaging_constant

    def _combine(self, old_min, old_max, cur_min, cur_max):
        first = (old_min == ops.scalar(np.inf, old_min)) & (old_max == ops.scalar(-np.inf, old_max))
        c = ops.scalar(self.averaging_constant, old_min)
        return (ops.where(first, cur_min, old_min + c * (cur_min - old_min)),
                ops.where(first, cur_max, old_max + c * (cur_max - old_max)))


class PerChannelMinMaxObserver(_Observer):
    """torch's ``PerChannelMinMaxObserver`` along ``ch_axis``. ``num_channels`` (graphc's): torch's buffers
    start empty and take the channel count at the first call, graphc's have it from the start."""

    def __init__(self, ch_axis: int = 0, dtype: str = "quint8", qscheme: str = "per_channel_affine",
                 reduce_range: bool = False, quant_min: int | None = None, quant_max: int | None = None,
                 eps: float = float(np.finfo(np.float32).eps), *, num_channels: int):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, (int(num_channels),))
        self.ch_axis = ch_axis

    def _minmax(self, x: Tensor) -> tuple[Tensor, Tensor]:
        axes = [a for a in range(x.ndim) if a != self.ch_axis % x.ndim]
        return ops.min(x, axes), ops.max(x, axes)

    _combine = MinMaxObserver._combine


class FakeQuantize(Module):
    """torch.ao.quantization's ``FakeQuantize``: ``observer(quant_min=, quant_max=, **observer_kwargs)`` is
    ``activation_post_process``; in training mode with ``observer_enabled`` it observes the input and writes
    ``scale``/``zero_point`` from its ``calculate_qparams``, then with ``fake_quant_enabled`` fake-quantizes
    with them (per tensor, or per channel along the observer's ``ch_axis``). The flags (uint8 buffers, torch's
    keys) are read when the module is captured: after ``disable_observer``/``disable_fake_quant`` capture
    again (and load the trained state) for the graphs to follow them. Eval mode reads the stored ``scale``/``zero_point`` (torch's eval forward
    still observes while ``observer_enabled``; disable it, as torch's QAT recipes do)."""

    def __init__(self, observer: type = MovingAverageMinMaxObserver, quant_min: int | None = None,
                 quant_max: int | None = None, **observer_kwargs: Any):
        super().__init__()
        self.activation_post_process = observer(quant_min=quant_min, quant_max=quant_max, **observer_kwargs)
        obs = self.activation_post_process
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.is_per_channel = obs.qscheme.startswith("per_channel")
        self.ch_axis = getattr(obs, "ch_axis", -1)
        shape = obs.min_val.shape or (1,)
        self.fake_quant_enabled = Parameter(np.array([1], np.uint8), buffer=True)
        self.observer_enabled = Parameter(np.array([1], np.uint8), buffer=True)
        self.scale = Parameter(np.ones(shape, np.float32), buffer=True)
        self.zero_point = Parameter(np.zeros(shape, np.int32), buffer=True)

    def calculate_qparams(self) -> tuple[Tensor, Tensor]:
        return self.activation_post_process.calculate_qparams()

    def _enabled(self, flag: str) -> bool:
        return bool(self._parameters[flag].numpy()[0] == 1)

    def forward(self, x: Any) -> Tensor:
        x = ops.lift(x)
        if self.training and self._enabled("observer_enabled"):
            self.activation_post_process(x)
            scale, zp = self.calculate_qparams()
            self.scale.copy_(scale)
            self.zero_point.copy_(zp)
        if not self._enabled("fake_quant_enabled"):
            return x
        builder = active()
        builder.finishers.setdefault(FAKE_QUANTIZERS_KEY, _Captured()).add(self, builder)
        if not self.is_per_channel:
            return fake_quantize_per_tensor_affine(x, self.scale, self.zero_point, self.quant_min, self.quant_max)
        if not -x.ndim <= self.ch_axis < x.ndim:
            raise op_error("FakeQuantize", [x], f"ch_axis {self.ch_axis} is out of range for a rank-{x.ndim} input",
                           user_source())
        return fake_quantize_per_channel_affine(x, self.scale, self.zero_point, self.ch_axis % x.ndim, self.quant_min,
                                                self.quant_max)

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self._parameters["fake_quant_enabled"].data = np.array([int(enabled)], np.uint8)
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self._parameters["observer_enabled"].data = np.array([int(enabled)], np.uint8)
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def extra_repr(self) -> str:
        return f"quant_min={self.quant_min}, quant_max={self.quant_max}, ch_axis={self.ch_axis}"


class _Captured:
    """One capture's fake quantizations, for ``graphc.model.quantizers``' record: written to the model's
    metadata when the capture ends, with one ``UncalibratedWarning`` naming those captured in eval mode with
    an enabled observer that never saw data (no graph of the capture runs it: they quantize with scale 1.0)."""

    def __init__(self) -> None:
        self.entries: dict[int, dict] = {}
        self.unseen_in_eval: list[str] = []

    def add(self, fq: FakeQuantize, builder: Builder) -> None:
        if id(fq) in self.entries:
            return
        name = fq.__dict__.get("_path") or type(fq).__name__
        stats = [fq.activation_post_process._parameters[key] for key in ("min_val", "max_val")]
        entry = {"module": name, "observed": not never_observed(*(p.numpy() for p in stats))}
        observing = fq._enabled("observer_enabled")
        if fq.training and observing and all(id(p) in (builder.rooted or ()) for p in stats):
            entry["stats"] = [p.qualname for p in stats]  # initializers the training graphs update
        elif not fq.training and observing and not entry["observed"]:
            self.unseen_in_eval.append(name)
        self.entries[id(fq)] = entry

    def __call__(self, model: ir.Model) -> None:
        model.metadata_props[FAKE_QUANTIZERS_KEY] = json.dumps(list(self.entries.values()))
        if self.unseen_in_eval:
            n = len(self.unseen_in_eval)
            warnings.warn(UncalibratedWarning(
                f"{n} gc.nn.FakeQuantize module{'s' if n > 1 else ''} ({first_few(self.unseen_in_eval)}) captured "
                "in eval mode before their observer saw data: no graph of this capture runs the observers, so they "
                "quantize with scale 1.0 and zero point 0 and an export refuses them (gc.nn modules start in eval "
                "mode, torch's in training mode); capture with training=True to train and calibrate them, or load "
                "calibrated state before capturing"), stacklevel=3)
