"""Optimizer update graphs (passes/training/optimizers) vs a numpy re-implementation of the
torch.optim formulas, and vs torch.optim itself when importable, over several steps."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.emit import Emitter
from graphc.passes.training import adam_moments, optimizers
from graphc.passes.training.scheduled import running_state

SHAPE = (3, 4)
STEPS = 6
SPECS = [
    gc.optim.SGD(0.1),
    gc.optim.SGD(0.1, weight_decay=0.01),
    gc.optim.SGD(0.05, momentum=0.9),
    gc.optim.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
    gc.optim.Adam(0.01),
    gc.optim.Adam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
    gc.optim.AdamW(0.01),
    gc.optim.AdamW(0.02, weight_decay=0.1, betas=(0.5, 0.9)),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]
# Adam's moments as the spec's JSON of earlier artifacts asks for them: today's sums (None), the
# second as PyTorch's average (format 5 and before), both (format 3 and before)
KEPT = {None: {}, "format 5": {"second_moment": "average"},
        "format 3": {"first_moment": "average", "second_moment": "average"}}


def numpy_step(spec, p, g, state, t):
    """torch.optim's single-tensor update in float64, its state keyed as torch keys it
    (``exp_avg``, ...); ``t`` is the step number after it."""
    state = dict(state)
    if spec.kind == "sgd":
        if spec.weight_decay:
            g = g + spec.weight_decay * p
        if spec.momentum:
            buf = g.copy() if t == 1 else spec.momentum * state["momentum_buffer"] + g
            state["momentum_buffer"] = buf
            g = g + spec.momentum * buf if spec.nesterov else buf
        return p - spec.lr * g, state
    b1, b2 = spec.betas
    if spec.kind == "adamw":
        p = p * (1 - spec.lr * spec.weight_decay)
    elif spec.weight_decay:
        g = g + spec.weight_decay * p
    m = state["exp_avg"] + (1 - b1) * (g - state["exp_avg"])
    v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2**t) + spec.eps
    return p - spec.lr / (1 - b1**t) * m / denom, {"exp_avg": m, "exp_avg_sq": v}


def torch_state(spec, state: dict) -> dict:
    """The graph's optimizer state as torch.optim keys it: Adam's moments kept as sums times
    ``1 - beta`` (``exp_sum`` -> ``exp_avg``, ``exp_sum_sq`` -> ``exp_avg_sq``, ``max_exp_sum_sq`` ->
    ``max_exp_avg_sq``)."""
    out = dict(state)
    for total, average, beta in (adam_moments.FIRST, adam_moments.SECOND, adam_moments.MAX_SECOND):
        if total in out:
            out[average] = out.pop(total) * (1 - spec.betas[beta])
    return out


def update_model(spec, dtype=ir.DataType.FLOAT, kept=None, shape=SHAPE) -> gc.Model:
    """Inputs p, g, state slots, step (int64), lr (``optimizers.lr_dtype``: float64 for float64
    params, else float32) and the running scalar state (ASGD's eta and mu); outputs p.next,
    <slot>.next, step.next and the running state's .next.
    ``kept``: Adam's moments as earlier artifacts keep them (``KEPT``)."""
    hyper = {**spec.model_dump(), **KEPT[kept]}
    slots = optimizers.state_slots(hyper, dtype, len(shape))

    def value(name, dt=dtype, shape=shape):
        return ir.Value(name=name, type=ir.TensorType(dt), shape=ir.Shape(shape))

    p, g = value("p"), value("g")
    state = {s: value(s, shape=optimizers.state_shape(hyper, s, shape)) for s in slots}
    running = {n: value(n, ir.DataType.DOUBLE, ()) for n in running_state(hyper)}
    step, lr = value("step", ir.DataType.INT64, ()), value("lr", optimizers.lr_dtype([dtype]), ())
    graph = ir.Graph([p, g, *state.values(), step, lr, *running.values()], [], nodes=[], opset_imports={"": 21},
                     name="upd")
    b = Emitter(graph, 21)
    t = b.op("Add", step, b.const(1, np.int64), name="step.next")
    ctx = optimizers.StepContext(b, lr, t, running=running)
    new_p, new_state = optimizers.update(ctx, hyper, p, g, state)
    outs = [new_p, *(new_state[s] for s in slots), t, *(ctx.running_next[n] for n in running)]
    names = ["p.next", *(f"{s}.next" for s in slots), "step.next", *(f"{n}.next" for n in running)]
    for out, name, like in zip(outs, names, [p, *state.values(), step, *running.values()]):
        out.name, out.shape = name, like.shape
    graph.outputs.extend(outs)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def run_steps(spec, backend, grads, p0, dtype=np.float32, kept=None):
    """The params after each step and, with them, the state as torch keys it (ASGD's eta and mu
    too, the running scalar state)."""
    ir_dtype = ir.DataType.from_numpy(np.dtype(dtype))
    session = gc.Session(update_model(spec, ir_dtype, kept, p0.shape), backend=backend)
    slots = optimizers.state_slots({**spec.model_dump(), **KEPT[kept]}, ir_dtype, p0.ndim)
    p, step = p0.astype(dtype), np.array(0, np.int64)
    state = {s: optimizers.initial_state(spec.model_dump(), s, p) for s in slots}  # Adagrad's sum need not be 0
    state.update(running_state(spec.model_dump()))
    history = []
    for g in grads:
        lr = np.array(spec.lr, np.float64 if np.dtype(dtype) == np.float64 else np.float32)
        out = session.run({"p": p, "g": g.astype(dtype), **state, "step": step, "lr": lr})
        p, step = out["p.next"], out["step.next"]
        state = {s: out[f"{s}.next"] for s in state}
        history.append((p, torch_state(spec, state)))
    return history


# torch.optim's class of each spec kind, and its per-param scalar state: the step (a train_step input) and NAdam's
# mu_product (computed from it)
TORCH_OPTIM = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
               "adamax": "Adamax", "nadam": "NAdam", "radam": "RAdam", "adadelta": "Adadelta", "rprop": "Rprop",
               "asgd": "ASGD", "adafactor": "Adafactor"}
