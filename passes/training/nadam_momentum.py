"""NAdam's momentum cache as float64 graph scalars: ``mu_t = b1*(1 - 0.5*0.96^(t*momentum_decay))``
and torch's running product ``mu_product = mu_1*...*mu_t``, from the step count for a constant
beta1 (``closed_form_product``); where beta1 is scheduled the factors differ step to step and the
graphs keep the product as a state (``scheduled.MU_PRODUCT``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter

# terms of closed_form_product's series: 0.5^K / K, K = 64, under 1e-19 of the first
_SERIES = np.arange(1, 65, dtype=np.float64)


def closed_form_product(b: Emitter, f, t: ir.Value, beta1: float, momentum_decay: float) -> ir.Value:
    """NAdam's ``mu_1 * ... * mu_t`` (float64), ``mu_i = b1*(1 - 0.5*q^i)``, ``q = 0.96^momentum_decay``,
    from ``t`` alone: ``b1^t * exp(-sum_i sum_k 0.5^k/k * q^(ik))`` (the log's series), the sum over
    ``i`` geometric: ``sum_k c_k * (1 - q^(kt))``, ``c_k = 0.5^k/k * q^k/(1 - q^k)`` (float64 at build
    time, ``expm1``), ``1 - e^y = -2*tanh(y/2)/(1 - tanh(y/2))`` without ``1 - e^y``'s cancellation.
    Against PyTorch's running product in float64 (``mu_product``, one per param), t up to 1e5,
    momentum_decay 1e-6 .. 10, b1 0 .. 0.999: within 5e-16 of ``1 - mu_product``, what the step
    divides by (1000 at b1 = 0.999: 7e-15, the running product's own rounding)."""
    if momentum_decay == 0:  # mu_i = b1 / 2
        return b.op("Pow", f(0.5 * beta1), t)
    x = momentum_decay * np.log(0.96) * _SERIES  # k * log q
    coef = 0.5 ** _SERIES / _SERIES * np.exp(x) / -np.expm1(x)
    th = b.op("Tanh", b.op("Mul", b.const(x / 2), t))
    # sum_k c_k * (1 - q^(kt)) = sum_k -2 c_k * th / (1 - th)
    log_rest = b.op("ReduceSum", b.op("Mul", b.const(2.0 * coef), b.op("Div", th, b.op("Sub", f(1.0), th))),
                    keepdims=0)
    return b.op("Mul", b.op("Pow", f(beta1), t), b.op("Exp", log_rest))
