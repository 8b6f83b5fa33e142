"""The torch comparison both distribution test files run: a family's method or property, as a function of its
parameters and a value, against torch.distributions (values on numpy and ort-cpu, gradients to every parameter and,
for a continuous value, to the value)."""

from __future__ import annotations

import numpy as np

import graphc as gc

try:
    from torch_grad_util import TorchNS, assert_matches_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, assert_matches_torch


def D(M):
    """torch.distributions for torch's namespace, gc.distributions for the DSL's."""
    return M.torch.distributions if isinstance(M, TorchNS) else gc.distributions


def method_of(make, method):
    """``fn(M, *params, value)``: ``method`` of ``make(D(M), *params)`` (icdf at ``sigmoid(value)``)."""
    def fn(M, *args):
        *params, value = args
        dist = make(D(M), *params)
        if method in ("log_prob", "cdf"):
            return getattr(dist, method)(value)
        if method == "icdf":
            return dist.icdf(M.sigmoid(value))
        if method == "entropy":
            return dist.entropy()
        return getattr(dist, method)
    return fn


def assert_method_matches_torch(make, method, params, value, differentiable, rng) -> None:
    fn = method_of(make, method)
    continuous = value.dtype.kind == "f" and not np.array_equal(value, np.floor(value))
    if differentiable and continuous and method in ("log_prob", "cdf", "icdf"):
        assert_matches_torch(fn, [*params, value], {}, rng)
    elif differentiable:
        assert_matches_torch(lambda M, *a, v: fn(M, *a, v), list(params), {"v": value}, rng)
    else:
        names = [f"a{i}" for i in range(len(params))]
        assert_matches_torch(lambda M, v, **kw: fn(M, *(kw[n] for n in names), v), [],
                             {"v": value, **dict(zip(names, params))}, rng)


def assert_shapes_match_torch(make, ref, sample_shape) -> None:
    """``make(gc.distributions)``'s batch and event shapes, and its samples' and their log_prob's shapes and dtypes
    on numpy and ort-cpu, against ``ref`` (torch's distribution of the same parameters)."""
    seen = {}

    def f(unused):
        d = make(gc.distributions)
        seen.update(batch=d.batch_shape, event=d.event_shape)
        return {"s": d.sample(sample_shape), "lp": d.log_prob(d.sample(sample_shape))}

    model = gc.capture(f, unused=np.zeros(1))
    assert (seen["batch"], seen["event"]) == (tuple(ref.batch_shape), tuple(ref.event_shape))
    want = ref.sample(sample_shape)
    for backend in ("numpy", "ort-cpu"):  # each its own draws
        out = gc.Session(model, backend=backend).run({"unused": np.zeros(1)})
        assert out["s"].shape == tuple(want.shape) and out["s"].dtype == want.numpy().dtype
        assert out["lp"].shape == tuple(ref.log_prob(want).shape) and np.all(np.isfinite(out["lp"]))
