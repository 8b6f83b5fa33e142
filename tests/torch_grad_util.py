"""Forward and ``gc.grad`` checks of DSL code against the same code in torch: a function of
tensors (``fn(M, *xs)`` with ``M`` the DSL's or torch's namespace) or a module with the same
weights. The loss is ``sum(out * c)`` with a fixed random ``c``, so every output element counts."""

from __future__ import annotations

import numpy as np

import graphc as gc


class TorchNS:
    """``torch`` and ``torch.nn.functional`` as one namespace, under the DSL's function names."""

    def __init__(self, torch):
        self.torch = torch

    def __getattr__(self, name):
        t = self.torch
        methods = {"expand": lambda x, *s: x.expand(*s), "repeat": lambda x, *s: x.repeat(*s)}
        if name in methods:
            return methods[name]
        return getattr(t.nn.functional, name, None) or getattr(t, name)


def run_both(model: gc.Model, feeds: dict) -> dict:
    """Outputs on the numpy and ort-cpu backends, which must agree."""
    ref = gc.Session(model, backend="numpy").run(feeds)
    ort = gc.Session(model, backend="ort-cpu").run(feeds)
    for k, v in ref.items():
        np.testing.assert_allclose(ort[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    return ref


class _Wrap(gc.nn.Module):
    """``sum(fn(first, params..., inputs...) * c)``: ``first`` is ``module`` if given, else
    ``gc.nn.functional``; the parameters are the differentiated arguments."""

    def __init__(self, fn, params: dict, module=None):
        super().__init__()
        self.fn, self.names = fn, list(params)
        for k, v in params.items():
            setattr(self, k, gc.nn.Parameter(v, dtype=np.asarray(v).dtype.name))  # float64 stays float64
        if module is not None:
            self.m = module

    def forward(self, c, **inputs):
        import graphc.nn.functional as F

        args = [getattr(self, k) for k in self.names]
        out = self.fn(self.m if "m" in self._modules else F, *args, **inputs)
        out = out[0] if isinstance(out, tuple) else out
        return {"out": out, "loss": gc.sum(out * c)}


def gc_grads(fn, params: dict, inputs: dict, c: np.ndarray, module=None, backend="numpy", opset=21) -> dict:
    """``{"out": ..., name: d loss / d name}`` for every parameter of ``fn`` (and of ``module``,
    named ``m.<its name>``)."""
    model = gc.capture(_Wrap(fn, params, module), c=c, opset=opset, **inputs)
    grads = gc.grad(model, "loss")
    out = gc.Session(grads, backend=backend).run({"c": c, **inputs})
    return {"out": out["out"], **{k.removesuffix("_grad"): v for k, v in out.items() if k.endswith("_grad")}}


def _torch_case(fn, params, inputs, c=None):
    """torch's output of ``fn(torch, *params, **inputs)`` and, given ``c``, the gradients of
    ``sum(out * c)`` with respect to ``params`` (None where none reaches one)."""
    import torch

    ts = [torch.tensor(p, requires_grad=True) for p in params]
    out = fn(TorchNS(torch), *ts, **{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
    if c is not None:
        (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), [None if t.grad is None else t.grad.numpy() for t in ts]


def assert_matches_torch(fn, params, inputs, rng: np.random.Generator, signed_zeros: bool = False) -> None:
    """``fn(M, *params, **inputs)`` captured with ``M = gc.nn.functional`` (eagerly, every argument a
    graph input), through the full ONNX checker, run on numpy and ort-cpu against torch's value,
    dtype and shape; for a float output, ``gc.grad``'s gradients of ``sum(out * c)`` (``c`` drawn
    from ``rng``) with respect to every param against torch.autograd's. ``signed_zeros``: the signs
    of the non-NaN outputs (zeros included) must be torch's too."""
    import onnx
    import pytest

    import graphc.nn.functional as F

    pytest.importorskip("torch")
    want = np.asarray(_torch_case(fn, params, inputs)[0])
    names = [f"p{i}" for i in range(len(params))]
    feeds = {**dict(zip(names, params)), **inputs}
    with np.errstate(all="ignore"):  # nan, inf and 0 among the inputs: the eager capture and the numpy run
        model = gc.capture(lambda **kw: fn(F, *(kw.pop(n) for n in names), **kw), **feeds)
        got = run_both(model, feeds)["output"]
    onnx.checker.check_model(model.proto, full_check=True)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if signed_zeros:
        signed = ~np.isnan(want) if want.dtype.kind == "f" else np.ones(want.shape, bool)
        np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(want[signed]), err_msg="signs (of zeros)")
    if want.dtype.kind != "f" or not params:
        return
    c = rng.standard_normal(want.shape).astype(want.dtype)
    _, dparams = _torch_case(fn, params, inputs, c)
    grads = gc_grads(fn, dict(zip(names, params)), inputs, c)
    for n, dp in zip(names, dparams):
        np.testing.assert_allclose(grads[n], 0 if dp is None else dp, rtol=1e-4, atol=1e-5, err_msg=n)


def assert_input_grad_matches_torch(fn, x: np.ndarray, inputs: dict, rng: np.random.Generator, dsl=None) -> None:
    """``fn(M, x, **inputs)`` and ``gc.grad`` of ``sum(out * c)`` with respect to ``x`` against torch's value and
    ``torch.autograd``, on the numpy and ort-cpu backends; ``M`` is torch, then ``dsl`` (default
    ``gc.nn.functional``)."""
    import torch

    xt = torch.tensor(x, requires_grad=True)
    out = fn(torch, xt, **{k: torch.from_numpy(v) for k, v in inputs.items()})
    c = np.asarray(rng.standard_normal(tuple(out.shape)))
    (out * torch.from_numpy(c)).sum().backward()
    call = fn if dsl is None else (lambda M, x, **kw: fn(dsl, x, **kw))
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(call, {"x": x}, inputs, c, backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=backend)


def assert_grads_match_central_differences(fn, x: np.ndarray, module=None, backends=("numpy", "ort-cpu")) -> None:
    """float64 ``gc.grad`` of ``sum(fn(M, x) * c)`` (``M``: ``module``, else ``gc.nn.functional``)
    with respect to ``x`` and each parameter of ``module`` (built in float64) against central
    differences along a random direction, on each backend."""
    import graphc.nn.functional as F

    x = np.asarray(x, np.float64)
    probe = gc.capture(lambda x: fn(module if module is not None else F, x), x=x)
    c = np.random.default_rng(1).standard_normal(gc.Session(probe, backend="numpy").run({"x": x})["output"].shape)
    grads = gc.grad(gc.capture(_Wrap(fn, {"x": x}, module), c=c), "loss")
    params, rng, eps = grads.params, np.random.default_rng(2), 1e-6
    for backend in backends:
        session = gc.Session(grads, backend=backend)
        got = session.run({"c": c})
        for name, value in params.items():
            t = rng.standard_normal(value.shape)
            plus, minus = (session.run({"c": c, name: value + s * eps * t}, outputs=["loss"])["loss"] for s in (1, -1))
            np.testing.assert_allclose(np.sum(got[f"{name}_grad"] * t), (plus - minus) / (2 * eps), rtol=1e-6,
                                       atol=1e-8, err_msg=f"{backend}: d loss / d {name}")


def assert_directional_derivatives(session: gc.Session, feeds: dict, grads: dict, wrt, c: np.ndarray,
                                   rng: np.random.Generator, eps: float = 1e-6) -> None:
    """Along two random directions ``t`` of the feeds named in ``wrt``: ``sum(grads * t)`` against
    central differences of ``sum(output * c)``, ``session``'s forward (float64)."""
    for _ in range(2):
        t = {k: rng.standard_normal(np.shape(feeds[k])) for k in wrt}
        f = [float((session.run({k: v + s * eps * t[k] if k in t else v for k, v in feeds.items()})["output"]
                    * c).sum()) for s in (1, -1)]
        predicted = sum(float((grads[k] * t[k]).sum()) for k in t)
        np.testing.assert_allclose(predicted, (f[0] - f[1]) / (2 * eps), rtol=1e-6, atol=1e-8)


def assert_module_matches_torch(layer, torch_layer, x: np.ndarray, batched: bool = True, rtol: float = 1e-5,
                                atol: float = 1e-5) -> None:
    """The gc.nn ``layer`` against ``torch_layer`` holding the same weights, on ``x``: the output and
    the gradients of ``sum(out * c)`` with respect to ``x`` and every parameter through ``gc.grad``
    on the numpy and ort-cpu backends, and the layer captured (dim 0 symbolic where ``batched``),
    through the full ONNX checker, run on both."""
    import onnx
    import torch

    xt = torch.tensor(x, requires_grad=True)
    want = torch_layer(xt)
    c = np.random.default_rng(0).standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    want = want.detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x: m(x), {"x": x}, {}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want, rtol, atol, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol, atol, err_msg=f"{backend} x")
        for k, p in torch_layer.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol, atol, err_msg=f"{backend} {k}")
    model = gc.capture(layer, x=gc.spec(x.dtype, ("N", *x.shape[1:])) if batched else x)
    onnx.checker.check_model(model.proto, full_check=True)
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], want, rtol, atol)


