"""``gc.nn.utils`` against ``torch.nn.utils``: weight and spectral norm (hook and parametrization
forms: state_dict keys, forward on numpy and ort-cpu, gradients w.r.t. their parameters, removal)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.utils.parametrizations  # noqa: F401 - importable as torch's
from graphc.nn import utils as U
from graphc.nn.utils import norms
from graphc.passes.values import BUFFER_UPDATE_KEY
from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(0)
INPUTS = {"Linear(3, 4)": R.standard_normal((2, 3)), "Conv2d(2, 3, 3)": R.standard_normal((2, 2, 5, 5)),
          "ConvTranspose2d(2, 3, 3)": R.standard_normal((2, 2, 4, 4)), "Conv1d(2, 3, 2)": R.standard_normal((2, 2, 5))}

WEIGHT_NORM = {"old": (U.weight_norm, lambda: torch.nn.utils.weight_norm),
               "parametrizations": (U.parametrizations.weight_norm,
                                    lambda: torch.nn.utils.parametrizations.weight_norm)}
SPECTRAL_NORM = {"old": (U.spectral_norm, lambda: torch.nn.utils.spectral_norm),
                 "parametrizations": (U.parametrizations.spectral_norm,
                                      lambda: torch.nn.utils.parametrizations.spectral_norm)}


def _pinned(ctor: str, dtype: str = "float32", seed: int = 1):
    """``gc.nn.<ctor>`` drawn with ``seed`` and ``torch.nn.<ctor>`` holding the same weights."""
    layer = eval(f"gc.nn.{ctor[:-1]}, dtype={dtype!r})", {"gc": gc})  # noqa: S307 - the tests' constructors
    layer.init_parameters(seed)
    twin = eval(f"torch.nn.{ctor}", {"torch": torch}).to(getattr(torch, dtype))  # noqa: S307
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    return layer, twin


def _pin(layer) -> None:
    """Keep the values as they are when captured (not redrawn by the capture's seed)."""
    for _, p in layer._named_tensors():
        p.data = p.numpy()


@pytest.mark.parametrize("api", list(WEIGHT_NORM))
@pytest.mark.parametrize("ctor, dim", [("Linear(3, 4)", 0), ("Linear(3, 4)", 1), ("Linear(3, 4)", None),
                                       ("Conv2d(2, 3, 3)", 0), ("Conv2d(2, 3, 3)", -1), ("Conv1d(2, 3, 2)", 1),
                                       ("ConvTranspose2d(2, 3, 3)", 1)])
def test_weight_norm_matches_torch(api, ctor, dim):
    """state_dict keys and values, the forward, and the gradients w.r.t. g and v (float64)."""
    ours, theirs = WEIGHT_NORM[api]
    layer, twin = _pinned(ctor, "float64")
    ours(layer, dim=dim)
    with pytest.warns(FutureWarning) if api == "old" else nullcontext():
        theirs()(twin, dim=dim)
    state = layer.state_dict()
    assert list(state) == list(twin.state_dict())
    for k, v in twin.state_dict().items():
        np.testing.assert_allclose(state[k], v.numpy(), rtol=1e-12, err_msg=k)
    _pin(layer)
    x = INPUTS[ctor]
    xt = torch.from_numpy(x)
    want = twin(xt)
    c = R.standard_normal(tuple(want.shape))
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
    for backend in ("numpy", "ort-cpu"):  # float64 convs run written out on ort-cpu (backends/doubles_windows.py)
        got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12)
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}_grad"], p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("api", list(WEIGHT_NORM))
def test_weight_norm_gradients_match_central_differences(api):
    layer = gc.nn.Linear(3, 4, dtype="float64")
    WEIGHT_NORM[api][0](layer, dim=1)
    assert_grads_match_central_differences(lambda m, x: m(x), INPUTS["Linear(3, 4)"], module=layer)


