"""``gc.distributions.transforms``: torch.distributions.transforms' classes under torch's names (the interface in
transform_base.py, the elementwise maps in transforms_elementwise.py, the vector and matrix ones and the
``CatTransform``/``StackTransform`` functors in transforms_vector.py, ``CorrCholeskyTransform`` in
transforms_corr.py)."""

from graphc.dsl.distributions.transform_base import (ComposeTransform, IndependentTransform, ReshapeTransform,
                                                     Transform, identity_transform)
from graphc.dsl.distributions.transforms_corr import CorrCholeskyTransform
from graphc.dsl.distributions.transforms_elementwise import (AbsTransform, AffineTransform,
                                                             CumulativeDistributionTransform, ExpTransform,
                                                             PowerTransform, SigmoidTransform, SoftplusTransform,
                                                             TanhTransform)
from graphc.dsl.distributions.transforms_vector import (CatTransform, LowerCholeskyTransform,
                                                        PositiveDefiniteTransform, SoftmaxTransform, StackTransform,
                                                        StickBreakingTransform)

__all__ = ["AbsTransform", "AffineTransform", "CatTransform", "ComposeTransform", "CumulativeDistributionTransform",
           "ExpTransform", "IndependentTransform", "LowerCholeskyTransform", "PositiveDefiniteTransform",
           "PowerTransform", "ReshapeTransform", "SigmoidTransform", "SoftmaxTransform", "SoftplusTransform",
           "StackTransform", "StickBreakingTransform", "TanhTransform", "Transform", "identity_transform"]
__all__ += ["CorrCholeskyTransform"]
