"""``gc.distributions``: torch.distributions' common families under torch's names and semantics,
captured to standard ONNX ops (sampling by ``RandomUniformLike``/``RandomNormalLike``)."""

from graphc.dsl.distributions import constraints, transforms
from graphc.dsl.distributions.base import Distribution
from graphc.dsl.distributions.constraint_registry import biject_to, transform_to
from graphc.dsl.distributions.continuous import (Cauchy, Exponential, GeneralizedPareto, Gumbel, Laplace, LogNormal,
                                                 Normal, Uniform)
from graphc.dsl.distributions.continuous_bernoulli import ContinuousBernoulli
from graphc.dsl.distributions.counts import Binomial, Geometric, NegativeBinomial, Poisson
from graphc.dsl.distributions.discrete import (Bernoulli, Categorical, OneHotCategorical,
                                               OneHotCategoricalStraightThrough)
from graphc.dsl.distributions.gamma import Beta, Chi2, Dirichlet, FisherSnedecor, Gamma, StudentT, VonMises
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.distributions.kl import kl_divergence, register_kl
from graphc.dsl.distributions.lkj import LKJCholesky
from graphc.dsl.distributions.lowrank import LowRankMultivariateNormal
from graphc.dsl.distributions.mixture import MixtureSameFamily
from graphc.dsl.distributions.multinomial import Multinomial
from graphc.dsl.distributions.mvn import MultivariateNormal
from graphc.dsl.distributions.power_families import InverseGamma, Kumaraswamy, Weibull
from graphc.dsl.distributions.transformed import (HalfCauchy, HalfNormal, LogisticNormal, Pareto, RelaxedBernoulli,
                                                  RelaxedOneHotCategorical)
from graphc.dsl.distributions.transformed_distribution import TransformedDistribution
from graphc.dsl.distributions.transforms import (AbsTransform, AffineTransform, CatTransform, ComposeTransform,
                                                 CorrCholeskyTransform,
                                                 CumulativeDistributionTransform, ExpTransform, IndependentTransform,
                                                 LowerCholeskyTransform, PositiveDefiniteTransform, PowerTransform,
                                                 ReshapeTransform, SigmoidTransform, SoftmaxTransform,
                                                 SoftplusTransform, StackTransform, StickBreakingTransform,
                                                 TanhTransform, Transform, identity_transform)

__all__ = ["AbsTransform", "AffineTransform", "Bernoulli", "Beta", "Binomial", "CatTransform", "Categorical", "Cauchy",
           "Chi2", "ComposeTransform", "ContinuousBernoulli", "CumulativeDistributionTransform", "Dirichlet",
           "Distribution", "ExpTransform", "Exponential", "Gamma", "Geometric", "Gumbel", "HalfCauchy", "HalfNormal",
           "Independent", "IndependentTransform", "Laplace", "LogNormal", "LowRankMultivariateNormal",
           "LowerCholeskyTransform", "MultivariateNormal", "NegativeBinomial", "Normal", "OneHotCategorical", "Pareto",
           "Poisson", "PositiveDefiniteTransform", "PowerTransform", "RelaxedBernoulli", "RelaxedOneHotCategorical",
           "ReshapeTransform", "SigmoidTransform", "SoftmaxTransform", "SoftplusTransform", "StackTransform",
           "StickBreakingTransform", "StudentT", "TanhTransform", "Transform", "TransformedDistribution", "Uniform",
           "VonMises", "biject_to", "constraints", "identity_transform", "kl_divergence", "register_kl",
           "transform_to", "transforms"]
__all__ += ["CorrCholeskyTransform"]
__all__ += ["LKJCholesky"]
__all__ += ["FisherSnedecor", "GeneralizedPareto", "InverseGamma", "Kumaraswamy", "LogisticNormal", "MixtureSameFamily",
            "Multinomial", "OneHotCategoricalStraightThrough", "Weibull"]
