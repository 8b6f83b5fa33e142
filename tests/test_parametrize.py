"""``gc.nn.utils.parametrize`` and ``parametrizations.orthogonal`` against torch 2.13 (float64): state_dict
keys and values, the forward on numpy and ort-cpu, gradients w.r.t. the originals, AdamW steps, removal,
assignment through ``right_inverse``, and torch's refusals naming the module and tensor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.nn.utils import parametrizations as PZ
from graphc.nn.utils import parametrize as P
from torch_grad_util import assert_step_matches_torch

torch = pytest.importorskip("torch")
TP = torch.nn.utils.parametrize

RNG = np.random.default_rng(0)


class Symmetric(gc.nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).mT

    def right_inverse(self, A):
        return A.triu()


class TSymmetric(torch.nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).mT

    def right_inverse(self, A):
        return A.triu()


class Cube(gc.nn.Module):  # stacked after Symmetric
    def forward(self, X):
        return X * X * X

    def right_inverse(self, Y):
        return Y.sign() * Y.abs() ** (1 / 3)


class Double(gc.nn.Module):  # no right_inverse: registered as the identity's, not assignable, as torch's
    def forward(self, X):
        return 2 * X


class TCube(torch.nn.Module):
    def forward(self, X):
        return X * X * X

    def right_inverse(self, Y):
        return Y.sign() * Y.abs() ** (1 / 3)


class RankOne(gc.nn.Module):  # right_inverse returning a tuple: original0, original1
    def forward(self, x, y):
        return x.unsqueeze(-1) * y.unsqueeze(-2)

    def right_inverse(self, Z):
        return Z[:, 0], Z[0, :] / Z[0, 0]


class TRankOne(torch.nn.Module):
    def forward(self, x, y):
        return x.unsqueeze(-1) * y.unsqueeze(-2)

    def right_inverse(self, Z):
        return Z[:, 0], Z[0, :] / Z[0, 0]


def _twins(n: int = 4, m: int = 4, seed: int = 1):
    layer = gc.nn.Linear(m, n, dtype="float64")
    layer.init_parameters(seed)
    twin = torch.nn.Linear(m, n).double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    return layer, twin


def _forward_and_grads(layer, twin):
    """The layer's output and the gradients of ``sum(out * c)`` w.r.t. every parameter, on numpy and ort-cpu,
    against torch's."""
    x = RNG.standard_normal((3, layer.in_features))
    want = twin(torch.from_numpy(x))
    c = RNG.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()

    class Loss(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = layer

        def forward(self, x, c):
            out = self.m(x)
            return {"out": out, "loss": gc.sum(out * c)}

    model = gc.capture(Loss(), x=x, c=c)
    onnx.checker.check_model(model.proto, full_check=True)
    grads = gc.grad(model, "loss")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12)
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}_grad"], p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def _same_state(layer, twin):
    state = layer.state_dict()
    assert list(state) == list(twin.state_dict())
    for k, v in twin.state_dict().items():
        np.testing.assert_allclose(state[k], v.numpy(), rtol=1e-12, atol=1e-15, err_msg=k)


def test_a_symmetric_parametrization_is_torch_s():
    """right_inverse at registration (original = triu(weight)), keys, the weight read outside a capture,
    the forward and the gradients w.r.t. the original."""
    layer, twin = _twins()
    assert P.register_parametrization(layer, "weight", Symmetric()) is layer
    TP.register_parametrization(twin, "weight", TSymmetric())
    _same_state(layer, twin)
    assert "parametrizations.weight.original" in layer.state_dict()
    np.testing.assert_allclose(layer.weight, twin.weight.detach().numpy(), rtol=1e-15)
    np.testing.assert_array_equal(layer.weight, layer.weight.T)
    assert P.is_parametrized(layer) and P.is_parametrized(layer, "weight") and not P.is_parametrized(layer, "bias")
    assert P.type_before_parametrizations(layer) is gc.nn.Linear
    _forward_and_grads(layer, twin)


