"""``gc.fft``: torch.fft's discrete Fourier transforms on real and complex Tensors (``graphc.dsl.complex_ops``),
with torch's ``n``/``s`` (the input cropped or zero-padded to that length), ``dim`` and ``norm``; and its
helpers ``fftshift``, ``ifftshift``, ``fftfreq``, ``rfftfreq``.

Lowering, chosen by measurement on onnxruntime 1.31 CPU (one thread, float32, ms a run): each transformed dim
is a MatMul of the parts with a constant cos/sin basis (the crop, the zero padding and the norm's scale folded
into it); the last dim multiplies from the right, the one before from the left, any other is transposed to
the last and back. ONNX's DFT op was slower at every size tried:

    [B, H, W]         rfft: DFT   MatMul     complex fft: DFT   MatMul [re|im] packed   4 MatMuls on parts
    [32, 64, 64]            1.89  0.10                     4.20   1.55                    1.38
    [64, 32, 32]            2.00  0.03                     1.94   0.40                    0.47
    [8, 512, 256]          37.7   8.6                     41.1   41.5                    41.1

The parts' MatMuls need no kernel or gradient rule beyond MatMul's, so the numpy backend and autodiff run them
as they are. The transformed dims' sizes must be known at capture (the basis is a constant); the others may be
symbolic."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl import ops, ops_array
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.complex_ops import of_parts, operand, pair
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError

_NORMS = ("backward", "ortho", "forward")


# -- one dim ---------------------------------------------------------------------------------------------------


def _scale(name: str, norm: str | None, length: int, inverse: bool) -> float:
    """The factor ``norm`` puts on a transform of ``length`` points (torch's: "backward" scales the inverse)."""
    norm = "backward" if norm is None else norm
    if norm not in _NORMS:
        raise CaptureError(f"gc.fft.{name}: norm must be one of {list(_NORMS)} or None, got {norm!r} "
                           f"(at {user_source()})")
    if norm == "ortho":
        return length ** -0.5
    return 1.0 / length if (norm == "backward") == inverse else 1.0


def _basis(x: Tensor, basis: np.ndarray, axis: int) -> Tensor:
    """``basis`` ``[size in, size out]`` as the Constant ``_matmul_along`` multiplies ``x`` by along ``axis``
    (transposed where ``axis`` is the second to last, which multiplies from the left), in ``x``'s dtype."""
    if axis == x.ndim - 2:
        basis = np.ascontiguousarray(basis.T)
    return ops.constant(basis.astype(x.dtype.numpy))


def _matmul_along(x: Tensor, b: Tensor, axis: int) -> Tensor:
    """``x`` times the basis Constant ``b`` (from ``_basis``) along ``axis``."""
    rank = x.ndim
    if axis == rank - 1:
        return ops.matmul(x, b)
    if axis == rank - 2:
        return ops.matmul(b, x)
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = [int(i) for i in np.argsort(perm)]
    return ops.transpose(ops.matmul(ops.transpose(x, perm), b), back)


def _angles(size_in: int, size_out: int, length: int, sign: float) -> np.ndarray:
    """``sign 2 pi t k / length`` for input index ``t`` (rows) and frequency ``k`` (columns), in float64."""
    return sign * 2 * np.pi * np.outer(np.arange(size_in), np.arange(size_out)) / length


def _cropped(basis: np.ndarray, length: int) -> np.ndarray:
    """``basis`` with the rows past ``length`` zero: the input cropped to ``length`` points."""
    basis[length:] = 0.0
    return basis


def _c2c(re: Tensor, im: Tensor | None, axis: int, length: int, inverse: bool, scale: float) -> tuple:
    """A complex transform of ``length`` points along ``axis`` (``im`` None: a real input)."""
    angles = _angles(re.shape[axis], length, length, 1.0 if inverse else -1.0)
    cos, sin = (_basis(re, _cropped(f(angles) * scale, length), axis) for f in (np.cos, np.sin))
    out_re, out_im = _matmul_along(re, cos, axis), _matmul_along(re, sin, axis)
    if im is None:
        return out_re, out_im
    return out_re - _matmul_along(im, sin, axis), out_im + _matmul_along(im, cos, axis)


def _r2c(x: Tensor, axis: int, length: int, scale: float) -> tuple:
    """The ``length // 2 + 1`` non-negative frequencies of a real signal's transform along ``axis``."""
    angles = _angles(x.shape[axis], length // 2 + 1, length, -1.0)
    return tuple(_matmul_along(x, _basis(x, _cropped(f(angles) * scale, length), axis), axis)
                 for f in (np.cos, np.sin))


def _c2r(re: Tensor, im: Tensor | None, axis: int, length: int, scale: float) -> Tensor:
    """The real signal of ``length`` points whose non-negative frequencies are ``(re, im)`` along ``axis``
    (the rest its Hermitian mirror): the imaginary parts of the zero and Nyquist bins do not count, as torch's."""
    half = length // 2 + 1
    weights = np.where((np.arange(half) == 0) | (2 * np.arange(half) == length), 1.0, 2.0) * scale
    size = re.shape[axis]
    w = np.zeros((size, 1))
    w[:min(size, half), 0] = weights[:size]
    angles = _angles(size, length, length, 1.0)
    out = _matmul_along(re, _basis(re, np.cos(angles) * w, axis), axis)
    return out if im is None else out - _matmul_along(im, _basis(re, np.sin(angles) * w, axis), axis)


# -- arguments ---------------------------------------------------------------------------------------------------


def _parts(name: str, input: Any, real_only: bool = False) -> tuple[Tensor, Tensor | None]:  # noqa: A002
    """``input``'s parts (imaginary None for a real one), integers as float32, as torch's default dtype."""
    if real_only and isinstance(input, ComplexTensor):
        raise CaptureError(f"gc.fft.{name} expects a real input Tensor, got {input.type_str()} (at {user_source()})")
    re, im = operand(input)
    re = ops.lift(re)
    if re.dtype not in ("float32", "float64"):
        if re.dtype in ("float16", "bfloat16") or not isinstance(input, (Tensor, ComplexTensor)):
            raise CaptureError(f"gc.fft.{name}: expected a float32/float64 or complex Tensor, got {re.type_str()} "
                               f"(at {user_source()})")
        re = ops.cast(re, "float32")
    return re, None if im is None else ops.lift(im, re)


def _dims(name: str, x: Tensor, dim: Any, count: int | None) -> list[int]:
    """The transformed dims as axes of ``x``: ``dim`` (an int or a sequence), else the last ``count``
    (every dim when ``count`` is None)."""
    rank = x.ndim
    if dim is None:
        if count is not None and count > rank:
            raise CaptureError(f"gc.fft.{name}: s has {count} entries for a Tensor of rank {rank} (at {user_source()})")
        dims = list(range(0 if count is None else rank - count, rank))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not -rank <= d < rank:
            raise CaptureError(f"gc.fft.{name}: dim {d} out of range for a Tensor of rank {rank} (at {user_source()})")
        if d % rank in out:
            raise CaptureError(f"gc.fft.{name}: dim {d} given twice in {dims} (at {user_source()})")
        out.append(d % rank)
    return out


def _lengths(name: str, x: Tensor, dims: list[int], s: Any, last_default: int | None = None) -> list[int]:
    """The signal lengths: ``s`` (an entry -1: the input's size), else the input's sizes (the last
    ``last_default`` where given: irfft's ``2 (m - 1)``)."""
    if s is None:
        lengths = [x.shape[d] for d in dims]
        if last_default is not None:
            lengths[-1] = last_default
    else:
        s = [s] if isinstance(s, int) else list(s)
        if len(s) != len(dims):
            raise CaptureError(f"gc.fft.{name}: s has {len(s)} entries for {len(dims)} dims (at {user_source()})")
        lengths = [x.shape[d] if n == -1 else n for d, n in zip(dims, s)]
        if last_default is not None and s[-1] == -1:
            lengths[-1] = last_default
    for d in dims:
        if not isinstance(x.shape[d], int):
            raise CaptureError(f"gc.fft.{name}: the size of dim {d} must be known at capture (the basis is a "
                               f"constant), got {x.shape[d]!r} (at {user_source()})")
    for n in lengths:
        if not isinstance(n, int) or n < 1:
            raise CaptureError(f"gc.fft.{name}: invalid number of data points ({n}) specified (at {user_source()})")
    return lengths


def _count(s: Any) -> int | None:
    return None if s is None else (1 if isinstance(s, int) else len(s))


# -- the transforms ------------------------------------------------------------------------------------------------


def _fftn(name: str, input: Any, s: Any, dim: Any, norm: str | None, inverse: bool,  # noqa: A002
          count: int | None) -> ComplexTensor:
    re, im = _parts(name, input)
    dims = _dims(name, re, dim, count)
    for d, n in zip(dims, _lengths(name, re, dims, s)):
        re, im = _c2c(re, im, d, n, inverse, _scale(name, norm, n, inverse))
    return of_parts(re, im)


def _rfftn(name: str, input: Any, s: Any, dim: Any, norm: str | None, count: int | None,  # noqa: A002
           hermitian: bool = False) -> ComplexTensor:
    """The one-sided spectrum of a real signal along the last dim, then the forward transform of the other dims.
    ``hermitian``: torch's inverse Hermitian transform (``ihfftn``): the conjugate of that one-sided spectrum, then
    the inverse transform of the other dims, each with an inverse transform's ``norm`` scale."""
    x, _ = _parts(name, input, real_only=True)
    dims = _dims(name, x, dim, count)
    lengths = _lengths(name, x, dims, s)
    re, im = _r2c(x, dims[-1], lengths[-1], _scale(name, norm, lengths[-1], hermitian))
    if hermitian:
        im = -im
    for d, n in zip(dims[:-1], lengths[:-1]):
        re, im = _c2c(re, im, d, n, hermitian, _scale(name, norm, n, hermitian))
    return of_parts(re, im)


def _irfftn(name: str, input: Any, s: Any, dim: Any, norm: str | None, count: int | None,  # noqa: A002
            hermitian: bool = False) -> Tensor:
    """The inverse transform of the non-last dims, then the real signal of the one-sided spectrum along the last.
    ``hermitian``: torch's Hermitian transform (``hfftn``): the forward transform of the non-last dims, then the
    real signal of the conjugate's one-sided spectrum along the last, each with a forward transform's ``norm``
    scale."""
    re, im = _parts(name, input)
    dims = _dims(name, re, dim, count)
    size = re.shape[dims[-1]]
    lengths = _lengths(name, re, dims, s, last_default=2 * (size - 1) if isinstance(size, int) else None)
    inverse = not hermitian
    for d, n in zip(dims[:-1], lengths[:-1]):
        re, im = _c2c(re, im, d, n, inverse, _scale(name, norm, n, inverse))
    if hermitian and im is not None:
        im = -im
    return _c2r(re, im, dims[-1], lengths[-1], _scale(name, norm, lengths[-1], inverse))


@autocast_op("fft_fft")
def fft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:  # noqa: A002
    """``torch.fft.fft``: the DFT of ``n`` points (the input cropped or zero-padded) along ``dim``."""
    return _fftn("fft", input, n, dim, norm, False, 1)


@autocast_op("fft_ifft")
def ifft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:  # noqa: A002
    return _fftn("ifft", input, n, dim, norm, True, 1)


@autocast_op("fft_rfft")
def rfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:  # noqa: A002
    """``torch.fft.rfft``: the ``n // 2 + 1`` non-negative frequencies of a real signal's DFT."""
    return _rfftn("rfft", input, n, dim, norm, 1)


@autocast_op("fft_irfft")
def irfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """``torch.fft.irfft``: the real signal of ``n`` points (default ``2 (m - 1)``) of a one-sided spectrum."""
    return _irfftn("irfft", input, n, dim, norm, 1)


@autocast_op("fft_fft2")
def fft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
         norm: str | None = None) -> ComplexTensor:
    return _fftn("fft2", input, s, dim, norm, False, None)


@autocast_op("fft_ifft2")
def ifft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
          norm: str | None = None) -> ComplexTensor:
    return _fftn("ifft2", input, s, dim, norm, True, None)