@pytest.mark.parametrize("api", list(WEIGHT_NORM))
@pytest.mark.parametrize("norm", [WEIGHT_NORM, SPECTRAL_NORM], ids=["weight_norm", "spectral_norm"])
def test_float32_conv_runs_on_both_backends_with_a_symbolic_batch(api, norm):
    layer, twin = _pinned("Conv2d(2, 3, 3)")
    norm[api][0](layer)
    with pytest.warns(FutureWarning) if api == "old" and norm is WEIGHT_NORM else nullcontext():
        norm[api][1]()(twin)
    twin.eval()
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    x = INPUTS["Conv2d(2, 3, 3)"].astype(np.float32)
    model = gc.capture(layer, x=gc.spec("float32", ("N", 2, 5, 5)))
    onnx.checker.check_model(model.proto, full_check=True)
    # float32: the spectral norm's power iteration rounds apart from torch's; outputs near 4,000 once
    # came 1.1e-5 apart (0.08) in a parallel full run
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], twin(torch.from_numpy(x)).detach().numpy(),
                               rtol=5e-5, atol=1e-6)


def test_remove_weight_norm_keeps_the_weight_as_torch():
    layer, twin = _pinned("Linear(3, 4)", "float64")
    U.weight_norm(layer, dim=None)
    layer.weight_g.data = np.array(2.5)  # the weight it leaves is g * v / ||v||
    with pytest.warns(FutureWarning):
        torch.nn.utils.weight_norm(twin, dim=None)
    with torch.no_grad():
        twin.weight_g.fill_(2.5)
    U.remove_weight_norm(layer)
    torch.nn.utils.remove_weight_norm(twin)
    assert list(layer.state_dict()) == list(twin.state_dict()) == ["bias", "weight"]
    np.testing.assert_allclose(layer.state_dict()["weight"], twin.weight.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("api", list(SPECTRAL_NORM))
@pytest.mark.parametrize("ctor", ["Linear(3, 4)", "Conv2d(2, 3, 3)", "ConvTranspose2d(2, 3, 3)"])
def test_spectral_norm_eval_matches_torch_from_its_state(api, ctor):
    """torch's u and v (its own draws) loaded: keys, shapes, the eval forward on both backends and
    the gradient w.r.t. the original weight."""
    ours, theirs = SPECTRAL_NORM[api]
    layer, twin = _pinned(ctor, "float64")
    ours(layer)
    theirs()(twin)
    twin.eval()
    assert {k: tuple(v.shape) for k, v in twin.state_dict().items()} == \
        {k: v.shape for k, v in layer.state_dict().items()}
    assert list(layer.state_dict()) == list(twin.state_dict())
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    x = INPUTS[ctor]
    want = twin(torch.from_numpy(x))
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):  # float64 convs run written out on ort-cpu (backends/doubles_windows.py)
        got = gc_grads(lambda m, x: m(x), {}, {"x": x}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12)
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def _torch_draws(twin, name: str, dim: int, seed: int):
    """The unit u and v torch's registration draws after ``torch.manual_seed(seed)`` (its generator
    is seeded again to ``seed`` on return, for the registration to draw them)."""
    weight = getattr(twin, name).detach()
    mat = weight.movedim(dim, 0).reshape(weight.shape[dim], -1)
    torch.manual_seed(seed)
    u, v = (torch.nn.functional.normalize(mat.new_empty(n).normal_(0, 1), dim=0).numpy() for n in mat.shape)
    torch.manual_seed(seed)
    return u, v


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("api", list(SPECTRAL_NORM))
@pytest.mark.parametrize("ctor, name, dim", [
    ("Linear(5, 4)", "weight", None), ("ConvTranspose2d(2, 3, 3)", "weight", None), ("Conv2d(2, 3, 3)", "weight", 1),
    ("Linear(5, 4)", "weight", -1), ("Linear(5, 4)", "bias", None)])
