"""``torch.distributions.MultivariateNormal`` over a static event size ``n``: parameterised by its lower
Cholesky factor (``gc.linalg.cholesky`` of a covariance matrix, or of the inverse of a precision matrix),
``log_prob``'s Mahalanobis term by ``gc.linalg.solve_triangular``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import Distribution, fail, known
from graphc.dsl.ops import cast, constant, log, matmul
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_factories import promote_types
from graphc.dsl.ops_linalg import diagonal
from graphc.dsl.ops_reshape import broadcast_tensors, squeeze, unsqueeze
from graphc.dsl.ops_sample import randn_like
from graphc.dsl.ops_solve import cholesky, cholesky_inverse, solve_triangular
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype, to_numpy
from graphc.passes.infer import InferenceError, broadcast

REAL_VECTOR = ("real_vector", lambda v, d: np.all(v == v, -1))


def _positive_definite(m: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        return False
    return bool(np.allclose(m, np.swapaxes(m, -1, -2)))


def _lower_cholesky(m: np.ndarray) -> bool:
    return bool(np.all(np.triu(m, 1) == 0) and np.all(np.diagonal(m, 0, -2, -1) > 0))


CHECKS = {"covariance_matrix": ("positive_definite", _positive_definite),
          "precision_matrix": ("positive_definite", _positive_definite),
          "scale_tril": ("lower_cholesky", _lower_cholesky)}


def _lifted(loc: Any, matrix: Any) -> tuple[Tensor, Tensor]:
    """``loc`` and ``matrix`` in one float dtype (the Tensors' promoted, float32 if neither is one)."""
    dtypes = [v.dtype for v in (loc, matrix) if isinstance(v, Tensor) and v.dtype in FLOAT_DTYPES]
    dtype = promote_types(*dtypes) if len(dtypes) == 2 else dtypes[0] if dtypes else as_dtype("float32")
    return tuple(cast(v, dtype) if isinstance(v, Tensor) and v.dtype != dtype else v if isinstance(v, Tensor)
                 else constant(np.asarray(v, to_numpy(dtype))) for v in (loc, matrix))


def _symmetric(m: Tensor) -> Tensor:
    return (m + swap_last(m)) * 0.5


def mahalanobis(scale_tril: Tensor, diff: Tensor) -> Tensor:
    """``diff^T (L L^T)^-1 diff`` over the last dim, batch dims broadcast."""
    z = solve_triangular(scale_tril, unsqueeze(diff, -1), upper=False)
    return sum_(z * z, axis=[-2, -1])


def half_log_det(scale_tril: Tensor) -> Tensor:
    return sum_(log(diagonal(scale_tril, 0, -2, -1)), axis=-1)


class MultivariateNormal(Distribution):
    """``MultivariateNormal(loc, covariance_matrix=None, precision_matrix=None, scale_tril=None)``: exactly one
    matrix; event shape ``(n,)``, batch shape ``loc``'s and the matrix's broadcast."""

    has_rsample, support = True, REAL_VECTOR

    def __init__(self, loc: Any, covariance_matrix: Any = None, precision_matrix: Any = None,
                 scale_tril: Any = None, validate_args: bool | None = None):
        given = [(k, v) for k, v in (("covariance_matrix", covariance_matrix), ("precision_matrix", precision_matrix),
                                     ("scale_tril", scale_tril)) if v is not None]
        if len(given) != 1:
            raise fail("MultivariateNormal", [], "exactly one of covariance_matrix, precision_matrix or scale_tril "
                                                 f"must be given (as torch), got {[k for k, _ in given] or 'none'}")
        name, matrix = given[0]
        loc, matrix = _lifted(loc, matrix)
        n = self._check_shapes(loc, name, matrix)
        super().__init__((), (n,), validate_args)
        value = known(matrix)
        if self._validate_args and value is not None and not CHECKS[name][1](np.asarray(value)):
            raise fail("MultivariateNormal", [matrix], f"{name} must satisfy constraints.{CHECKS[name][0]}, got "
                                                       f"{np.asarray(value)}")
        # a matrix is read symmetrised, so its gradient is symmetric, as torch's (gc.linalg.cholesky's stays in
        # the triangle it reads)
        tril = {"scale_tril": lambda m: m, "covariance_matrix": lambda m: cholesky(_symmetric(m)),
                "precision_matrix": lambda m: cholesky(cholesky_inverse(cholesky(_symmetric(m))))}[name](matrix)
        self._scale_tril = broadcast_tensors(tril, unsqueeze(loc, -1))[0]
        self._given, self._given_matrix = name, broadcast_tensors(matrix, unsqueeze(loc, -1))[0]
        self.loc = broadcast_tensors(unsqueeze(loc, -1), tril)[0][..., 0]
        self._batch_shape = tuple(self.loc.shape[:-1])

    @staticmethod
    def _check_shapes(loc: Tensor, name: str, matrix: Tensor) -> int:
        if loc.ndim < 1:
            raise fail("MultivariateNormal", [loc], f"loc must be at least one-dimensional, got {loc.type_str()}")
        n = loc.shape[-1]
        if not isinstance(n, int):
            raise fail("MultivariateNormal", [loc], f"needs a static event size, got loc {loc.type_str()}")
        if matrix.ndim < 2 or tuple(matrix.shape[-2:]) != (n, n):
            raise fail("MultivariateNormal", [loc, matrix], f"{name} must be (..., {n}, {n}) matrices (n = loc's last "
                                                            f"dim), got {matrix.type_str()}")
        try:
            broadcast(loc.shape[:-1], matrix.shape[:-2])
        except InferenceError as exc:
            raise fail("MultivariateNormal", [loc, matrix], f"loc's and {name}'s batch dims do not broadcast: "
                                                            f"{exc}") from None
        return n

    def _matrix(self, name: str, derived: Any) -> Tensor:
        """The matrix ``name``: the one given, as torch's (so is its gradient), else ``derived(L)``."""
        return self._given_matrix if self._given == name else derived(self._scale_tril)

    scale_tril = property(lambda self: self._scale_tril)
    covariance_matrix = property(lambda self: self._matrix("covariance_matrix", lambda t: matmul(t, swap_last(t))))
    precision_matrix = property(lambda self: self._matrix("precision_matrix", cholesky_inverse))
    mean = mode = property(lambda self: self.loc)
    variance = property(lambda self: sum_(self._scale_tril * self._scale_tril, axis=-1))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        eps = randn_like(self._expanded(self.loc, sample_shape))
        return self.loc + squeeze(matmul(self._scale_tril, unsqueeze(eps, -1)), -1)

    def log_prob(self, value: Any) -> Tensor:
        diff = self._value(value, self.loc) - self.loc
        n = self._event_shape[0]
        return -0.5 * (n * math.log(2 * math.pi) + mahalanobis(self._scale_tril, diff)) - half_log_det(
            self._scale_tril)

    def entropy(self) -> Tensor:
        return 0.5 * self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + half_log_det(self._scale_tril)


__all__ = ["MultivariateNormal", "half_log_det", "mahalanobis"]