@autocast_op("fft_rfft2")
def rfft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
          norm: str | None = None) -> ComplexTensor:
    return _rfftn("rfft2", input, s, dim, norm, None)


@autocast_op("fft_irfft2")
def irfft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
           norm: str | None = None) -> Tensor:
    return _irfftn("irfft2", input, s, dim, norm, None)


@autocast_op("fft_fftn")
def fftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
         norm: str | None = None) -> ComplexTensor:
    """``torch.fft.fftn``: over ``dim`` (default: the last ``len(s)`` dims, or every dim)."""
    return _fftn("fftn", input, s, dim, norm, False, _count(s))


@autocast_op("fft_ifftn")
def ifftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
          norm: str | None = None) -> ComplexTensor:
    return _fftn("ifftn", input, s, dim, norm, True, _count(s))


@autocast_op("fft_rfftn")
def rfftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
          norm: str | None = None) -> ComplexTensor:
    return _rfftn("rfftn", input, s, dim, norm, _count(s))


@autocast_op("fft_irfftn")
def irfftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
           norm: str | None = None) -> Tensor:
    return _irfftn("irfftn", input, s, dim, norm, _count(s))


@autocast_op("fft_hfft")
def hfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """``torch.fft.hfft``: the real ``n``-point transform (default ``2 (m - 1)``) of a Hermitian signal given by
    its first half; no scale under "backward" (it is a forward transform)."""
    return _irfftn("hfft", input, n, dim, norm, 1, hermitian=True)


