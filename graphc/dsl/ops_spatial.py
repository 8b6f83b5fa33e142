"""Spatial rearranging and resampling functions of ``torch.nn.functional`` beyond ``ops_layers``:
``pixel_shuffle``, ``pixel_unshuffle``, ``channel_shuffle``, ``upsample``/``upsample_nearest``/``upsample_bilinear``,
``affine_grid`` and ``grid_sample``. Each is standard ONNX ops with gradient rules (Reshape,
Transpose, Resize, MatMul, GridSample)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.ops import constant, emit, lift, matmul, reshape, reshape_like, same_dtype, transpose
from graphc.dsl.ops_array import static_dim
from graphc.dsl.ops_layers import interpolate
from graphc.dsl.ops_nn import positive_int
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError


def pixel_shuffle(x: Tensor, upscale_factor: int) -> Tensor:
    """``[*, C r^2, H, W] -> [*, C, H r, W r]`` (pixel ``(h r + i, w r + j)`` of channel ``c`` from channel
    ``c r^2 + i r + j``): DepthToSpace (CRD) for 4-D inputs; other ranks, static C, H, W, as
    ``pixel_unshuffle`` backwards. Signature: ai.onnx@13::DepthToSpace (CRD)"""
    r = positive_int("pixel_shuffle", "upscale_factor", upscale_factor)
    x = lift(x)
    if x.shape is None or x.ndim < 3:
        raise op_error("DepthToSpace", [x], "pixel_shuffle expects an input of rank 3 or more (*, C, H, W)",
                       user_source())
    channels = x.shape[-3]
    if isinstance(channels, int) and channels % (r * r):
        raise op_error("DepthToSpace", [x], f"pixel_shuffle expects the channels ({channels}) to divide by "
                       f"upscale_factor**2={r * r}", user_source())
    if x.ndim == 4:
        return emit("DepthToSpace", [x], {"blocksize": r, "mode": "CRD"})
    lead, (c, h, w) = list(x.shape[:-3]), [static_dim(x, d, "DepthToSpace") for d in (-3, -2, -1)]
    k = len(lead)
    blocks = transpose(reshape(x, [*lead, c // (r * r), r, r, h, w]), [*range(k), k, k + 3, k + 1, k + 4, k + 2])
    return reshape(blocks, [*lead, c // (r * r), h * r, w * r])


def pixel_unshuffle(x: Tensor, downscale_factor: int) -> Tensor:
    """``[*, C, H r, W r] -> [*, C r^2, H, W]``, the inverse of ``pixel_shuffle`` (channel ``c r^2
    + i r + j`` holds the pixels at row offset ``i``, column offset ``j``): a Reshape, a Transpose
    and a Reshape (ONNX ``SpaceToDepth`` orders the channels offsets first). Static C, H, W."""
    r = positive_int("pixel_unshuffle", "downscale_factor", downscale_factor)
    x = lift(x)
    if x.shape is None or x.ndim < 3:
        raise op_error("SpaceToDepth", [x], "pixel_unshuffle expects an input of rank 3 or more (*, C, H, W)",
                       user_source())
    lead, (c, h, w) = list(x.shape[:-3]), [static_dim(x, d, "SpaceToDepth") for d in (-3, -2, -1)]
    for name, size in (("height", h), ("width", w)):
        if size % r:
            raise op_error("SpaceToDepth", [x], f"pixel_unshuffle expects the {name} ({size}) to divide by "
                           f"downscale_factor={r}", user_source())
    k = len(lead)
    blocks = transpose(reshape(x, [*lead, c, h // r, r, w // r, r]), [*range(k), k, k + 2, k + 4, k + 1, k + 3])
    return reshape(blocks, [*lead, c * r * r, h // r, w // r])


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """``[N, C, *]`` with its channels, read as ``[groups, C / groups]``, transposed (torch's
    ``ChannelShuffle``): a Reshape, a Transpose and a Reshape. Static C."""
    g = positive_int("channel_shuffle", "groups", groups)
    x = lift(x)
    if x.shape is None or x.ndim < 3:
        raise op_error("Transpose", [x], "channel_shuffle expects an input of rank 3 or more (N, C, *)",
                       user_source())
    c = static_dim(x, 1, "Transpose")
    if c % g:
        raise op_error("Transpose", [x], f"channel_shuffle: {c} channels do not divide into groups={g}", user_source())
    grouped = reshape(x, [x.shape[0], g, c // g, -1])
    return reshape_like(transpose(grouped, [0, 2, 1, 3]), x)


def upsample(x: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """torch's deprecated name of ``interpolate``."""
    return interpolate(x, size, scale_factor, mode, align_corners)