def test_a_stacked_pair_and_assignment_through_right_inverse():
    layer, twin = _twins()
    for ours, theirs in ((Symmetric(), TSymmetric()), (Cube(), TCube())):
        P.register_parametrization(layer, "weight", ours)
        TP.register_parametrization(twin, "weight", theirs)
    assert len(layer.parametrizations.weight) == 2
    _same_state(layer, twin)
    _forward_and_grads(layer, twin)
    a = RNG.standard_normal((4, 4))
    layer.weight = a + a.T  # Cube's right_inverse, then Symmetric's, into original
    with torch.no_grad():
        twin.weight = torch.from_numpy(a + a.T)
    _same_state(layer, twin)
    np.testing.assert_allclose(layer.weight, a + a.T, rtol=1e-12)


def test_a_tuple_right_inverse_makes_original0_and_original1():
    layer, twin = _twins(4, 3)
    P.register_parametrization(layer, "weight", RankOne(), unsafe=True)
    TP.register_parametrization(twin, "weight", TRankOne(), unsafe=True)
    assert {"parametrizations.weight.original0", "parametrizations.weight.original1"} <= set(layer.state_dict())
    _same_state(layer, twin)
    _forward_and_grads(layer, twin)
    with pytest.raises(gc.CaptureError, match=r"Linear.weight\): cannot leave unparametrized .* 2 tensors"):
        P.remove_parametrizations(layer, "weight", leave_parametrized=False)


@pytest.mark.parametrize("leave", [True, False])
def test_remove_parametrizations_as_torch(leave):
    layer, twin = _twins()
    for ours, theirs in ((Symmetric(), TSymmetric()), (Cube(), TCube())):
        P.register_parametrization(layer, "weight", ours)
        TP.register_parametrization(twin, "weight", theirs)
    original = layer.parametrizations.weight._parameters["original"]
    P.remove_parametrizations(layer, "weight", leave_parametrized=leave)
    TP.remove_parametrizations(twin, "weight", leave_parametrized=leave)
    assert not P.is_parametrized(layer) and "parametrizations" not in layer._modules
    assert layer._parameters["weight"] is original  # the same Parameter object, as torch's set_
    _same_state(layer, twin)
    _forward_and_grads(layer, twin)


