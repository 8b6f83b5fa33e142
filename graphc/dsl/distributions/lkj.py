"""torch's ``LKJCholesky``: Cholesky factors of correlation matrices with density proportional to
``det(L L^T) ** (concentration - 1)``; ``log_prob`` by torch's (Stan's) formula, ``sample`` by torch's vectorised
onion method (Beta draws for the squared row lengths, normal draws for their directions) with the Beta of
[LKJ 2009, Sec. 3.2]: torch 2.13 draws row ``i >= 2``'s from ``Beta(i - 1/2, .)``, not ``Beta(i / 2, .)``, so its
samples are not its ``log_prob``'s distribution for ``dim >= 3`` (e.g. its correlations are not exchangeable)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import POSITIVE, Distribution, check, fail, finfo, params
from graphc.dsl.distributions.gamma import Beta
from graphc.dsl.ops import clip, constant, log, sqrt, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import tril
from graphc.dsl.ops_linalg import diag_embed, diagonal
from graphc.dsl.ops_reshape import broadcast_tensors, unsqueeze
from graphc.dsl.ops_sample import randn_like
from graphc.dsl.ops_special import lgamma, mvlgamma
from graphc.dsl.tensor import Tensor


class LKJCholesky(Distribution):
    """``torch.distributions.LKJCholesky(dim, concentration=1.0)``: event shape ``(dim, dim)``, batch shape
    ``concentration``'s; no ``rsample``, mean or variance, as torch's."""

    support = constraints.corr_cholesky
    arg_constraints = {"concentration": constraints.positive}

    def __init__(self, dim: int, concentration: Any = 1.0, validate_args: bool | None = None):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 2:
            raise fail("LKJCholesky", [], f"dim must be an int >= 2 (torch: Expected dim to be an integer greater "
                                          f"than or equal to 2), got dim={dim!r}")
        self.dim = int(dim)
        (self.concentration,) = params("LKJCholesky", concentration=concentration)
        super().__init__(self.concentration.shape, (self.dim, self.dim), validate_args)
        if self._validate_args:
            check("LKJCholesky", "concentration", self.concentration, POSITIVE)
        # row i's squared length off the diagonal is Beta(i / 2, c + (dim - 1 - i) / 2) (row 0's is unused)
        offset = np.concatenate([[0.0], np.arange(self.dim - 1.0)])
        marginal = unsqueeze(self.concentration, -1) + 0.5 * (self.dim - 2)
        self._beta = Beta(0.5 * offset + 0.5, marginal - constant(0.5 * offset.astype(finfo(marginal).dtype)),
                          validate_args=False)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """The onion method as torch's: row ``i`` is ``sqrt(y_i)`` times a uniform direction among its first ``i``
        entries (normal draws over their norm), the diagonal ``sqrt(1 - |row|^2)``, at least the dtype's ``tiny``;
        ``y_i ~ Beta(i / 2, c + (dim - 1 - i) / 2)``."""
        y = unsqueeze(self._beta.sample(sample_shape), -1)
        z = tril(randn_like(broadcast_tensors(y, constant(np.zeros(self.dim, finfo(y).dtype)))[0]), -1)
        length = sqrt(sum_(z * z, axis=-1, keepdims=True))
        w = sqrt(y) * z / where(length > 0.0, length, 1.0)  # row 0 is zeros, as torch's fill
        return w + diag_embed(sqrt(clip(1.0 - sum_(w * w, axis=-1), float(finfo(w).tiny))))

    def log_prob(self, value: Any) -> Tensor:
        """``sum_i (2 (c - 1) + dim - i) log L_ii`` (``i`` from 2, 1-based) less the normaliser of [LKJ 2009]."""
        v = self._value(value, self.concentration)
        if v.shape is not None and (len(v.shape) < 2 or tuple(v.shape[-2:]) != (self.dim, self.dim)):
            raise fail("LKJCholesky", [v], f"value's last two dims must be the event shape {(self.dim, self.dim)}, "
                                           f"got {v.type_str()}")
        c, dm1 = self.concentration, self.dim - 1
        order = 2.0 * unsqueeze(c - 1.0, -1) + constant((self.dim - np.arange(2.0, self.dim + 1))
                                                         .astype(finfo(c).dtype))
        unnormalized = sum_(order * log(diagonal(v, 0, -1, -2)[..., 1:]), axis=-1)
        alpha = c + 0.5 * dm1
        return unnormalized - (0.5 * dm1 * math.log(math.pi) + mvlgamma(alpha - 0.5, dm1) - lgamma(alpha) * dm1)


__all__ = ["LKJCholesky"]
