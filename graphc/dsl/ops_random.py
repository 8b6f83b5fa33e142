"""Functions that draw random numbers, with ``torch.nn.functional``'s names and signatures:
``rrelu`` (a random negative slope in training) and ``gumbel_softmax``. The noise is a
``RandomUniformLike`` node fed through ``gc.detach``: each run draws anew (from the numpy
backend's seeded generator, or onnxruntime's, which the node's ``seed`` attribute seeds), and no
gradient flows into the noise."""

from __future__ import annotations

from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.inplace import into, writes_input
from graphc.dsl.ops import detach, emit, lift, log, scalar, softmax, where
from graphc.dsl.ops_array import argmax, scatter, zeros_like
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import finfo


def node_seed() -> float:
    """The ``seed`` attribute of a new random node, the next one drawn from the capture's ``seed``.
    onnxruntime seeds each random node's generator with it once per session (unset, it uses one
    per-process clock value plus the node's index, so two nodes' first draws nearly agree); the
    numpy backend draws all nodes from the session's one seeded generator and ignores it. An integer below
    2**24, exact as the attribute's float32."""
    return float(current().node_seeds.spawn(1)[0].generate_state(1)[0] % 2**24)


def uniform_like(x: Tensor, low: float, high: float) -> Tensor:
    """Fresh U[low, high) noise of ``x``'s shape and dtype. Signature: ai.onnx@1::RandomUniformLike"""
    return emit("RandomUniformLike", [detach(x)], {"low": float(low), "high": float(high), "seed": node_seed()})


@writes_input
def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,  # noqa: A002
          inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``a x``: in training ``a ~ U(lower, upper)`` drawn per element
    (the gradient there is ``a``, as torch's), in eval ``a = (lower + upper) / 2``."""
    x = lift(input)
    if not lower <= upper:
        raise op_error("rrelu", [x], f"lower ({lower}) must be <= upper ({upper})", user_source())
    slope = uniform_like(x, lower, upper) if training else scalar((lower + upper) / 2, x)
    return into(x, where(x > scalar(0.0, x), x, slope * x), inplace)


def gumbel_softmax(logits: Tensor, tau: float = 1.0, hard: bool = False, eps: float = 1e-10,
                   dim: int = -1) -> Tensor:
    """``softmax((logits + g) / tau, dim)`` with Gumbel(0, 1) noise ``g = -log(-log(u))``; with
    ``hard`` the one-hot of its argmax, whose gradient is the soft sample's (straight through:
    ``y_hard - detach(y_soft) + y_soft``). ``eps`` is accepted for torch's signature (unused there too)."""
    logits = lift(logits)
    if not tau > 0:
        raise op_error("gumbel_softmax", [logits], f"tau must be > 0, got {tau}", user_source())
    tiny = float(finfo(logits.dtype).tiny)  # u > 0: the noise is finite
    gumbels = -log(-log(uniform_like(logits, tiny, 1.0)))
    y_soft = softmax((logits + gumbels) / scalar(tau, logits), dim)
    if not hard:
        return y_soft
    y_hard = scatter(zeros_like(y_soft), dim, argmax(y_soft, dim, keepdim=True), 1.0)
    return y_hard - detach(y_soft) + y_soft


__all__ = ["gumbel_softmax", "rrelu"]