def test_spectral_norm_registration_and_reads_match_torch(api, iterations, training, ctor, name, dim, monkeypatch):
    """With torch's draws for u and v: the state after registration (the hook form draws only; the
    parametrization 15 power iterations, plus n_power_iterations in training mode for torch's
    registration check), and what reading the weight before the first call gives (the hook form:
    the original weight itself, so that writing it sets the original, as torch's ``weight.data``;
    the parametrization: normalised, a training-mode read iterating u and v as torch's)."""
    if api == "old" and dim == -1:
        pytest.skip("torch's hook form fails on a negative dim (refused: test_bad_use_is_refused_naming_it_...)")
    ours, theirs = SPECTRAL_NORM[api]
    layer, twin = _pinned(ctor, "float64")
    layer.train(training)
    twin.train(training)
    weight = getattr(twin, name).detach().numpy().copy()
    if weight.ndim > 1 or api == "old":  # torch's parametrization of a vector draws none
        drawn = _torch_draws(twin, name, (1 if ctor.startswith("ConvT") else 0) if dim is None else dim % 2, 7)
        for module in (norms, U.parametrizations):
            monkeypatch.setattr(module, "initial_uv", lambda mat, eps: drawn)
    ours(layer, name=name, n_power_iterations=iterations, dim=dim)
    theirs()(twin, name=name, n_power_iterations=iterations, dim=dim)
    want = {k: v.numpy().copy() for k, v in twin.state_dict().items()}
    assert list(layer.state_dict()) == list(want)
    for k, v in want.items():
        np.testing.assert_allclose(layer.state_dict()[k], v, rtol=1e-12, atol=1e-15, err_msg=k)
    read = getattr(layer, name)
    with torch.no_grad():
        twin_read = getattr(twin, name).numpy().copy()
    if api == "old":
        assert isinstance(read, gc.nn.Parameter) and read is layer._parameters[f"{name}_orig"]
        np.testing.assert_array_equal(twin_read, weight)
        read.data = weight * 2  # torch: the attribute is the original's storage until the first forward
        with torch.no_grad():
            getattr(twin, name).mul_(2)
        np.testing.assert_array_equal(layer.state_dict()[f"{name}_orig"], twin.state_dict()[f"{name}_orig"].numpy())
    else:
        np.testing.assert_allclose(read, twin_read, rtol=1e-12)
        for k, v in twin.state_dict().items():  # a training-mode read moved u and v, as torch's
            np.testing.assert_allclose(layer.state_dict()[k], v.numpy(), rtol=1e-12, atol=1e-15, err_msg=k)
            if training and k.endswith(("_u", "_v")):
                assert not np.array_equal(v.numpy(), want[k]), k


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_the_parametrization_of_a_vector_is_its_unit_vector_as_torch(training):
    """A 1-D parameter: ``b / max(||b||, eps)``, forward and gradient on both backends."""
    layer, twin = _pinned("Linear(3, 4)", "float64")
    U.parametrizations.spectral_norm(layer.train(training), name="bias")
    torch.nn.utils.parametrizations.spectral_norm(twin.train(training), name="bias")
    x = INPUTS["Linear(3, 4)"]
    want = twin(torch.from_numpy(x))
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x: m(x), {}, {"x": x}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12)
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=k)


def test_the_hook_forms_weight_is_normalised_once_called():
    """After the module's first call (a capture), a read gives orig / sigma, as torch's attribute
    after its first forward (eval: no power iteration)."""
    layer = U.spectral_norm(gc.nn.Linear(5, 4, dtype="float64"))
    gc.capture(layer, x=np.zeros((1, 5)))
    orig, u, v = (layer.state_dict()[k] for k in ("weight_orig", "weight_u", "weight_v"))
    np.testing.assert_allclose(layer.weight, orig / (u @ orig @ v), rtol=1e-12)


@pytest.mark.parametrize("api", list(SPECTRAL_NORM))
def test_spectral_norm_in_training_mode_writes_u_and_v(api):
    """Captured in training mode, the power iteration writes both buffers (trained against torch in
    test_buffer_updates.py)."""
    layer = SPECTRAL_NORM[api][0](gc.nn.Linear(3, 4)).train()
    model = gc.capture(layer, x=INPUTS["Linear(3, 4)"].astype(np.float32))
    written = {n.metadata_props[BUFFER_UPDATE_KEY] for n in model.graph if BUFFER_UPDATE_KEY in n.metadata_props}
    assert written == ({"weight_u", "weight_v"} if api == "old" else
                       {"parametrizations.weight.0._u", "parametrizations.weight.0._v"})


