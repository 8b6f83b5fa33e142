"""``gc.nn.utils.weight_norm``/``spectral_norm`` and their ``remove_*``: torch's hook forms, with its
parameter and buffer names (``weight_g``, ``weight_v``; ``weight_orig``, ``weight_u``, ``weight_v``),
so torch checkpoints load. The weight is computed from them once per call of the module, before its
``forward``, as torch's pre-hook (``Module.register_computed(..., per_call=True)``): captured, as ONNX
ops autodiff differentiates; outside a capture, in numpy, each time it is read (spectral norm's, before
the module's first call: the original, as torch leaves it). A training-mode capture
updates spectral norm's ``u`` and ``v`` by the power iteration, once per call, as torch's forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops, ops_math
from graphc.dsl.builder import active, user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter

__all__ = ["remove_spectral_norm", "remove_weight_norm", "spectral_norm", "weight_norm"]


def norm_except_dim(v: Any, dim: int | None) -> Any:
    """The 2-norm of ``v`` over every dim but ``dim`` (kept, the others size 1); over all of it,
    a scalar, for ``dim`` None or -1, as torch's ``_weight_norm``."""
    if isinstance(v, Tensor):
        if dim is None or dim == -1:
            return ops.sqrt(ops.sum(v * v))
        return ops.sqrt(ops.sum(v * v, axis=[a for a in range(v.ndim) if a != dim % v.ndim], keepdims=True))
    if dim is None or dim == -1:
        return np.sqrt(np.sum(v * v))
    return np.sqrt(np.sum(v * v, axis=tuple(a for a in range(v.ndim) if a != dim % v.ndim), keepdims=True))


def normed_weight(g: Any, v: Any, dim: int | None) -> Any:
    """``v * (g / ||v||)``, the norm over every dim but ``dim``."""
    return v * (g / norm_except_dim(v, dim))


def read(module: Module, name: str) -> Any:
    """``module.<name>``: its Tensor in a capture, else its value."""
    value = getattr(module, name)
    return value.numpy() if isinstance(value, Parameter) else value


def weight_value(param: Parameter) -> np.ndarray:
    """The parameter's value, drawn now from its init if it has none yet."""
    if not param.drawn:
        param.draw(np.random.default_rng(0))
    return param.numpy()


def take_weight(module: Module, name: str, fn: str) -> Parameter:
    """``module``'s parameter ``name``, removed from it; a CaptureError where there is none or a
    norm is computed under that name already."""
    if name in module.__dict__.get("_computed", {}):
        raise CaptureError(f"{fn}: {type(module).__name__}.{name} has a weight_norm or spectral_norm already; "
                           f"torch refuses two on the same parameter (at {user_source()})")
    param = module._parameters.get(name)
    if param is None:
        raise CaptureError(f"{fn}: {type(module).__name__} has no parameter {name!r} (at {user_source()})")
    delattr(module, name)
    return param


def param_like(value: np.ndarray, param: Parameter, buffer: bool = False) -> Parameter:
    """A Parameter (``buffer``: a buffer) holding ``value`` in ``param``'s dtype."""
    return Parameter(np.asarray(value, param.dtype.numpy), dtype=param.dtype, buffer=buffer)


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``torch.nn.utils.weight_norm``: ``name`` becomes ``name_g * name_v / ||name_v||`` (the norm
    over every dim but ``dim``; over all for ``dim`` None or -1, as torch), ``name_g`` and
    ``name_v`` taken from the weight's value. Returns ``module``."""
    weight = take_weight(module, name, "weight_norm")
    v = weight_value(weight)
    setattr(module, f"{name}_g", param_like(norm_except_dim(v, dim), weight))
    setattr(module, f"{name}_v", param_like(v, weight))
    module.register_computed(name, lambda m: normed_weight(read(m, f"{name}_g"), read(m, f"{name}_v"), dim),
                             per_call=True)
    module.__dict__.setdefault("_norms", {})[name] = ("weight_norm", dim)
    return module


def _undo(module: Module, name: str, kind: str, suffixes: tuple[str, ...]) -> Module:
    """``name`` a plain parameter again, of the weight computed from the stored values (no power
    iteration); the ``name + suffixes`` parameters and buffers removed."""
    if module.__dict__.get("_norms", {}).get(name, (None,))[0] != kind:
        raise CaptureError(f"remove_{kind}: {kind} of {name!r} not found in {type(module).__name__} "
                           f"(at {user_source()})")
    dtype = module._parameters[name + suffixes[0]].dtype
    weight = module.__dict__["_computed"][name](module) if kind == "weight_norm" else spectral_weight(
        module, *(read(module, name + s) for s in suffixes), module.__dict__["_norms"][name][1], (0, 0.0, False))
    module.register_computed(name, None)
    del module.__dict__["_norms"][name]
    for suffix in suffixes:
        delattr(module, name + suffix)
    setattr(module, name, Parameter(np.asarray(weight, dtype.numpy), dtype=dtype))
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """``torch.nn.utils.remove_weight_norm``: ``name`` a plain parameter again, of the computed value."""
    return _undo(module, name, "weight_norm", ("_g", "_v"))


def spectral_dim(module: Module, dim: int | None, ndim: int, fn: str, negative: bool) -> int:
    """``dim``, torch's default for None: 1 for the ConvTranspose layers (their weight is (in, out,
    ...)), else 0; a negative one counted from the end where torch takes it (``negative``: the
    parametrization; its hook form refuses it), a CaptureError where out of range."""
    if dim is None:
        return 1 if type(module).__name__.startswith("ConvTranspose") else 0
    low = -ndim if negative else 0
    if not low <= dim < ndim:
        raise CaptureError(f"{fn}: dim {dim} is out of range for the {ndim}-D weight of {type(module).__name__} "
                           f"(expected [{low}, {ndim - 1}]) (at {user_source()})")
    return dim % ndim


