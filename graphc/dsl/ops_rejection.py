"""Exact draws that need rejection: ``gc._standard_gamma`` (Marsaglia-Tsang) and ``gc.poisson`` (inversion by
sequential search below rate 10, Hörmann's PTRS transformed rejection from 10 on), torch's names.

Each is an ONNX ``Loop`` whose body draws fresh uniforms/normals for every element (``RandomUniformLike``/
``RandomNormalLike``: onnxruntime's kernel keeps one generator per node, so each iteration draws anew; the numpy
backend draws from the Session's generator), keeps the newly accepted values (``Where``) and stops once every element
is accepted (the Loop's ``cond``). The work is float64; the result is cast to the input's dtype and detached.
``gc._standard_gamma`` adds torch's implicit gradient to its draws (``graphc.dsl.ops_gamma_grad``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import control
from graphc.dsl.builder import current, known_value, op_error, user_source
from graphc.dsl.ops import cast, constant, detach, emit, exp, lift, log, maximum, sqrt, where
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops_gamma_grad import implicit_term, standard_gamma_grad
from graphc.dsl.ops_math import any as any_
from graphc.dsl.ops_math import floor
from graphc.dsl.ops_sample import rand_like, randn_like
from graphc.dsl.ops_special import lgamma
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES, to_numpy

# A loop stops after this many tries even if an element is still rejected. Each try accepts with probability at least
# 0.65 (Best-Fisher's worst; Marsaglia-Tsang's is >= 0.95 for alpha >= 1, PTRS's about 0.75 at rate 10), and the
# search below rate 10 ends within ~250 terms (where they underflow), so the chance of reaching it is below
# 0.35**1000 < 1e-450 per element.
MAX_TRIES = 1000
PTRS_FROM = 10.0  # Hörmann's PTRS is valid for rates >= 10; below it, inversion


def _float_input(fn: str, x: Any, name: str, want: str = "", ok: Callable[[np.ndarray], Any] | None = None) -> Tensor:
    """``x`` lifted, refused unless float or, given ``ok``, where it is a constant with a value not ``ok``
    (``want``)."""
    t = lift(x)
    if t.dtype not in FLOAT_DTYPES:
        raise op_error(fn, [t], f"{name} must be a floating point Tensor, got {t.dtype} (torch refuses it too)",
                       user_source())
    value = known_value(t) if ok is not None else None
    with np.errstate(invalid="ignore"):
        if value is not None and not np.all(ok(np.asarray(value))):
            raise op_error(fn, [t], f"{name} must be {want}, got {np.asarray(value)}", user_source())
    return t


def until_accepted(step: Callable[..., tuple], state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """``state = step(*state)[1:]`` while ``step``'s first result (a bool scalar: some element still pending) is
    true, at most ``MAX_TRIES`` times, as one ONNX ``Loop`` whose ``cond`` is that flag. Signature: ai.onnx@21::Loop"""
    builder, source = current(), user_source()

    def body(_iter: Tensor, _cond: Tensor, *carried: Tensor) -> list:
        return list(step(*carried))

    in_types = [("iter", "int64", []), ("cond", "bool", [])] + [
        (f"state{k}", t.dtype, t.shape) for k, t in enumerate(state)]
    graph, _, _ = control.trace_subgraph(builder, body, [], in_types, "rejection_body")

    trip, go = constant(np.asarray(MAX_TRIES, np.int64)), constant(np.asarray(True))
    outs = emit("Loop", [trip, go, *state], {"body": graph}, len(state), out_types=[(t.dtype, t.shape) for t in state],
                source=source, evaluator=lambda arrays: control.run_loop(builder, graph, arrays))
    return tuple(outs) if len(state) > 1 else (outs,)


def _marsaglia_tsang(alpha: Tensor) -> Tensor:
    """Gamma(alpha, 1) draws for float64 ``alpha >= 1``: ``d v`` for ``v = (1 + c z)^3``, ``d = alpha - 1/3``,
    ``c = 1 / sqrt(9 d)``, accepted where ``log u < z^2 / 2 + d - d v + d log v`` (Marsaglia and Tsang, 2000)."""
    d = alpha - 1.0 / 3.0
    c = 1.0 / sqrt(d * 9.0)

    def step(x: Tensor, done: Tensor) -> tuple:
        z, u = randn_like(x), rand_like(x)
        t = c * z + 1.0
        v = t * t * t
        positive = v > 0.0
        logv = log(where(positive, v, 1.0))
        ok = positive & (log(u) < z * z * 0.5 + d - d * v + d * logv) & ~done
        return any_(~(done | ok)), where(ok, d * v, x), done | ok

    return until_accepted(step, (alpha * 0.0, alpha < 0.0))[0]  # alpha < 0.0: all False, alpha's shape


def gamma_draws(alpha: Any) -> Tensor:
    """Gamma(alpha, 1) draws of ``alpha``'s shape and dtype (``alpha > 0``; not checked at run time), without
    gradient: Marsaglia-Tsang on ``alpha``, or for ``alpha < 1`` on ``alpha + 1`` times ``u^(1/alpha)``; at least the
    dtype's smallest normal number, as torch's."""
    a = _float_input("_standard_gamma", alpha, "alpha")
    a64 = detach(cast(a, "float64") if a.dtype != "float64" else a)
    small = a64 < 1.0
    g = _marsaglia_tsang(where(small, a64 + 1.0, a64))
    boost = exp(log(rand_like(a64)) / where(small, a64, 1.0))
    tiny = float(np.finfo(to_numpy(a.dtype)).tiny)
    x = maximum(where(small, g * boost, g), tiny)
    return cast(x, a.dtype) if a.dtype != "float64" else x


def standard_gamma(alpha: Any) -> Tensor:
    """``gamma_draws(alpha)`` differentiated as torch's: the value is the exact draw ``x``, and ``d x / d alpha`` is
    ``gc._standard_gamma_grad(alpha, x)`` (the implicit reparameterisation gradient of the Gamma cdf)."""
    a = _float_input("_standard_gamma", alpha, "alpha")
    x = gamma_draws(a)
    return x + implicit_term(a, standard_gamma_grad(a, x))


_standard_gamma = standard_gamma  # torch's name


def _inversion(rate: Tensor) -> Tensor:
    """Poisson(rate) draws for float64 ``rate < 10``: the least ``k`` with ``u < F(k)``, summing the pmf term by term
    (``p(k) = p(k - 1) rate / k``) until every element's ``u`` is passed (or its term underflows, after ~400)."""
    u = rand_like(rate)

    def step(k: Tensor, p: Tensor, cdf: Tensor) -> tuple:
        more = (u >= cdf) & (p > 0.0)
        k1 = where(more, k + 1.0, k)
        p1 = where(more, p * rate / maximum(k1, 1.0), p)
        return any_(more), k1, p1, where(more, cdf + p1, cdf)

    p0 = exp(-rate)
    return until_accepted(step, (rate * 0.0, p0, p0))[0]