def torch_twin(ctor: str, seed: int = 0):
    """``(gc.nn.<ctor>, torch.nn.<ctor>)``: the gc module drawn with ``seed`` (its values pinned, so
    captures keep them) and torch's loaded with them, after checking the two have the same
    ``state_dict`` keys, in order, and shapes."""
    import torch

    layer = eval(f"gc.nn.{ctor}", {"gc": gc})  # noqa: S307 - constructors written in the tests
    state = layer.init_parameters(seed=seed).state_dict()
    twin = eval(f"torch.nn.{ctor}", {"torch": torch})  # noqa: S307
    assert list(state) == list(twin.state_dict()), ctor
    assert all(tuple(v.shape) == state[k].shape for k, v in twin.state_dict().items()), ctor
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    for p in layer.parameters():
        p.data = p.numpy()
    return layer, twin


def assert_constructed_matches_torch(ctor: str, x: np.ndarray, seed: int = 2, batched: bool = True,
                                     rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """``gc.nn.<ctor>`` against ``torch.nn.<ctor>`` (the same constructor text) holding our seeded
    initial weights (``torch_twin``), by ``assert_module_matches_torch``."""
    layer, twin = torch_twin(ctor, seed)
    assert_module_matches_torch(layer, twin, x, batched, rtol, atol)


def assert_step_matches_torch(trainer: gc.Trainer, batch: dict, opt, torch_loss, twin, step: int, rtol: float = 1e-10,
                              state_rtol: float = 1e-9, skip: tuple[str, ...] = (), state_atol: float = 1e-12) -> dict:
    """One ``trainer.step(batch)`` against one step of the torch optimizer ``opt`` on
    ``torch_loss()`` (the torch loss, built when called): the losses to ``rtol``, then each entry
    of ``twin``'s state_dict but those in ``skip`` to ``state_rtol`` and ``state_atol``; returns
    the trainer's state."""
    loss = trainer.step(batch)
    opt.zero_grad()
    want = torch_loss()
    want.backward()
    opt.step()
    np.testing.assert_allclose(loss, want.item(), rtol=rtol, err_msg=f"step {step}")
    state = trainer.state_dict()
    for k, v in twin.state_dict().items():
        if k not in skip:
            np.testing.assert_allclose(state[k], v.numpy(), rtol=state_rtol, atol=state_atol,
                                       err_msg=f"step {step} {k}")
    return state


def assert_classifier_steps_match_torch(trainer: gc.Trainer, twin, opt, rng: np.random.Generator) -> None:
    """Three ``trainer.step`` calls on a batch of 6 rows (``x`` of 3 features from ``rng``, labels
    0 or 1) against torch's ``opt`` stepping ``twin`` on its cross-entropy: the losses to 1e-10."""
    import torch

    for _ in range(3):
        x, y = rng.normal(size=(6, 3)), rng.integers(0, 2, size=6)
        got = trainer.step({"x": x, "y": y})
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-10)