SCALAR_STATE = ("step", "mu_product")


def torch_kwargs(spec) -> dict:
    """The spec's fields as torch.optim's keyword arguments."""
    return {k: v for k, v in spec.model_dump().items() if k not in ("kind", "no_decay")}


def torch_steps(torch, spec, p0, grads, dtype, store=None, fused=False):
    """torch.optim's param and state after each step (its single-tensor path, or with ``fused`` its
    fused one); ``store`` (a torch dtype): param and state rounded to it after each step (a float32
    step of params stored in float16)."""
    param = torch.nn.Parameter(torch.from_numpy(p0.astype(dtype)))
    path = {"fused": True} if fused else {"foreach": False}
    opt = getattr(torch.optim, TORCH_OPTIM[spec.kind])([param], **path, **torch_kwargs(spec))
    out = []
    for g in grads:
        param.grad = torch.from_numpy(g.astype(dtype))
        opt.step()
        tensors = {"param": param.data, **{k: v for k, v in opt.state[param].items() if k not in SCALAR_STATE}}
        if store is not None:
            for t in tensors.values():
                t.copy_(t.to(store).to(t.dtype))
        state = {k: v.numpy().copy() for k, v in tensors.items()}
        out.append((state.pop("param"), state))
    return out


def step_both(trainer, opt, params, batch, want, t: int) -> None:
    """One torch step of ``opt`` on the loss ``want`` and one ``trainer`` step on ``batch``: the
    losses (step ``t``) and then every param of the trainer and of ``params`` agree to 1e-12."""
    opt.zero_grad()
    want.backward()
    opt.step()
    np.testing.assert_allclose(trainer.step(batch), want.item(), rtol=1e-12, err_msg=f"step {t}")
    for name, value in trainer.params.items():
        np.testing.assert_allclose(value, params[name].detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=f"step {t} {name}")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=SHAPE), [rng.normal(size=SHAPE) for _ in range(STEPS)]