def test_remove_spectral_norm_keeps_the_normalised_weight_as_torch():
    """Removed before any call: orig / sigma from the stored u and v, no power iteration."""
    layer, twin = _pinned("Linear(3, 4)", "float64")
    U.spectral_norm(layer.train())
    torch.nn.utils.spectral_norm(twin.train())
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    U.remove_spectral_norm(layer)
    torch.nn.utils.remove_spectral_norm(twin)
    assert list(layer.state_dict()) == list(twin.state_dict()) == ["bias", "weight"]  # re-registered last
    np.testing.assert_allclose(layer.state_dict()["weight"], twin.weight.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda m: U.weight_norm(U.weight_norm(m)), "Linear.weight has a weight_norm or spectral_norm already"),
    (lambda m: U.spectral_norm(U.weight_norm(m)), "Linear.weight has a weight_norm or spectral_norm already"),
    (lambda m: U.weight_norm(m, name="nope"), "weight_norm: Linear has no parameter 'nope'"),
    (lambda m: U.remove_weight_norm(m), "remove_weight_norm: weight_norm of 'weight' not found in Linear"),
    (lambda m: U.remove_spectral_norm(U.weight_norm(m)), "spectral_norm of 'weight' not found"),
    (lambda m: U.spectral_norm(m, n_power_iterations=0), "n_power_iterations must be positive, got 0"),
    (lambda m: U.spectral_norm(m, dim=-1), r"spectral_norm: dim -1 is out of range for the 2-D weight of Linear "
                                          r"\(expected \[0, 1\]\)"),
    (lambda m: U.parametrizations.spectral_norm(m, dim=2), r"dim 2 is out of range for the 2-D weight of Linear "
                                                           r"\(expected \[-2, 1\]\)"),
])
def test_bad_use_is_refused_naming_it_and_the_line(call, match):
    with pytest.raises(gc.CaptureError, match=match) as err:
        call(gc.nn.Linear(3, 4))
    assert "test_nn_utils.py" in str(err.value)


def test_registered_as_torch_s():
    from graphc.nn.utils import rnn

    assert gc.nn.utils.rnn is rnn and gc.nn.utils.rnn.pad_sequence is rnn.pad_sequence
    assert gc.nn.utils.parametrizations.weight_norm is U.parametrizations.weight_norm


def _eval_twins(*ctors: str):
    """gc and torch modules (eval mode) holding the same drawn values, BatchNorm statistics set."""
    pairs = []
    for i, ctor in enumerate(ctors):
        layer, twin = _pinned(ctor, seed=i)
        for name in ("running_mean", "running_var", "weight", "bias"):
            if "BatchNorm" in ctor and name in layer._parameters:
                value = R.uniform(0.5, 2.0, layer._parameters[name].shape).astype(np.float32)
                layer._parameters[name].data = value
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
        pairs.append((layer, twin.eval()))
    return pairs


@pytest.mark.parametrize("conv, bn, x, transpose", [
    ("Conv2d(2, 3, 3)", "BatchNorm2d(3)", R.standard_normal((2, 2, 5, 5)), False),
    ("Conv2d(2, 4, 3, bias=False, groups=2)", "BatchNorm2d(4)", R.standard_normal((2, 2, 5, 5)), False),
    ("ConvTranspose2d(2, 3, 3)", "BatchNorm2d(3)", R.standard_normal((2, 2, 4, 4)), True),
    ("Conv1d(2, 3, 2)", "BatchNorm1d(3)", R.standard_normal((2, 2, 5)), False),
])
def test_fuse_conv_bn_eval_equals_conv_then_bn(conv, bn, x, transpose):
    """The fused conv equals conv -> bn (eval) on both backends, and torch's fused conv."""
    (c, tc), (b, tb) = _eval_twins(conv, bn)
    x = x.astype(np.float32)
    before = {k: v.copy() for k, v in c.state_dict().items()}
    fused = U.fuse_conv_bn_eval(c, b, transpose=transpose)
    model = gc.capture(lambda x: {"fused": fused(x), "unfused": b(c(x))}, x=gc.spec("float32", ("N", *x.shape[1:])))
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"x": x})
    np.testing.assert_allclose(got["fused"], got["unfused"], rtol=1e-5, atol=1e-5)
    want = torch.nn.utils.fuse_conv_bn_eval(tc, tb, transpose=transpose)
    for k, v in want.state_dict().items():
        np.testing.assert_allclose(fused.state_dict()[k], v.numpy(), rtol=1e-6, atol=1e-7, err_msg=k)
    assert list(c.state_dict()) == list(before)  # the conv given is left as it was
    for k, v in before.items():
        np.testing.assert_array_equal(c.state_dict()[k], v)


