"""``gc.nn.utils.parametrizations.orthogonal``: torch's orthogonal parametrization of a matrix (or a batch of
them) through ``matrix_exp``, ``cayley`` or ``householder``, written in graphc's linalg ops (``gc.linalg.
matrix_exp``, ``solve``, ``householder_product``), so a capture differentiates it; its ``right_inverse`` (at
registration and on assignment) in numpy, as torch's under ``no_grad``."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import linalg, ops
from graphc.dsl.builder import active, user_source
from graphc.dsl.ops_array import cat, zeros
from graphc.dsl.ops_factories import as_tensor, eye
from graphc.dsl.seeding import initial_seed
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.parametrize import register_parametrization, tensor_value

__all__ = ["orthogonal"]

MAPS = ("matrix_exp", "cayley", "householder")


def _make_orthogonal(a: np.ndarray) -> np.ndarray:
    """The Q of ``a = QR`` with ``diag(R)`` non-negative (torch's ``_make_orthogonal``)."""
    q, r = np.linalg.qr(a)
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def _is_orthogonal(q: np.ndarray) -> bool:
    n, k = q.shape[-2:]
    atol = 10.0 * n * np.finfo(q.dtype).eps
    return np.allclose(np.swapaxes(q, -1, -2) @ q, np.eye(k), atol=atol)


class _Orthogonal(Module):
    """The parametrization: ``forward`` maps any tensor of ``shape`` to one with orthonormal columns (rows,
    where wide); with ``use_trivialization``, times the buffer ``base`` that ``right_inverse`` sets."""

    def __init__(self, shape: tuple[int, ...], orthogonal_map: str, *, use_trivialization: bool = True) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.orthogonal_map = orthogonal_map
        self.use_trivialization = use_trivialization
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X: Any) -> Any:
        n, k = X.shape[-2], X.shape[-1]
        transposed = n < k
        if transposed:
            X, n, k = X.mT, k, n
        if self.orthogonal_map == "householder":
            A = X.tril(-1)
            Q = linalg.householder_product(A, 2.0 / (1.0 + (A * A).sum(-2)))
            signs = ops.cast(ops.cast(X.diagonal(dim1=-2, dim2=-1), "int32"), X.dtype)  # +-1, not trained
            Q = Q * signs.unsqueeze(-2)
        else:
            X = X.tril()
            if n != k:
                X = cat([X, zeros(*X.shape[:-2], n, n - k, dtype=X.dtype)], dim=-1)
            A = X - X.mT
            if self.orthogonal_map == "matrix_exp":
                Q = linalg.matrix_exp(A)
            else:
                Id = eye(n, dtype=A.dtype)
                Q = linalg.solve(Id - 0.5 * A, Id + 0.5 * A)
            Q = Q[..., :k] if n != k else Q
        if self.use_trivialization:
            base = self.base
            Q = ops.matmul(base if active() is not None else as_tensor(base.numpy()), Q)
        return Q.mT if transposed else Q

    def right_inverse(self, Q: Any) -> np.ndarray:
        """The original that gives ``Q``: with ``use_trivialization``, ``base`` set to ``Q`` made orthogonal
        (by QR; a wide or tall one completed by normal draws, from ``gc.manual_seed``'s seed: load torch's
        ``base`` for its) and minus the identity returned; else householder's reflectors of ``Q``."""
        Q = np.asarray(Q)
        if Q.shape != self.shape:
            raise CaptureError(f"orthogonal: expected a matrix or batch of matrices of shape {self.shape}, got "
                               f"{Q.shape} (at {user_source()})")
        n, k = Q.shape[-2:]
        transposed = n < k
        if transposed:
            Q, n, k = np.swapaxes(Q, -1, -2), k, n
        if not self.use_trivialization:
            if self.orthogonal_map != "householder":
                raise NotImplementedError("It is not possible to assign to the matrix exponential or the Cayley "
                                          "parametrizations when use_trivialization=False.")
            h, tau = np.linalg.qr(Q, mode="raw")
            A = np.swapaxes(h, -1, -2).copy()
            diag = np.sign(np.diagonal(A, axis1=-2, axis2=-1)) * np.where(tau == 0.0, -1.0, 1.0)
            A[..., range(k), range(k)] = diag
            return np.swapaxes(A, -1, -2) if transposed else A
        if n == k:
            Q = Q.copy() if _is_orthogonal(Q) else _make_orthogonal(Q)
        else:
            rng = np.random.default_rng(initial_seed())
            Q = _make_orthogonal(np.concatenate([Q, rng.standard_normal((*Q.shape[:-2], n, n - k))], axis=-1))
        self.base = Parameter(Q, dtype=str(Q.dtype), buffer=True)
        neg_id = np.zeros(self.shape, Q.dtype)
        neg_id[..., range(min(self.shape[-2:])), range(min(self.shape[-2:]))] = -1.0
        return neg_id


def orthogonal(module: Module, name: str = "weight", orthogonal_map: str | None = None, *,
               use_trivialization: bool = True) -> Module:
    """``torch.nn.utils.parametrizations.orthogonal``: ``module.<name>`` (a matrix or batch of them) kept with
    orthonormal columns (rows, where wide). ``orthogonal_map`` None: ``matrix_exp`` for a square one, else
    ``householder``, as torch's. Registered ``unsafe``, as torch's; state_dict keys
    ``parametrizations.<name>.original`` and ``parametrizations.<name>.0.base`` (with ``use_trivialization``)."""
    weight = np.asarray(tensor_value(module, name, "orthogonal"))
    if weight.ndim < 2:
        raise CaptureError(f"orthogonal({type(module).__name__}.{name}): expected a matrix or batch of matrices, "
                           f"got a tensor of {weight.ndim} dimensions (at {user_source()})")
    if orthogonal_map is None:
        orthogonal_map = "matrix_exp" if weight.shape[-2] == weight.shape[-1] else "householder"
    if orthogonal_map not in MAPS:
        raise CaptureError(f"orthogonal({type(module).__name__}.{name}): orthogonal_map has to be one of "
                           f"{', '.join(MAPS)}, got {orthogonal_map!r} (at {user_source()})")
    orth = _Orthogonal(weight.shape, orthogonal_map, use_trivialization=use_trivialization)
    return register_parametrization(module, name, orth, unsafe=True)