# every spec, and the Adam ones again with their moments as earlier artifacts keep them
FORMS = [(spec, None) for spec in SPECS] + [(spec, kept) for kept in ("format 5", "format 3")
                                            for spec in SPECS if spec.kind != "sgd"]


@pytest.mark.parametrize(("spec", "kept"), FORMS,
                         ids=IDS + [f"{i}-{kept}" for kept in ("format 5", "format 3")
                                    for i, s in zip(IDS, SPECS) if s.kind != "sgd"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_update_matches_torch_formulas(spec, kept, backend):
    p0, grads = _data()
    got = run_steps(spec, backend, grads, p0, kept=kept)
    p, state = p0, {s: np.zeros(SHAPE) for s in ("momentum_buffer", "exp_avg", "exp_avg_sq")}
    for t, (g, (p_graph, state_graph)) in enumerate(zip(grads, got), start=1):
        p, state = numpy_step(spec, p, g, state, t)
        np.testing.assert_allclose(p_graph, p, rtol=1e-5, atol=1e-6, err_msg=f"step {t}")
        for slot, value in state_graph.items():
            np.testing.assert_allclose(value, state[slot], rtol=1e-5, atol=1e-7, err_msg=f"step {t} {slot}")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_update_matches_torch_optim(spec):
    torch = pytest.importorskip("torch")
    p0, grads = _data(1)
    got = run_steps(spec, "numpy", grads, p0, dtype=np.float64)
    param = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    kwargs = {k: v for k, v in spec.model_dump().items() if k not in ("kind", "no_decay")}
    opt = cls([param], foreach=False, **kwargs)
    for t, (g, (p_graph, state_graph)) in enumerate(zip(grads, got), start=1):
        param.grad = torch.from_numpy(g.copy())
        opt.step()
        # lr is a float64 input for float64 params: the updates agree to float64 rounding
        np.testing.assert_allclose(p_graph, param.detach().numpy(), rtol=1e-15, atol=1e-16, err_msg=f"step {t}")
        for slot, value in state_graph.items():
            np.testing.assert_allclose(value, opt.state[param][slot].numpy(), rtol=1e-14, atol=1e-16,
                                       err_msg=f"step {t} {slot}")


def test_float64_params_stay_float64():
    model = update_model(gc.optim.Adam(0.01), ir.DataType.DOUBLE)
    assert {o.dtype for o in model.outputs if o.name != "step.next"} == {"float64"}


def test_spec_validation_and_json_round_trip():
    for spec in SPECS:
        assert gc.optim.from_dict(spec.model_dump(mode="json")) == spec
    assert gc.optim.SGD(0.1, momentum=0.9).state_slots == ("momentum_buffer",)
    assert gc.optim.SGD(0.1).state_slots == ()
    assert gc.optim.AdamW(1e-3).weight_decay == 0.01
    with pytest.raises(ValueError, match="nesterov"):
        gc.optim.SGD(0.1, nesterov=True)
    with pytest.raises(ValueError):
        gc.optim.Adam(0.1, betas=(1.0, 0.9))
    with pytest.raises(ValueError):
        gc.optim.SGD(-1.0)
    for bad in ({"lr": float("inf")}, {"weight_decay": float("inf")}, {"momentum": float("inf")}):
        with pytest.raises(ValueError, match="finite number"):  # an inf lr or decay turns params to NaN
            gc.optim.SGD(**{"lr": 0.1, **bad})
    with pytest.raises(ValueError, match="finite number"):
        gc.optim.AdamW(0.1, eps=float("inf"))
    assert gc.optim.AdamW(0.1, no_decay="*.bias").no_decay == ("*.bias",)  # one pattern, not a refusal


HALF_SPECS = [gc.optim.Adam(0.01), gc.optim.Adam(0.01, weight_decay=0.05), gc.optim.AdamW(0.02, weight_decay=0.1)]


@pytest.mark.parametrize("spec", HALF_SPECS, ids=[f"{s.kind}-{i}" for i, s in enumerate(HALF_SPECS)])
@pytest.mark.parametrize(("dtype", "backends"), [("float16", ("numpy", "ort-cpu")), ("bfloat16", ("numpy",))])
def test_half_precision_adam_steps_in_float32_as_torch_fused(spec, dtype, backends):
    """float16 and bfloat16 params take the Adam step in float32, their state stored in their
    dtype, as torch.optim's fused Adam/AdamW: eps * sqrt(1 - b2^t) (3e-10) underflowed to 0 in
    float16, so an element whose gradient had been 0 stepped by 0/0 = NaN on numpy (as torch's
    single-tensor and foreach Adam do) and finitely on ort-cpu, which ran the float16 nodes in
    float32 once onnxruntime merged the Cast down with its own Cast up."""
    torch = pytest.importorskip("torch")
    np_dtype = gc.model.dtypes.to_numpy(dtype)
    p0, grads = _data(2)
    for g in grads:
        g[:, 1] = 0.0  # a column whose gradient is always zero (a ReLU that never fires, an unused input)
    param = torch.nn.Parameter(torch.from_numpy(p0.astype(np.float32)).to(getattr(torch, dtype)))
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    opt = cls([param], fused=True, **{k: v for k, v in spec.model_dump().items() if k not in ("kind", "no_decay")})
    expected = []
    for g in grads:
        param.grad = torch.from_numpy(g.astype(np.float32)).to(param.dtype)
        opt.step()
        expected.append(param.detach().float().numpy())
    for backend in backends:
        got = run_steps(spec, backend, [g.astype(np.float32) for g in grads], p0.astype(np.float32).astype(np_dtype),
                        dtype=np_dtype)
        for t, ((p_graph, _), p_torch) in enumerate(zip(got, expected), start=1):
            assert p_graph.dtype == np_dtype
            p_graph = p_graph.astype(np.float32)
            assert np.isfinite(p_graph).all(), f"{backend} step {t}: {p_graph}"
            ulp = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
            np.testing.assert_allclose(p_graph, p_torch, rtol=ulp, atol=0, err_msg=f"{backend} step {t}")


def test_float16_trainer_steps_agree_across_backends_with_torch_fused():
    """The Trainer's fused update (params and state in flat float16 buffers) steps in float32 too:
    numpy gave NaN where a weight's gradient was 0, ort-cpu a finite value."""
    torch = pytest.importorskip("torch")
    model = gc.capture(gc.nn.Linear(3, 2, dtype="float16"), x=gc.spec("float16", ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.Adam(0.01))
    rng = np.random.default_rng(3)
    batches = [{"x": np.stack([rng.normal(size=4), np.zeros(4), np.zeros(4)], axis=1).astype(np.float16),
                "y": rng.normal(size=(4, 2)).astype(np.float16)} for _ in range(4)]  # x[:, 1:] = 0: no gradient there
    linear = torch.nn.Linear(3, 2).half()
    start = gc.Trainer(arts, backend="numpy").params
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(start["weight"])), linear.bias.copy_(torch.from_numpy(start["bias"]))
    opt = torch.optim.Adam(linear.parameters(), 0.01, fused=True)
    for batch in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(linear(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        opt.step()
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        for batch in batches:
            trainer.step(batch)
        weight = trainer.params["weight"]
        assert weight.dtype == np.float16
        np.testing.assert_array_equal(weight[:, 1:], start["weight"][:, 1:], err_msg=backend)
        np.testing.assert_allclose(weight.astype(np.float32), linear.weight.detach().float().numpy(), rtol=2.0 ** -9,
                                   err_msg=backend)
