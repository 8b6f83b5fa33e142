"""The activations of ONNX's RNN, GRU and LSTM, one table for every form graphc computes them in:
the written-out cell (``passes/recurrent.py``), the numpy kernels (``backends/numpy/rnn.py``) and
the parameters filled in for onnxruntime (``backends/recurrent.py``).

Each op's default activations (per direction), the alpha/beta each activation takes, and ONNX's
defaults for them (those of the op of that name: LeakyRelu alpha 0.01, ThresholdedRelu 1, Affine 1
and 0, ScaledTanh 1 and 1, HardSigmoid 0.2 and 0.5, Elu 1), taken where ``activation_alpha`` and
``activation_beta`` run out.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_ACTIVATIONS", "activation_names", "activation_params", "takes_params"]

DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
# activation (lower case) -> (how many of alpha, beta it takes, their defaults)
_PARAMS = {"sigmoid": (0, (0.0, 0.0)), "tanh": (0, (0.0, 0.0)), "relu": (0, (0.0, 0.0)),
           "softsign": (0, (0.0, 0.0)), "softplus": (0, (0.0, 0.0)),
           "affine": (2, (1.0, 0.0)), "leakyrelu": (1, (0.01, 0.0)), "thresholdedrelu": (1, (1.0, 0.0)),
           "scaledtanh": (2, (1.0, 1.0)), "hardsigmoid": (2, (0.2, 0.5)), "elu": (1, (1.0, 0.0))}


def takes_params(name: str) -> int | None:
    """How many of (alpha, beta) the activation ``name`` takes; None where ONNX has none of that name."""
    known = _PARAMS.get(name.lower())
    return None if known is None else known[0]


def activation_names(op: str, names: Sequence[str | bytes] | None, directions: int) -> list[str]:
    """A node's activations, every direction's in turn: ``names`` (its ``activations``), else the op's defaults."""
    if not names:
        return list(DEFAULT_ACTIVATIONS[op]) * directions
    return [n.decode() if isinstance(n, bytes) else n for n in names]


def activation_params(names: Sequence[str], alphas: Sequence[float] | None,
                      betas: Sequence[float] | None) -> list[tuple[float, float]]:
    """Each activation's (alpha, beta): ``alphas``/``betas`` taken in order by the activations that
    have them (as onnxruntime takes them), ONNX's defaults where they run out. Every name must be known
    (``takes_params``)."""
    alphas, betas = list(alphas or []), list(betas or [])
    params = []
    for name in names:
        count, (alpha, beta) = _PARAMS[name.lower()]
        if count >= 1 and alphas:
            alpha = float(alphas.pop(0))
        if count >= 2 and betas:
            beta = float(betas.pop(0))
        params.append((alpha, beta))
    return params
