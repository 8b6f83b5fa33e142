"""``gc.nn.utils.parametrizations``: torch's weight norm, spectral norm and orthogonal parametrizations,
registered through ``parametrize.register_parametrization`` as torch's, with its ``state_dict`` keys
(``parametrizations.weight.original0``/``original1``; ``parametrizations.weight.original`` and
``parametrizations.weight.0._u``/``_v``; ``parametrizations.weight.0.base``), so torch checkpoints load.
``module.<name>`` is computed from them each time it is read, as torch's parametrizations outside
``parametrize.cached()``: a training-mode spectral norm's power iteration runs at each read (the hook form,
``norms``, runs it once per call of the module)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops_math
from graphc.dsl.builder import active, user_source
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.norms import (as_matrix, initial_uv, normed_weight, norm_except_dim, power_steps,
                                   read, spectral_dim, spectral_weight, unit)
from graphc.nn.utils.orthogonal import orthogonal
from graphc.nn.utils.parametrize import register_parametrization, tensor_value

__all__ = ["orthogonal", "spectral_norm", "weight_norm"]


class _WeightNorm(Module):
    """``g * v / ||v||``, the norm over every dim but ``dim`` (all of them for -1)."""

    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Any, weight_v: Any) -> Any:
        return normed_weight(weight_g, weight_v, self.dim)

    def right_inverse(self, weight: Any) -> tuple[Any, Any]:
        return norm_except_dim(weight, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``torch.nn.utils.parametrizations.weight_norm``: ``original0`` (g) and ``original1`` (v), frozen where
    the weight was (torch's parametrization keeps its ``requires_grad``)."""
    tensor_value(module, name, "parametrizations.weight_norm")
    return register_parametrization(module, name, _WeightNorm(dim), unsafe=True)


class _SpectralNorm(Module):
    """``w / sigma`` with the buffers ``_u``, ``_v`` (a vector: ``w / max(||w||, eps)``, no buffers)."""

    def __init__(self, weight: np.ndarray, n_power_iterations: int, dim: int, eps: float) -> None:
        super().__init__()
        self.dim, self.eps, self.n_power_iterations = dim, eps, n_power_iterations
        if weight.ndim > 1:
            mat = as_matrix(weight, dim)
            u, v = power_steps(mat, *initial_uv(mat, eps), 15, eps)
            self._u, self._v = (Parameter(x.astype(weight.dtype), dtype=str(weight.dtype), buffer=True)
                                for x in (u, v))

    def forward(self, weight: Any) -> Any:
        if active() is None:  # torch's read outside a capture: the buffers' values, iterated in training mode
            weight = np.asarray(weight)
        if weight.ndim == 1:
            return ops_math.normalize(weight, dim=0, eps=self.eps) if active() is not None else unit(weight, self.eps)
        u, v = read(self, "_u"), read(self, "_v")
        if active() is None and self.training:
            u, v = power_steps(as_matrix(weight, self.dim), u, v, self.n_power_iterations, self.eps)
            self._u.data, self._v.data = u, v
        return spectral_weight(self, weight, u, v, self.dim, (self.n_power_iterations, self.eps, True))


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
    w = np.asarray(tensor_value(module, name, "parametrizations.spectral_norm"))
    dim = spectral_dim(module, dim, w.ndim, "parametrizations.spectral_norm", negative=True)
    return register_parametrization(module, name, _SpectralNorm(w, n_power_iterations, dim, eps))