def test_cached_computes_each_parametrized_tensor_once_per_capture():
    layer, _ = _twins()
    P.register_parametrization(layer, "weight", Symmetric())

    def twice(x):
        return layer(x) + layer(x)

    x = RNG.standard_normal((2, 4))
    plain = gc.capture(twice, x=x)
    with P.cached():
        cached = gc.capture(twice, x=x)
    count = [sum(n.op_type == "Trilu" for n in m.graph) for m in (plain, cached)]
    assert count == [4, 2]
    np.testing.assert_allclose(gc.Session(cached).run({"x": x})["output"], gc.Session(plain).run({"x": x})["output"])


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)])
def test_orthogonal_forward_gradients_and_adamw_steps_are_torch_s(orthogonal_map, shape):
    """Keys (original, 0.base), the orthogonal weight, and 3 AdamW steps of a float64 Trainer on numpy and
    ort-cpu equal to torch's (base loaded from torch: a non-square one completes by random draws)."""
    layer, twin = _twins(*shape)
    PZ.orthogonal(layer, orthogonal_map=orthogonal_map)
    torch.nn.utils.parametrizations.orthogonal(twin, orthogonal_map=orthogonal_map)
    assert list(layer.state_dict()) == list(twin.state_dict())
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    w = layer.weight
    np.testing.assert_allclose(w @ w.T if shape[0] < shape[1] else w.T @ w, np.eye(min(shape)), atol=1e-13)
    model = gc.capture(layer, training=True, x=gc.spec("float64", ("N", shape[1])))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(lr=0.05))
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        theirs = torch.nn.Linear(shape[1], shape[0]).double()
        torch.nn.utils.parametrizations.orthogonal(theirs, orthogonal_map=orthogonal_map)
        theirs.load_state_dict(twin.state_dict())
        opt = torch.optim.AdamW(theirs.parameters(), lr=0.05)
        rng = np.random.default_rng(3)
        for step in range(3):
            batch = {"x": rng.standard_normal((6, shape[1])), "y": rng.standard_normal((6, shape[0]))}
            x, y = (torch.from_numpy(batch[k]) for k in ("x", "y"))
            assert_step_matches_torch(trainer, batch, opt,
                                      lambda x=x, y=y: torch.nn.functional.mse_loss(theirs(x), y), theirs, step,
                                      rtol=1e-9, skip=("parametrizations.weight.0.base",))  # a constant there
        layer.load_state_dict(trainer.state_dict(), strict=False)
        np.testing.assert_allclose(layer.weight, theirs.weight.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_orthogonal_householder_without_trivialization_right_inverse_is_torch_s():
    layer, twin = _twins(5, 3)
    PZ.orthogonal(layer, orthogonal_map="householder", use_trivialization=False)
    torch.nn.utils.parametrizations.orthogonal(twin, orthogonal_map="householder", use_trivialization=False)
    _same_state(layer, twin)
    np.testing.assert_allclose(layer.weight, twin.weight.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_with_torch():
    """torch's checkpoint of a parametrized module loads into graphc's and back, strict both ways."""
    layer, twin = _twins()
    P.register_parametrization(layer, "weight", Symmetric())
    TP.register_parametrization(twin, "weight", TSymmetric())
    with torch.no_grad():
        twin.parametrizations.weight.original.mul_(3.0)
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    np.testing.assert_allclose(layer.weight, twin.weight.detach().numpy(), rtol=1e-15)
    layer.parametrizations.weight.original.data = layer.parametrizations.weight.original.numpy() * 0.5
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    np.testing.assert_allclose(twin.weight.detach().numpy(), layer.weight, rtol=1e-15)


class Widen(gc.nn.Module):
    def forward(self, X):
        return gc.cat([X, X], dim=0)


class ToFloat32(gc.nn.Module):
    def forward(self, X):
        return X.float()


@pytest.mark.parametrize("call, match", [
    (lambda m: P.register_parametrization(m, "nope", Symmetric()),
     r"register_parametrization: module Linear does not have a parameter, a buffer, or a parametrized element "
     r"with name 'nope'"),
    (lambda m: P.register_parametrization(m, "weight", Widen()),
     r"registering a parametrization on Linear.weight may not change the shape of the tensor, unless "
     r"unsafe=True: got \(8, 4\), expected \(4, 4\)"),
    (lambda m: P.register_parametrization(m, "weight", ToFloat32()),
     r"Linear.weight may not change the dtype .* got float32, expected float64"),
    (lambda m: P.register_parametrization(P.register_parametrization(m, "weight", Symmetric()), "weight", Widen()),
     r"on Linear.weight may not change the shape"),
    (lambda m: setattr(P.register_parametrization(m, "weight", Double()), "weight", np.eye(4)),
     r"Linear.weight: parametrization Double does not implement right_inverse"),
    (lambda m: P.remove_parametrizations(m, "weight"),
     r"remove_parametrizations: module Linear does not have a parametrization on 'weight'"),
    (lambda m: PZ.orthogonal(m, "bias"), r"orthogonal\(Linear.bias\): expected a matrix .* 1 dimensions"),
    (lambda m: PZ.orthogonal(m, orthogonal_map="qr"), r"orthogonal_map has to be one of .* got 'qr'"),
])
def test_torch_s_refusals_name_the_module_and_tensor(call, match):
    with pytest.raises(gc.CaptureError, match=match) as err:
        call(gc.nn.Linear(4, 4, dtype="float64"))
    assert isinstance(err.value, ValueError) and "test_parametrize.py" in str(err.value)


def test_registered_names():
    assert gc.nn.utils.parametrize is P and gc.nn.utils.parametrizations.orthogonal is PZ.orthogonal
    import graphc.nn.utils.parametrize as module  # importable as torch's
    assert module.register_parametrization is P.register_parametrization
