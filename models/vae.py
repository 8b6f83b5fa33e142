"""A variational autoencoder over binary pixels (Kingma and Welling): an MLP encoder gives the
posterior ``q(z|x) = Normal(mu, softplus(s))``, a reparameterized draw ``z`` goes through an MLP
decoder to Bernoulli logits, and the loss is the negative ELBO,
``mean(kl(q || Normal(0, 1)) - log p(x|z))``. ``eps`` (the standard-normal draw, ``[N, latent]``)
may be fed, which makes a step reproducible; without it ``rsample()`` draws it.

    graphc capture models/vae.py:VAE --input x:float32[N,64] -o vae.onnx
"""

from __future__ import annotations

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

D = gc.distributions


class VAE(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 32, latent: int = 8, dtype: str = "float32"):
        super().__init__()
        self.enc = nn.Linear(features, hidden, dtype=dtype)
        self.mu = nn.Linear(hidden, latent, dtype=dtype)
        self.s = nn.Linear(hidden, latent, dtype=dtype)
        self.dec1 = nn.Linear(latent, hidden, dtype=dtype)
        self.dec2 = nn.Linear(hidden, features, dtype=dtype)

    def forward(self, x, eps=None):
        h = gc.relu(self.enc(x))
        q = D.Normal(self.mu(h), F.softplus(self.s(h)))
        z = q.rsample() if eps is None else q.loc + q.scale * eps
        logits = self.dec2(gc.relu(self.dec1(z)))
        reconstruction = D.Bernoulli(logits=logits).log_prob(x).sum(-1)
        prior = D.Normal(gc.zeros_like(q.loc), gc.ones_like(q.scale))
        kl = D.kl_divergence(q, prior).sum(-1)
        return {"loss": (kl - reconstruction).mean(), "logits": logits, "z": z}


def example_inputs(batch: int | str = "N", features: int = 64) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, features), name="x")}