def test_fuse_linear_bn_eval_equals_linear_then_bn():
    (lin, tlin), (b, tb) = _eval_twins("Linear(3, 4)", "BatchNorm1d(4)")
    x = R.standard_normal((5, 3)).astype(np.float32)
    fused = U.fuse_linear_bn_eval(lin, b)
    got = run_both(gc.capture(lambda x: {"fused": fused(x), "unfused": b(lin(x))}, x=x), {"x": x})
    np.testing.assert_allclose(got["fused"], got["unfused"], rtol=1e-5, atol=1e-5)
    want = torch.nn.utils.fuse_linear_bn_eval(tlin, tb)
    for k, v in want.state_dict().items():
        np.testing.assert_allclose(fused.state_dict()[k], v.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=k)


def test_fuse_weights_on_arrays_match_torch():
    w, b, rm, bw, bb = (R.standard_normal(s).astype(np.float32) for s in ((3, 2, 3, 3), (3,), (3,), (3,), (3,)))
    rv = R.uniform(0.5, 2.0, 3).astype(np.float32)
    got = U.fuse_conv_bn_weights(w, b, rm, rv, 1e-3, bw, bb)
    want = torch.nn.utils.fuse_conv_bn_weights(*(torch.from_numpy(a) for a in (w, b, rm, rv)), 1e-3,
                                               *(torch.from_numpy(a) for a in (bw, bb)))
    for g, t in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, t.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_fusion_refuses_training_mode():
    (c, _), (b, _) = _eval_twins("Conv2d(2, 3, 3)", "BatchNorm2d(3)")
    with pytest.raises(gc.CaptureError, match="fusion only for eval") as err:
        U.fuse_conv_bn_eval(c, b.train())
    assert "test_nn_utils.py" in str(err.value)


def test_parameters_to_vector_and_back_as_torch():
    (layer, twin), = _eval_twins("Conv2d(2, 3, 3)")
    vec = U.parameters_to_vector(layer.parameters())
    np.testing.assert_array_equal(vec, torch.nn.utils.parameters_to_vector(twin.parameters()).detach().numpy())
    new = R.standard_normal(vec.shape).astype(np.float32)
    U.vector_to_parameters(new, layer.parameters())
    torch.nn.utils.vector_to_parameters(torch.from_numpy(new), twin.parameters())
    for k, v in twin.state_dict().items():
        np.testing.assert_array_equal(layer.state_dict()[k], v.numpy(), err_msg=k)
    x = INPUTS["Conv2d(2, 3, 3)"].astype(np.float32)
    model = gc.capture(lambda x: U.parameters_to_vector([layer.weight, layer.bias]) * gc.sum(x), x=x)
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], new * x.sum(), rtol=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: U.vector_to_parameters(np.zeros(3), gc.nn.Linear(3, 4).parameters()), "1-D with 16 elements"),
    (lambda: U.parameters_to_vector([gc.nn.Parameter(np.zeros(2)), np.zeros(2)]), "all gc.nn.Parameters or all"),
    (lambda: U.clip_grad_norm_(gc.nn.Linear(3, 4).parameters(), 1.0),
     "clip_grad_norm_: a graphc Parameter has no .grad.* max_grad_norm="),
    (lambda: U.clip_grad_value_(gc.nn.Linear(3, 4).parameters(), 1.0), "clip_grad_value_: .* clip_grad_value="),
    (lambda: U.fuse_linear_bn_eval(gc.nn.Linear(3, 4), gc.nn.BatchNorm1d(3)), "num_features=3 must equal"),
])
def test_refused_uses_name_the_argument_and_the_line(call, match):
    with pytest.raises(gc.CaptureError, match=match) as err:
        call()
    assert "test_nn_utils.py" in str(err.value)


def test_skip_init_leaves_the_parameters_to_be_set():
    layer = U.skip_init(gc.nn.Linear, 3, 4)
    assert isinstance(layer, gc.nn.Linear) and not any(p.drawn for p in layer.parameters())
