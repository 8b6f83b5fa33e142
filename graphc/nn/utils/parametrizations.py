"""``gc.nn.utils.parametrizations``: torch's parametrization forms of weight and spectral norm, with
its ``state_dict`` keys (``parametrizations.weight.original0``/``original1``;
``parametrizations.weight.original`` and ``parametrizations.weight.0._u``/``_v``), so torch
checkpoints load. ``module.<name>`` is computed from them each time it is read, as torch's
parametrizations outside ``parametrize.cached()``: a training-mode spectral norm's power iteration
runs at each read (the hook form, ``norms``, runs it once per call of the module)."""

from __future__ import annotations

from graphc.dsl.builder import user_source
from graphc.errors import CaptureError
from graphc.nn.containers import ModuleDict
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.norms import (normed_weight, norm_except_dim, param_like, power_iteration, read, spectral_dim,
                                   spectral_weight, take_weight, weight_value)

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
    """``torch.nn.utils.parametrizations.weight_norm``: ``original0`` (g) and ``original1`` (v)."""
    weight, entry = _parametrize(module, name, "parametrizations.weight_norm")
    v = weight_value(weight)
    entry.original0 = param_like(norm_except_dim(v, dim), weight)
    entry.original1 = param_like(v, weight)
    module.register_computed(name, lambda m: normed_weight(*(read(m.parametrizations[name], f"original{i}")
                                                             for i in (0, 1)), dim))
    return module


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """``torch.nn.utils.parametrizations.spectral_norm``: ``original`` and the buffers ``0._u``,
    ``0._v``, which a training-mode capture updates each time the weight is read, ``u`` first, as
    torch's parametrization (``norms.spectral_weight``)."""
    if n_power_iterations <= 0:
        raise CaptureError(f"parametrizations.spectral_norm: n_power_iterations must be positive, got "
                           f"{n_power_iterations} (at {user_source()})")
    weight, entry = _parametrize(module, name, "parametrizations.spectral_norm")
    w, dim = weight_value(weight), spectral_dim(module, dim)
    if w.ndim < 2:
        raise CaptureError(f"parametrizations.spectral_norm of a {w.ndim}-D {name!r} is not supported (torch "
                           f"normalises it to unit norm) (at {user_source()})")
    u, v = power_iteration(w, dim, eps)
    entry.original = param_like(w, weight)
    power = Module()
    power._u = param_like(u, weight, buffer=True)
    power._v = param_like(v, weight, buffer=True)
    entry.add_module("0", power)

    def compute(m: Module):
        entry = m.parametrizations[name]
        u, v = (read(entry._modules["0"], s) for s in ("_u", "_v"))
        return spectral_weight(m, read(entry, "original"), u, v, dim, (n_power_iterations, eps, True))

    module.register_computed(name, compute)
    return module

