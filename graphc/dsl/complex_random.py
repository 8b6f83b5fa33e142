"""Complex random draws, as torch's: ``gc.randn(..., dtype=gc.cfloat)`` (real and imaginary parts each
N(0, 1/2), so ``E|z|^2 = 1``), ``gc.rand(..., dtype=gc.cfloat)`` (each part U[0, 1)) and the ``_like`` forms of a
complex Tensor (or with a complex ``dtype=``). Each part is its own ``RandomNormal``/``RandomUniform`` node
(``graphc.dsl.ops_sample``), so the two are independent."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import ops_sample
from graphc.dsl.complex_ops import by_complex_dtype, of_parts, parts
from graphc.dsl.tensor import ComplexTensor

_HALF_VARIANCE = math.sqrt(0.5)  # randn's parts' standard deviation


def _drawn(draw: Any, scale: float | None) -> Any:
    """A complex form of the sampler ``draw``: each part drawn with the parts' dtype, times ``scale``."""
    def complex_draw(part: str, *args: Any, **kwargs: Any) -> ComplexTensor:
        if args and isinstance(args[0], ComplexTensor):
            args = (parts(args[0])[0], *args[1:])
        re, im = (draw(*args, dtype=part, **kwargs) for _ in range(2))
        return of_parts(re, im) if scale is None else of_parts(re * scale, im * scale)
    return by_complex_dtype(draw, complex_draw)


rand_any = _drawn(ops_sample.rand, None)
randn_any = _drawn(ops_sample.randn, _HALF_VARIANCE)
rand_like_any = _drawn(ops_sample.rand_like, None)
randn_like_any = _drawn(ops_sample.randn_like, _HALF_VARIANCE)
# (graphc/__init__.py loads these as gc.rand, gc.randn, gc.rand_like, gc.randn_like)