@autocast_op("fft_ihfft")
def ihfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> ComplexTensor:  # noqa: A002
    """``torch.fft.ihfft``: the ``n // 2 + 1`` non-negative frequencies of a real signal's inverse DFT."""
    return _rfftn("ihfft", input, n, dim, norm, 1, hermitian=True)


@autocast_op("fft_hfft2")
def hfft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
          norm: str | None = None) -> Tensor:
    return _irfftn("hfft2", input, s, dim, norm, None, hermitian=True)


@autocast_op("fft_ihfft2")
def ihfft2(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),  # noqa: A002
           norm: str | None = None) -> ComplexTensor:
    return _rfftn("ihfft2", input, s, dim, norm, None, hermitian=True)


@autocast_op("fft_hfftn")
def hfftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
          norm: str | None = None) -> Tensor:
    return _irfftn("hfftn", input, s, dim, norm, _count(s), hermitian=True)


@autocast_op("fft_ihfftn")
def ihfftn(input: Any, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,  # noqa: A002
           norm: str | None = None) -> ComplexTensor:
    return _rfftn("ihfftn", input, s, dim, norm, _count(s), hermitian=True)


# -- helpers -----------------------------------------------------------------------------------------------------


def _shift(name: str, input: Any, dim: Any, sign: int) -> Any:  # noqa: A002
    held = pair(input) if isinstance(input, ComplexTensor) else ops.lift(input)
    rank = held.ndim - isinstance(input, ComplexTensor)
    dims = list(range(rank)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    for d in dims:
        if not -rank <= d < rank:
            raise CaptureError(f"gc.fft.{name}: dim {d} out of range for a Tensor of rank {rank} (at {user_source()})")
    dims = [d % rank for d in dims]
    for d in dims:
        if not isinstance(held.shape[d], int):
            raise CaptureError(f"gc.fft.{name}: the size of dim {d} must be known at capture (it rolls by half of "
                               f"it), got {held.shape[d]!r}; pass dim= the static dims (at {user_source()})")
    shifts = [sign * (held.shape[d] // 2) for d in dims]
    rolled = ops_array.roll(held, shifts, dims) if dims else held
    return ComplexTensor(pair=rolled) if isinstance(input, ComplexTensor) else rolled


def fftshift(input: Any, dim: Any = None) -> Any:  # noqa: A002
    """``torch.fft.fftshift``: the zero frequency moved to the centre of ``dim`` (default: every dim)."""
    return _shift("fftshift", input, dim, 1)


def ifftshift(input: Any, dim: Any = None) -> Any:  # noqa: A002
    return _shift("ifftshift", input, dim, -1)


def _frequencies(name: str, values: np.ndarray, n: int, d: float, dtype: Any) -> Tensor:
    if not isinstance(n, int) or n < 1:
        raise CaptureError(f"gc.fft.{name}: n must be a positive int, got {n!r} (at {user_source()})")
    return ops.constant((values / (n * d)).astype(np.dtype("float32" if dtype is None else str(dtype))))


def fftfreq(n: int, d: float = 1.0, *, dtype: Any = None) -> Tensor:
    """``torch.fft.fftfreq``: the DFT's sample frequencies ``[0, 1, ..., -1] / (d n)`` (float32 by default)."""
    return _frequencies("fftfreq", np.concatenate([np.arange((n + 1) // 2), -np.arange(n // 2, 0, -1)]) if
                        isinstance(n, int) else np.zeros(0), n, d, dtype)


def rfftfreq(n: int, d: float = 1.0, *, dtype: Any = None) -> Tensor:
    """``torch.fft.rfftfreq``: the ``n // 2 + 1`` non-negative frequencies ``[0, 1, ..., n // 2] / (d n)``."""
    return _frequencies("rfftfreq", np.arange(n // 2 + 1) if isinstance(n, int) else np.zeros(0), n, d, dtype)


__all__ = ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn",
           "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn", "fftshift", "ifftshift", "fftfreq", "rfftfreq"]