def named_outputs(result) -> dict:
    """A function's result as named outputs: ``out0``, ``out1``, ... for a tuple (nested tuples
    flattened in order), else ``output``."""
    if isinstance(result, tuple):
        flat = [t for r in result for t in (r if isinstance(r, tuple) else (r,))]
        return {f"out{k}": v for k, v in enumerate(flat)}
    return {"output": result}


def torch_values(torch, fn, arrays) -> dict:
    """``fn(torch, *arrays)``'s ``named_outputs`` as numpy arrays."""
    want = fn(torch, *(torch.from_numpy(np.asarray(a)) for a in arrays))
    return {k: v.numpy() for k, v in named_outputs(tuple(want) if not isinstance(want, torch.Tensor) else want).items()}


def assert_values_match_torch(torch, fn, arrays, signs: bool = False) -> None:
    """``fn(gc, *arrays)`` captured (``check_model(full_check=True)``) and run on numpy and ort-cpu
    against ``fn(torch, *arrays)``: each output's dtype, shape and values (and with ``signs`` each
    float's sign bit, a zero's included)."""
    import onnx

    want = torch_values(torch, fn, arrays)
    names = [f"x{k}" for k in range(len(arrays))]
    feeds = dict(zip(names, arrays))
    with np.errstate(all="ignore"):
        model = gc.capture(lambda **kw: named_outputs(fn(gc, *(kw[n] for n in names))), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, (backend, k, got[k].dtype, got[k].shape)
            np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-12, err_msg=f"{backend} {k}")
            if signs and v.dtype.kind == "f":
                np.testing.assert_array_equal(np.signbit(got[k]), np.signbit(v), err_msg=f"{backend} {k} signs")
