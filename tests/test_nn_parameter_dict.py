"""gc.nn.ParameterDict against torch.nn.ParameterDict: the dict methods and their order (a plain
dict sorted, as torch takes it), the captured model's initializer and gradient names as torch's
state_dict keys, its output and gradients against torch holding the same values, and a plain dict
of Parameters refused with ParameterDict named."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

R = np.random.default_rng(0)
VALUES = {"scale": R.standard_normal(3), "bias": R.standard_normal(3), "gate": R.standard_normal(1)}


def test_dict_methods_and_order_match_torch():
    torch = pytest.importorskip("torch")
    ours = nn.ParameterDict(VALUES)
    theirs = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v)) for k, v in VALUES.items()})
    assert list(ours) == list(theirs) == ["bias", "gate", "scale"]  # a plain dict is taken sorted
    ours["alpha"], theirs["alpha"] = np.ones(2), torch.nn.Parameter(torch.ones(2))
    ours["bias"], theirs["bias"] = np.zeros(3), torch.nn.Parameter(torch.zeros(3))  # keeps its place
    ours.update(OrderedDict([("z", np.ones(1)), ("y", np.ones(1))]))
    theirs.update(OrderedDict([("z", torch.nn.Parameter(torch.ones(1))), ("y", torch.nn.Parameter(torch.ones(1)))]))
    assert list(ours.keys()) == list(theirs.keys()) == ["bias", "gate", "scale", "alpha", "z", "y"]
    assert ours.pop("z").shape == tuple(theirs.pop("z").shape) == (1,)
    assert ours.setdefault("w", np.ones(4)).shape == (4,) and ours.setdefault("w", np.ones(1)).shape == (4,)
    assert ours.get("missing") is None and "gate" in ours and "z" not in ours and len(ours) == 6
    assert [k for k, _ in ours.items()] == list(ours) and all(isinstance(v, nn.Parameter) for v in ours.values())
    np.testing.assert_array_equal(ours["bias"].numpy(), np.zeros(3, np.float32))
    with pytest.raises(KeyError, match="missing"):
        ours["missing"]
    del ours["w"]
    assert list(ours) == ["bias", "gate", "scale", "alpha", "y"]
    ours.clear()
    assert len(ours) == 0


class Net(nn.Module):
    """``x * scale + bias`` gated by ``sigmoid(gate)``, the three from a ParameterDict."""

    def __init__(self, dtype="float64"):
        super().__init__()
        self.fc = nn.Linear(3, 3, dtype=dtype)
        self.p = nn.ParameterDict({k: nn.Parameter(v, dtype=dtype) for k, v in VALUES.items()})

    def forward(self, x):
        return gc.sigmoid(self.p["gate"]) * (self.fc(x) * self.p["scale"] + self.p["bias"])


def test_captured_names_values_and_gradients_match_torch():
    torch = pytest.importorskip("torch")
    net = Net()
    state = net.init_parameters(seed=1).state_dict()
    for p in net.parameters():  # pinned: a capture draws unset ones with its own seed
        p.data = p.numpy()
    twin = torch.nn.Module()
    twin.fc = torch.nn.Linear(3, 3, dtype=torch.float64)
    twin.p = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v)) for k, v in VALUES.items()})
    assert list(state) == list(twin.state_dict()) == ["fc.weight", "fc.bias", "p.bias", "p.gate", "p.scale"]
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    x = R.standard_normal((4, 3))
    model = gc.capture(net, x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    assert sorted(model.params) == sorted(state)
    want = twin.fc(torch.from_numpy(x)) * twin.p["scale"] + twin.p["bias"]
    want = torch.sigmoid(twin.p["gate"]) * want
    c = R.standard_normal((4, 3))
    (want * torch.from_numpy(c)).sum().backward()
    grads = gc.grad(gc.capture(_Weighted(net), x=x, c=c), "output")
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"],
                                   want.detach().numpy(), rtol=1e-12)
        got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"net.{name}_grad"], p.grad.numpy(), rtol=1e-12, err_msg=f"{backend} {name}")


class _Weighted(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, c):
        return gc.sum(self.net(x) * c)


def test_a_plain_dict_of_parameters_names_parameter_dict():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = {"a": nn.Parameter(np.ones(2))}

    with pytest.raises(gc.GraphError, match=r"Holder.p is a plain dict holding Parameter.*gc.nn.ParameterDict"):
        Holder()
