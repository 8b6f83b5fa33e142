"""``gc.special`` on complex Tensors against torch 2.13 in complex128: the functions torch.special takes complex
(``expit``, ``exp2``, ``expm1``, ``log1p``, ``sinc``, ``logsumexp``) in value and in a complex Parameter's gradient,
on numpy and ort-cpu, and every other one refused naming the function and the dtype, as torch refuses it."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl import special
from graphc.dsl.tensor import ComplexTensor

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
SHAPE = (4, 5)
TAKEN = {
    "expit": lambda s, z: s.expit(z), "exp2": lambda s, z: s.exp2(z), "expm1": lambda s, z: s.expm1(z),
    "log1p": lambda s, z: s.log1p(z), "sinc": lambda s, z: s.sinc(z),
    "logsumexp": lambda s, z: s.logsumexp(z, 1), "logsumexp_keepdim": lambda s, z: s.logsumexp(z, dim=0, keepdim=True),
}


class _Leaf(gc.nn.Module):
    def __init__(self, fn, z):
        super().__init__()
        self.fn, self.z = fn, gc.nn.Parameter(z, dtype=gc.complex128)

    def forward(self, r):
        out = gc.view_as_real(self.fn(gc.special, self.z))
        return (out * r[..., :out.shape[-2], :]).sum(), out


def _points():
    z = (RNG.standard_normal(SHAPE) + 1j * RNG.standard_normal(SHAPE)) * np.exp(RNG.uniform(-2, 1.5, SHAPE))
    z[0, :3] = [0.0, 0.01 + 0.01j, -1.0 + 0.0j]  # sinc's 0 and near it (torch's gradient cancels nearer); a real -1
    return z


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("name", sorted(TAKEN))
def test_the_complex_functions_match_torch_in_value_and_gradient(name, backend):
    """Each was refused ('sinc does not take complex Tensors')."""
    fn, z = TAKEN[name], _points()
    if name == "log1p":
        z[0, 2] = -0.5 + 0.25j
    r = RNG.standard_normal((*SHAPE, 2))
    model = gc.capture(_Leaf(fn, z), r=gc.spec("float64", r.shape))
    got = gc.Session(gc.grad(model, "output_0"), backend=backend).run({"r": r})
    zt = torch.tensor(z, requires_grad=True)
    out = torch.view_as_real(fn(torch.special, zt))
    loss = (out * torch.from_numpy(r)[..., :out.shape[-2], :]).sum()
    loss.backward()
    np.testing.assert_allclose(got["output_1"], out.detach().numpy().reshape(got["output_1"].shape), rtol=1e-12,
                               atol=1e-15)
    np.testing.assert_allclose(got["z_grad"], torch.view_as_real(zt.grad).numpy(), rtol=1e-10, atol=1e-12)


def _refused_by_torch():
    z = torch.ones(3, dtype=torch.complex128)
    for name in sorted(special.__all__):
        args = {"polygamma": (1, z), "multigammaln": (z, 2), "softmax": (z, 0), "log_softmax": (z, 0),
                "logsumexp": (z, 0)}.get(name, (z, z) if name in ("xlogy", "xlog1py", "zeta", "gammainc", "gammaincc")
                                        or "polynomial" in name else (z,))
        try:
            getattr(torch.special, name)(*args)
        except (NotImplementedError, RuntimeError):
            yield name, len(args)


REFUSED = list(_refused_by_torch())


def test_torch_refuses_all_but_the_complex_functions():
    assert len(REFUSED) == len(special.__all__) - 6
    assert {name for name, _ in REFUSED}.isdisjoint(TAKEN)


@pytest.mark.parametrize("name,arity", REFUSED, ids=[n for n, _ in REFUSED])
def test_the_others_are_refused_naming_the_function_and_dtype(name, arity):
    def forward(x):
        z = gc.complex(x, x)
        args = {"polygamma": (1, z), "multigammaln": (z, 2), "softmax": (z, 0), "log_softmax": (z, 0)}.get(
            name, (z,) * arity)
        return getattr(gc.special, name)(*args)
    with pytest.raises(gc.CaptureError, match=rf"special\.{name} is not implemented for complex128 \(as torch"
                                              rf"\.special\.{name}: 'ComplexDouble'\) .*test_complex_special"):
        gc.capture(forward, x=gc.spec("float64", (3,)))
    assert not isinstance(gc.special.expit(gc.tensor([0.5])), ComplexTensor)