def _ptrs(lam: Tensor) -> Tensor:
    """Poisson(lam) draws for float64 ``lam >= 10``: Hörmann's PTRS (transformed rejection with squeeze, 1993), as
    numpy's ``random_poisson_ptrs``."""
    slam, loglam = sqrt(lam), log(lam)
    b = slam * 2.53 + 0.931
    a = b * 0.02483 - 0.059
    log_invalpha = log(1.0 / (b - 3.4) * 1.1328 + 1.1239)
    vr = 0.9277 - 3.6224 / (b - 2.0)

    def step(k: Tensor, done: Tensor) -> tuple:
        uu, v = rand_like(lam) - 0.5, rand_like(lam)
        us = 0.5 - abs_(uu)
        kk = floor((a * 2.0 / us + b) * uu + lam + 0.43)
        squeeze = (us >= 0.07) & (v <= vr)
        valid = (kk >= 0.0) & ~((us < 0.013) & (v > us))
        k0 = maximum(kk, 0.0)
        tail = log(v) + log_invalpha - log(a / (us * us) + b) <= kk * loglam - lam - lgamma(k0 + 1.0)
        ok = (squeeze | (valid & tail)) & ~done
        return any_(~(done | ok)), where(ok, kk, k), done | ok

    return until_accepted(step, (lam * 0.0, lam < 0.0))[0]


def poisson(input: Any, generator: Any = None) -> Tensor:  # noqa: A002 - torch's name
    """Poisson draws of the rates ``input`` (``>= 0``, finite; not checked at run time), in its dtype: inversion
    below rate 10, PTRS from 10 on, each loop run only for its own elements. No gradient (torch's is zero)."""
    r = _float_input("poisson", input, "input", ">= 0 and finite (torch refuses other rates)",
                     lambda v: (v >= 0) & (v < np.inf))
    if generator is not None:
        raise op_error("poisson", [r], "a torch generator is refused: graphc draws from the Session's seeded "
                                       "generator (see gc.capture's seed)", user_source())
    r64 = detach(cast(r, "float64") if r.dtype != "float64" else r)
    large = r64 >= PTRS_FROM
    k = where(large, _ptrs(where(large, r64, PTRS_FROM)), _inversion(where(large, 0.0, r64)))
    return cast(k, r.dtype) if r.dtype != "float64" else k


__all__ = ["MAX_TRIES", "_standard_gamma", "gamma_draws", "poisson", "standard_gamma", "until_accepted"]
