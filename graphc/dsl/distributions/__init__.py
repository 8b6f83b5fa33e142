"""``gc.distributions``: torch.distributions' common families under torch's names and semantics,
captured to standard ONNX ops (sampling by ``RandomUniformLike``/``RandomNormalLike``)."""

from graphc.dsl.distributions.base import Distribution
from graphc.dsl.distributions.continuous import Cauchy, Exponential, Gumbel, Laplace, LogNormal, Normal, Uniform
from graphc.dsl.distributions.discrete import Bernoulli, Categorical, OneHotCategorical
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.distributions.kl import kl_divergence

__all__ = ["Bernoulli", "Categorical", "Cauchy", "Distribution", "Exponential", "Gumbel", "Independent", "Laplace",
           "LogNormal", "Normal", "OneHotCategorical", "Uniform", "kl_divergence"]
