"""``gc.distributions``: torch.distributions' common families under torch's names and semantics,
captured to standard ONNX ops (sampling by ``RandomUniformLike``/``RandomNormalLike``)."""

from graphc.dsl.distributions.base import Distribution
from graphc.dsl.distributions.continuous import Cauchy, Exponential, Gumbel, Laplace, LogNormal, Normal, Uniform
from graphc.dsl.distributions.continuous_bernoulli import ContinuousBernoulli
from graphc.dsl.distributions.counts import Binomial, Geometric, NegativeBinomial, Poisson
from graphc.dsl.distributions.discrete import Bernoulli, Categorical, OneHotCategorical
from graphc.dsl.distributions.gamma import Beta, Chi2, Dirichlet, Gamma, StudentT, VonMises
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.distributions.kl import kl_divergence, register_kl
from graphc.dsl.distributions.mvn import MultivariateNormal
from graphc.dsl.distributions.transformed import (HalfCauchy, HalfNormal, Pareto, RelaxedBernoulli,
                                                  RelaxedOneHotCategorical)

__all__ = ["Bernoulli", "Beta", "Binomial", "Categorical", "Cauchy", "Chi2", "ContinuousBernoulli", "Dirichlet",
           "Distribution", "Exponential", "Gamma", "Geometric", "Gumbel", "HalfCauchy", "HalfNormal", "Independent",
           "Laplace", "LogNormal", "MultivariateNormal", "NegativeBinomial", "Normal", "OneHotCategorical", "Pareto",
           "Poisson", "RelaxedBernoulli", "RelaxedOneHotCategorical", "StudentT", "Uniform", "VonMises",
           "kl_divergence", "register_kl"]
