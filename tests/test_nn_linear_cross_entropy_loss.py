"""``gc.nn.LinearCrossEntropyLoss`` against torch 2.13's with the same weights, float64 on the numpy and ort-cpu
backends: the loss and the gradients of input, ``linear.weight`` and ``linear.bias`` for every reduction,
``ignore_index``, class weights, label smoothing, K-dimensional ``out_features``, bias on and off, unbatched input,
probability targets and ``options``; torch's ``state_dict`` keys, init bounds and ``extra_repr``; bad arguments
refused naming them."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
IN, C = 5, 7

CASES = {  # name: (constructor keywords, input shape, out_features)
    "mean": ({}, (6, IN), ()),
    "sum_bias": ({"reduction": "sum", "bias": True}, (6, IN), ()),
    "none_bias": ({"reduction": "none", "bias": True}, (6, IN), ()),
    "ignore_index": ({"ignore_index": 2}, (6, IN), ()),
    "ignore_index_none": ({"ignore_index": 2, "reduction": "none"}, (6, IN), ()),
    "weight": ({"weight": True}, (6, IN), ()),
    "weight_ignore_smoothing_sum": ({"weight": True, "ignore_index": 2, "label_smoothing": 0.3, "reduction": "sum",
                                     "bias": True}, (6, IN), ()),
    "smoothing": ({"label_smoothing": 0.2}, (6, IN), ()),
    "k_dim": ({"bias": True, "weight": True}, (4, IN), (3,)),
    "k_dim_2_none": ({"reduction": "none", "ignore_index": 1}, (4, IN), (2, 3)),
    "unbatched": ({"bias": True, "label_smoothing": 0.1}, (IN,), ()),
    "probabilities": ({"bias": True, "label_smoothing": 0.1}, (6, IN), ()),
    "options": ({"options": True, "bias": True}, (6, IN), ()),
    "options_none": ({"options": True, "reduction": "none"}, (6, IN), ()),
}


def _twins(kwargs: dict, out_features: tuple):
    """``(gc layer, torch layer)`` of one construction, float64, torch's loaded with the gc layer's drawn weights."""
    ours_kw, theirs_kw = dict(kwargs, out_features=out_features), dict(kwargs, out_features=out_features)
    if kwargs.get("weight"):  # float32-exact: graphc keeps a class-weight buffer in float32, as a Parameter
        weight = RNG.integers(1, 9, C) / 4
        ours_kw["weight"], theirs_kw["weight"] = weight, torch.from_numpy(weight)
    if kwargs.get("options"):
        ours_kw["options"] = gc.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
        theirs_kw["options"] = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
    ours = gc.nn.LinearCrossEntropyLoss(IN, C, dtype="float64", **ours_kw).init_parameters(seed=4)
    theirs = torch.nn.LinearCrossEntropyLoss(IN, C, dtype=torch.float64, **theirs_kw)
    state = ours.state_dict()
    assert list(state) == list(theirs.state_dict())
    assert all(tuple(v.shape) == state[k].shape for k, v in theirs.state_dict().items())
    theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    return ours, theirs


def _target(name: str, batch: tuple, out_features: tuple) -> np.ndarray:
    if name == "probabilities":
        return RNG.dirichlet(np.ones(C), batch[0])
    target = RNG.integers(0, C, (*batch, *out_features))
    if "ignore" in name and target.ndim:
        target.flat[::3] = 2 if "k_dim" not in name else 1
    return target


@pytest.mark.parametrize("name", list(CASES))
def test_linear_cross_entropy_loss_matches_torch(name):
    kwargs, x_shape, out_features = CASES[name]
    ours, theirs = _twins(kwargs, out_features)
    x, target = RNG.standard_normal(x_shape), _target(name, x_shape[:-1], out_features)
    xt = torch.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        want = theirs(xt, torch.from_numpy(target))
    c = RNG.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    grads = {"x": xt.grad, **{f"m.{k}": p.grad for k, p in theirs.named_parameters()}}
    assert set(grads) == {"x", "m.linear.weight", *(["m.linear.bias"] if kwargs.get("bias") else [])}
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x, t: m(x, t), {"x": x}, {"t": target}, c, module=ours, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12, atol=1e-13, err_msg=backend)
        for k, g in grads.items():
            np.testing.assert_allclose(got[k], g.numpy(), rtol=1e-11, atol=1e-13, err_msg=f"{backend} {k}")


def test_linear_cross_entropy_loss_init_and_repr_are_torchs():
    ours = gc.nn.LinearCrossEntropyLoss(64, 10, out_features=(3,), bias=True, ignore_index=4, label_smoothing=0.1)
    theirs = torch.nn.LinearCrossEntropyLoss(64, 10, out_features=(3,), bias=True, ignore_index=4,
                                             label_smoothing=0.1)
    assert ours.extra_repr() == theirs.extra_repr()
    state = ours.init_parameters(seed=1).state_dict()
    assert state["linear.weight"].dtype == np.float32 and state["linear.weight"].shape == (30, 64)
    bound = 1 / np.sqrt(64)  # kaiming_uniform(a=sqrt(5)) and the bias's uniform: both +-1/sqrt(in_features)
    for key in ("linear.weight", "linear.bias"):
        values = state[key]
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound, key
        assert abs(values.std() - bound / np.sqrt(3)) < 0.1 * bound, key
    options = gc.nn.LinearCrossEntropyOptions(chunking_method="aspect_ratio:2")
    assert repr(options) == repr(torch.nn.LinearCrossEntropyOptions(chunking_method="aspect_ratio:2"))
    assert gc.nn.LinearCrossEntropyLoss(4, 3, options=options).extra_repr().endswith(f"options={options}")


@pytest.mark.parametrize("kwargs, message", [
    ({"weight": np.ones(6)}, r"LinearCrossEntropyLoss: expected weight shape to be \(7,\), got \(6,\)"),
    ({"label_smoothing": 1.5}, r"expected label_smoothing to be in range \[0, 1\], got 1.5"),
    ({"reduction": "batchmean"}, r"reduction must be 'mean', 'sum', 'none', got 'batchmean'"),
    ({"options": {"batch_chunk_size": 4}}, r"options must be None or a LinearCrossEntropyOptions \(gc.nn's or "
                                           r"torch.nn's\), got \{'batch_chunk_size': 4\} \(a dict\)"),
])
def test_linear_cross_entropy_loss_refuses_bad_arguments(kwargs, message):
    with pytest.raises(gc.CaptureError, match=message):
        gc.nn.LinearCrossEntropyLoss(IN, C, **kwargs)


def test_linear_cross_entropy_refuses_options_of_another_kind_in_capture():
    with pytest.raises(gc.CaptureError, match=r"options must be None or a LinearCrossEntropyOptions .* \(a str\)"):
        gc.capture(lambda x: gc.nn.functional.linear_cross_entropy(x, np.ones((C, IN)), np.zeros(3, np.int64),
                                                                   options="chunked"), x=np.ones((3, IN)))


@pytest.mark.parametrize("kwargs", [{"acc_policy": "fast"}, {"chunking_method": "aspect_ratio:0"},
                                    {"chunking_method": "rows"}, {"batch_chunk_size": 0},
                                    {"batch_chunk_size": 2.0}, {"acc_dtype": "int32"}])
def test_linear_cross_entropy_options_refuse_what_torchs_refuse(kwargs):
    theirs = {k: getattr(torch, v) if k == "acc_dtype" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError):
        torch.nn.LinearCrossEntropyOptions(**theirs)
    with pytest.raises(ValueError, match=f"LinearCrossEntropyOptions: {next(iter(kwargs))} must be"):
        gc.nn.LinearCrossEntropyOptions(**kwargs)


def test_linear_cross_entropy_loss_trains_as_torchs():
    """A model whose output is the module's loss: 3 SGD steps of gc.training on ort-cpu, losses and params as
    torch's."""

    class Head(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.loss = gc.nn.Linear(4, IN), gc.nn.LinearCrossEntropyLoss(IN, C, bias=True, ignore_index=0)

        def forward(self, x, t):
            return self.loss(gc.tanh(self.body(x)), t)

    net = Head().init_parameters(seed=2)
    twin = torch.nn.ModuleDict({"body": torch.nn.Linear(4, IN), "loss": torch.nn.LinearCrossEntropyLoss(
        IN, C, bias=True, ignore_index=0)})
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    model = gc.capture(net, x=gc.spec("float32", ("N", 4)), t=gc.spec("int64", ("N",)))
    trainer = gc.Trainer(gc.training.generate(model, "output", gc.optim.SGD(lr=0.5)), backend="ort-cpu")
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    for _ in range(3):
        x, t = RNG.standard_normal((6, 4)).astype(np.float32), RNG.integers(0, C, 6)
        opt.zero_grad()
        want = twin["loss"](torch.tanh(twin["body"](torch.from_numpy(x))), torch.from_numpy(t))
        want.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step({"x": x, "t": t}), want.item(), rtol=1e-5)
    for k, v in twin.state_dict().items():
        np.testing.assert_allclose(trainer.params[k], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
