"""``gc.nn.utils.parametrizations``: torch's parametrization forms of weight and spectral norm, with
its ``state_dict`` keys (``parametrizations.weight.original0``/``original1``;
``parametrizations.weight.original`` and ``parametrizations.weight.0._u``/``_v``), so torch
checkpoints load. ``module.<name>`` is computed from them each time it is read, as torch's
parametrizations outside ``parametrize.cached()``: a training-mode spectral norm's power iteration
runs at each read (the hook form, ``norms``, runs it once per call of the module)."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_math
from graphc.dsl.builder import user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.containers import ModuleDict
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.norms import (as_matrix, initial_uv, normed_weight, norm_except_dim, param_like, power_steps,
                                   read, spectral_dim, spectral_weight, take_weight, unit, weight_value)

__all__ = ["spectral_norm", "weight_norm"]


class ParametrizationList(Module):
    """What torch keeps under ``module.parametrizations.<name>``: the original tensor(s) and, for
    spectral norm, the parametrization ``0`` holding its ``_u``/``_v`` buffers."""


def _parametrize(module: Module, name: str, fn: str) -> tuple[Parameter, ParametrizationList]:
    weight = take_weight(module, name, fn)
    if "parametrizations" not in module._modules:
        module.parametrizations = ModuleDict()
    entry = ParametrizationList()
    module.parametrizations[name] = entry
    return weight, entry


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``torch.nn.utils.parametrizations.weight_norm``: ``original0`` (g) and ``original1`` (v), frozen where
    the weight was (torch's parametrization keeps its ``requires_grad``)."""
    weight, entry = _parametrize(module, name, "parametrizations.weight_norm")
    v = weight_value(weight)
    entry.original0 = param_like(norm_except_dim(v, dim), weight).requires_grad_(weight.requires_grad)
    entry.original1 = param_like(v, weight).requires_grad_(weight.requires_grad)
    module.register_computed(name, lambda m: normed_weight(*(read(m.parametrizations[name], f"original{i}")
                                                             for i in (0, 1)), dim))
    return module


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """``torch.nn.utils.parametrizations.spectral_norm``: ``original`` and the buffers ``0._u``,
    ``0._v``, started as torch's: unit normal draws put through 15 power iterations, and
    ``n_power_iterations`` more where ``module`` is in training mode (torch's registration check
    evaluates the parametrization once). Each read of the weight in training mode runs
    ``n_power_iterations`` more, ``u`` first, as torch's parametrization: captured, as written
    buffers (``norms.spectral_weight``); outside a capture, into the buffers' values. A 1-D weight
    is normalised to unit norm, as torch's, with no buffers."""
    if n_power_iterations <= 0:
        raise CaptureError(f"parametrizations.spectral_norm: n_power_iterations must be positive, got "
                           f"{n_power_iterations} (at {user_source()})")
    weight, entry = _parametrize(module, name, "parametrizations.spectral_norm")
    w = weight_value(weight)
    dim = spectral_dim(module, dim, w.ndim, "parametrizations.spectral_norm", negative=True)
    entry.original = weight
    power = Module()
    entry.add_module("0", power)
    if w.ndim == 1:
        module.register_computed(name, lambda m: _unit_weight(read(m.parametrizations[name], "original"), eps))
        return module
    mat = as_matrix(w, dim)
    u, v = power_steps(mat, *initial_uv(mat, eps), 15 + n_power_iterations * module.training, eps)
    power._u = param_like(u, weight, buffer=True)
    power._v = param_like(v, weight, buffer=True)

    def compute(m: Module):
        entry = m.parametrizations[name]
        w, u, v = read(entry, "original"), *(read(entry._modules["0"], s) for s in ("_u", "_v"))
        if not isinstance(w, Tensor) and m.training:  # torch's read in training mode iterates
            u, v = power_steps(as_matrix(w, dim), u, v, n_power_iterations, eps)
            entry._modules["0"]._u.data, entry._modules["0"]._v.data = u, v
        return spectral_weight(m, w, u, v, dim, (n_power_iterations, eps, True))

    module.register_computed(name, compute)
    return module


def _unit_weight(w: Any, eps: float) -> Any:
    """``w / max(||w||, eps)``: torch's spectral norm of a vector."""
    return ops_math.normalize(w, dim=0, eps=eps) if isinstance(w, Tensor) else unit(w, eps)