def as_matrix(w: Any, dim: int) -> Any:
    """``w`` with ``dim`` first, flattened to ``(w.shape[dim], -1)``."""
    perm = [dim, *(a for a in range(w.ndim) if a != dim)]
    if isinstance(w, Tensor):
        return ops.reshape(ops.transpose(w, perm) if dim else w, [w.shape[dim], -1])
    return np.transpose(w, perm).reshape(w.shape[dim], -1)


def spectral_weight(module: Module, w: Any, u: Any, v: Any, dim: int, power: tuple[int, float, bool]) -> Any:
    """``w / (u . (W v))``, ``W`` = ``w`` as a matrix. Captured in training mode, ``u`` and ``v`` (the
    buffers' Tensors) are first written with ``power`` = ``(n_power_iterations, eps, u_first)`` steps
    of the power iteration, as torch's forward does under ``no_grad`` (the writes are detached and
    carried by the training graphs, ``gc.training``), and sigma reads the new values; in eval mode, and
    outside a capture, the stored ``u`` and ``v``."""
    mat = as_matrix(w, dim)
    if not isinstance(w, Tensor):
        return w / np.dot(u, mat @ v)
    if module.training:
        power_iterate(mat, u, v, *power)
    return w / ops.sum(u * ops.matmul(mat, v))


def power_iterate(mat: Tensor, u: Tensor, v: Tensor, iterations: int, eps: float, u_first: bool) -> None:
    """``iterations`` steps of torch's power iteration written into ``u`` and ``v`` in place:
    ``v = normalize(W^T u)`` then ``u = normalize(W v)`` (the hook form's order), or with ``u_first``
    ``u`` then ``v`` (``parametrizations.spectral_norm``'s); ``normalize(x) = x / max(||x||, eps)``."""
    for _ in range(iterations):
        if u_first:
            u.copy_(ops_math.normalize(ops.matmul(mat, v), dim=0, eps=eps))
        v.copy_(ops_math.normalize(ops.matmul(ops.transpose(mat, [1, 0]), u), dim=0, eps=eps))
        if not u_first:
            u.copy_(ops_math.normalize(ops.matmul(mat, v), dim=0, eps=eps))


def unit(x: np.ndarray, eps: float) -> np.ndarray:
    """``x / max(||x||, eps)``: torch's ``F.normalize`` of a vector."""
    return x / max(float(np.linalg.norm(x)), eps)


def power_steps(mat: np.ndarray, u: np.ndarray, v: np.ndarray, iterations: int,
                eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``iterations`` steps of the parametrization's power iteration in numpy, ``u`` first."""
    for _ in range(iterations):
        u = unit(mat @ v, eps)
        v = unit(mat.T @ u, eps)
    return u, v


def initial_uv(mat: np.ndarray, eps: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The unit vectors torch starts ``u`` and ``v`` at: normal draws normalised (its draws come from
    its own generator; load its u and v for the same values)."""
    rng = np.random.default_rng(seed)
    u, v = (unit(rng.standard_normal(n), eps) for n in mat.shape)
    return u, v


def hook_weight(module: Module, name: str, dim: int, power: tuple[int, float, bool]) -> Any:
    """The hook form's ``module.<name>``: read outside a capture before the module's first call,
    the original weight's Parameter, as torch leaves ``weight.data`` there until its first forward
    (whose ``.data`` is the original's storage: an in-place write to it sets the original);
    else normalised."""
    if active() is None and not module.__dict__.get("_called"):
        return module._parameters[f"{name}_orig"]
    return spectral_weight(module, *(read(module, f"{name}{s}") for s in ("_orig", "_u", "_v")), dim, power)


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """``torch.nn.utils.spectral_norm``: ``name`` becomes ``name_orig / sigma``, ``sigma`` from the
    buffers ``name_u``, ``name_v`` (unit normal draws, no power iteration at registration, as torch),
    which a training-mode capture updates by ``n_power_iterations`` steps of the power iteration once
    per call of ``module`` (``spectral_weight``), however often its forward reads the weight, as
    torch's pre-hook. ``n_power_iterations`` must be positive, as torch's."""
    if n_power_iterations <= 0:
        raise CaptureError(f"spectral_norm: n_power_iterations must be positive, got {n_power_iterations} "
                           f"(at {user_source()})")
    weight = take_weight(module, name, "spectral_norm")
    w = weight_value(weight)
    dim = spectral_dim(module, dim, w.ndim, "spectral_norm", negative=False)
    u, v = initial_uv(as_matrix(w, dim), eps)
    setattr(module, f"{name}_orig", weight)
    setattr(module, f"{name}_u", param_like(u, weight, buffer=True))
    setattr(module, f"{name}_v", param_like(v, weight, buffer=True))
    module.register_computed(name, lambda m: hook_weight(m, name, dim, (n_power_iterations, eps, False)),
                             per_call=True)
    module.__dict__.setdefault("_norms", {})[name] = ("spectral_norm", dim)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """``torch.nn.utils.remove_spectral_norm``: ``name`` a plain parameter of the normalised value."""
    return _undo(module, name, "spectral_norm", ("_orig", "_u", "_v"))