def upsample_nearest(x: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    return interpolate(x, size, scale_factor, "nearest")


def upsample_bilinear(x: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    """Bilinear with ``align_corners=True``, as torch's."""
    return interpolate(x, size, scale_factor, "bilinear", align_corners=True)


def _base_grid(sizes: list[int], align_corners: bool, dtype) -> np.ndarray:
    """``[prod(sizes), nd + 1]``: each output point's normalized coordinates, the last axis
    first (x, then y, then z), and a 1."""
    axes = [np.linspace(-1.0, 1.0, n) * (1.0 if align_corners else (n - 1) / n) if n > 1 else np.zeros(1)
            for n in sizes]
    points = np.stack([*np.meshgrid(*axes, indexing="ij")[::-1], np.ones(sizes)], axis=-1)
    return points.reshape(-1, len(sizes) + 1).astype(dtype)


def affine_grid(theta: Tensor, size: Any, align_corners: bool | None = None) -> Tensor:
    """The sampling grid ``[N, H, W, 2]`` (``[N, D, H, W, 3]``) of a batch of affine matrices
    ``theta`` ``[N, 2, 3]`` (``[N, 3, 4]``) for an output of ``size`` ``[N, C, H, W]`` (``[N, C,
    D, H, W]``): the base grid (a constant) times ``theta`` transposed, one MatMul, at any opset
    (ONNX ``AffineGrid`` comes at opset 20 and has no gradient rule here)."""
    theta = lift(theta)
    size = [int(s) for s in size]
    if len(size) not in (4, 5):
        raise CaptureError(f"affine_grid size must be [N, C, H, W] or [N, C, D, H, W], got {size} "
                           f"(at {user_source()})")
    nd = len(size) - 2
    want = [nd, nd + 1]
    if theta.shape is None or len(theta.shape) != 3 or list(theta.shape[1:]) != want or \
            (isinstance(theta.shape[0], int) and theta.shape[0] != size[0]):
        raise op_error("MatMul", [theta], f"affine_grid expects theta of shape [{size[0]}, {want[0]}, {want[1]}] "
                       f"for size {size}", user_source())
    base = constant(_base_grid(size[2:], bool(align_corners), theta.dtype.numpy))
    grid = matmul(base, transpose(theta, [0, 2, 1]))  # [N, prod(sizes), nd]
    return reshape(grid, [theta.shape[0], *size[2:], nd])


_GRID_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_GRID_PADDINGS = ("zeros", "border", "reflection")


@autocast_op()
def grid_sample(x: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> Tensor:
    """``x`` ``[N, C, H, W]`` (or ``[N, C, D, H, W]``, from opset 20) sampled at ``grid`` ``[N, H_out,
    W_out, 2]`` (``[N, D_out, H_out, W_out, 3]``), normalized ``(x, y[, z])`` in [-1, 1].
    Signature: ai.onnx@20::GridSample (ai.onnx@16 for 4-D input, modes named bilinear/bicubic)"""
    x = lift(x)
    grid = lift(grid, x)
    if mode not in _GRID_MODES:
        raise CaptureError(f"grid_sample mode={mode!r}; expected one of {list(_GRID_MODES)} (at {user_source()})")
    if padding_mode not in _GRID_PADDINGS:
        raise CaptureError(f"grid_sample padding_mode={padding_mode!r}; expected one of {list(_GRID_PADDINGS)} "
                           f"(at {user_source()})")
    if x.shape is None or x.ndim not in (4, 5):
        raise op_error("GridSample", [x], "grid_sample expects a 4-D (N, C, H, W) or 5-D (N, C, D, H, W) input",
                       user_source())
    nd, opset = x.ndim - 2, current().opset
    if grid.shape is None or grid.ndim != x.ndim or grid.shape[-1] != nd:
        raise op_error("GridSample", [x, grid], f"grid_sample expects a grid of rank {x.ndim} ending in {nd}",
                       user_source())
    if nd == 3 and (mode == "bicubic" or opset < 20):
        raise op_error("GridSample", [x, grid], "5-D grid_sample needs opset 20 or later and mode 'bilinear' or "
                       f"'nearest' (got opset {opset}, mode {mode!r})", user_source())
    same_dtype("GridSample", x, grid)
    attrs = {"mode": _GRID_MODES[mode] if opset >= 20 else mode, "padding_mode": padding_mode,
             "align_corners": int(bool(align_corners))}
    return emit("GridSample", [x, grid], attrs)


__all__ = ["affine_grid", "channel_shuffle", "grid_sample", "pixel_shuffle", "pixel_unshuffle", "upsample",
           "upsample_bilinear", "upsample_nearest"]
