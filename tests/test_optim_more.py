"""``gc.optim.RMSprop``, ``Adagrad`` and ``Adamax`` against torch.optim (single-tensor path): the
update graph alone over 25 steps in float64 and float32, on numpy and ort-cpu; the Trainer's fused
and per-param updates with a frozen param and a no_decay group; checkpoint/resume; float16 params
(stepped in float32, their state stored in float16); the spec defaults; the CLI."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import graphc as gc
from test_grad_clipping import _graphc
from test_optim import SCALAR_STATE, SHAPE, TORCH_OPTIM, run_steps, step_both, torch_kwargs, torch_steps
from trainer_models import straight_and_resumed

STEPS = 25
SPECS = [
    gc.optim.RMSprop(),
    gc.optim.RMSprop(0.01, alpha=0.9, eps=1e-6, weight_decay=0.05, momentum=0.8, centered=True),
    gc.optim.RMSprop(0.005, momentum=0.9, maximize=True),
    gc.optim.RMSprop(0.01, centered=True, maximize=True, weight_decay=0.1),
    gc.optim.Adagrad(),
    gc.optim.Adagrad(0.1, lr_decay=0.05, weight_decay=0.05, initial_accumulator_value=0.3, eps=1e-6),
    gc.optim.Adagrad(0.05, lr_decay=0.01, maximize=True),
    gc.optim.Adamax(),
    gc.optim.Adamax(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
    gc.optim.Adamax(0.02, maximize=True),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]


def _grads(seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """A start and gradients that jump in size (Adamax's running max and the moments lag them);
    one column always 0 (an input never seen)."""
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=SHAPE) * (3.0 if t % 7 == 0 else 1.0 / (1 + t)) for t in range(STEPS)]
    for g in grads:
        g[:, 1] = 0.0
    return rng.normal(size=SHAPE), grads


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_matches_torch_optim(spec, backend, dtype):
    torch = pytest.importorskip("torch")
    p0, grads = _grads(SPECS.index(spec))
    got = run_steps(spec, backend, grads, p0, dtype=dtype)
    want = torch_steps(torch, spec, p0, grads, dtype)
    rtol, atol = (1e-12, 1e-14) if dtype == np.float64 else (2e-5, 1e-6)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        np.testing.assert_allclose(p_graph, p_torch, rtol=rtol, atol=atol, err_msg=f"step {t}")
        assert set(state_graph) == set(state_torch)  # the slots are torch's state keys
        for slot, value in state_graph.items():
            assert value.dtype == dtype
            np.testing.assert_allclose(value, state_torch[slot], rtol=rtol, atol=atol, err_msg=f"step {t} {slot}")


HALF = [SPECS[1], SPECS[2], SPECS[5], SPECS[6], SPECS[8], SPECS[9]]


@pytest.mark.parametrize("spec", HALF, ids=[s.kind for s in HALF])
@pytest.mark.parametrize(("dtype", "backend"), [("float16", "numpy"), ("float16", "ort-cpu"), ("bfloat16", "numpy")])
def test_half_params_step_in_float32(spec, dtype, backend):
    """float16 and bfloat16 params step in float32, param and state rounded to their dtype once a
    step: in float16 eps (1e-8, 1e-6) is 0 or subnormal and the column whose gradient is always 0
    stepped by 0/0."""
    check_half_params(spec, dtype, backend, 40 + HALF.index(spec))


def check_half_params(spec, dtype: str, backend: str, seed: int):
    """25 steps of float16 or bfloat16 params against torch's float32 steps, param and state rounded
    to ``dtype`` after each."""
    torch = pytest.importorskip("torch")
    np_dtype, ulp = gc.model.dtypes.to_numpy(dtype), 2.0 ** (-10 if dtype == "float16" else -7)
    p0, grads = _grads(seed)
    p0 = p0.astype(np_dtype).astype(np.float32)
    grads = [g.astype(np_dtype).astype(np.float32) for g in grads]
    got = run_steps(spec, backend, grads, p0, dtype=np_dtype)
    want = torch_steps(torch, spec, p0, grads, np.float32, store=getattr(torch, dtype))
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        assert p_graph.dtype == np_dtype and np.isfinite(p_graph.astype(np.float32)).all(), f"step {t}"
        if not spec.weight_decay:  # nothing moves that column
            np.testing.assert_array_equal(p_graph[:, 1], p0[:, 1].astype(np_dtype))
        np.testing.assert_allclose(p_graph.astype(np.float32), p_torch, rtol=ulp, atol=1e-6, err_msg=f"step {t}")
        for slot, value in state_graph.items():
            assert value.dtype == np_dtype
            np.testing.assert_allclose(value.astype(np.float32), state_torch[slot], rtol=ulp, atol=1e-6,
                                       err_msg=f"step {t} {slot}")


class _MLP(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = gc.nn.Linear(5, 7, dtype="float64")
        self.fc2 = gc.nn.Linear(7, 3, dtype="float64")
        self.fc3 = gc.nn.Linear(3, 2, dtype="float64")

    def forward(self, x):
        return {"out": self.fc3(gc.tanh(self.fc2(gc.tanh(self.fc1(x)))))}


def _batches(n: int = 12):
    rng = np.random.default_rng(5)
    return [{"x": rng.normal(size=(6, 5)), "y": rng.normal(size=(6, 2))} for _ in range(n)]


def _arts(spec, fused=True):
    model = gc.capture(_MLP(), seed=0, x=gc.spec("float64", ("N", 5)))
    return gc.training.generate(model, gc.losses.mse("out", label="y"), spec, frozen=["fc1.weight"], fused=fused)


TRAINED = [gc.optim.RMSprop(0.01, momentum=0.9, centered=True, weight_decay=0.05, no_decay="*.bias"),
           gc.optim.Adagrad(0.1, lr_decay=0.02, weight_decay=0.05, initial_accumulator_value=0.1, no_decay="*.bias"),
           gc.optim.Adamax(0.02, weight_decay=0.05, no_decay="*.bias")]


@pytest.mark.parametrize("spec", TRAINED, ids=[s.kind for s in TRAINED])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_trainer_matches_torch(spec, fused, backend):
    """The Trainer against torch over 12 steps: fc1.weight frozen, the biases a param group without
    weight decay (torch's param groups), each step's loss and every param after it."""
    torch = pytest.importorskip("torch")
    trainer = gc.Trainer(_arts(spec, fused), backend=backend)
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in trainer.params.items()}
    params["fc1.weight"].requires_grad_(False)
    kwargs = torch_kwargs(spec)
    groups = [{"params": [v for k, v in params.items() if k.endswith(".weight") and k != "fc1.weight"]},
              {"params": [v for k, v in params.items() if k.endswith(".bias")], "weight_decay": 0.0}]
    opt = getattr(torch.optim, TORCH_OPTIM[spec.kind])(groups, foreach=False, **kwargs)
    for t, batch in enumerate(_batches(), start=1):
        h = torch.from_numpy(batch["x"])
        for i in (1, 2, 3):
            h = h @ params[f"fc{i}.weight"].T + params[f"fc{i}.bias"]
            h = torch.tanh(h) if i < 3 else h
        want = torch.nn.functional.mse_loss(h, torch.from_numpy(batch["y"]))
        step_both(trainer, opt, params, batch, want, t)
    state = trainer.state_dict()
    assert "fc1.weight" not in {k.rsplit(".", 1)[0] for k in state if k.count(".") == 2}  # frozen: no state
    for name, value in opt.state[params["fc2.weight"]].items():
        if name not in SCALAR_STATE:
            np.testing.assert_allclose(state[f"fc2.weight.{name}"], value.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("spec", TRAINED, ids=[s.kind for s in TRAINED])
def test_resume_is_bit_exact(tmp_path, spec):
    straight, resumed = straight_and_resumed(_arts(spec), _batches(8), 3, tmp_path / "ck", backend="ort-cpu")
    state = straight.state_dict()
    assert {f"fc2.weight.{s}" for s in spec.state_slots} <= set(state)
    for name, value in state.items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name


def test_initial_accumulator_value_is_the_first_state():
    arts = _arts(gc.optim.Adagrad(initial_accumulator_value=0.25))
    state = gc.Trainer(arts, backend="numpy").state_dict()
    np.testing.assert_array_equal(state["fc2.weight.sum"], np.full((3, 7), 0.25))


def test_specs_take_torch_defaults_and_refuse_bad_values():
    torch = pytest.importorskip("torch")
    for kind, name in TORCH_OPTIM.items():
        spec = gc.optim.from_dict({"kind": kind})
        assert spec == gc.optim.from_dict(spec.model_dump(mode="json"))
        torch_defaults = {k: p.default for k, p in inspect.signature(getattr(torch.optim, name)).parameters.items()
                          if k in type(spec).model_fields}
        assert torch_defaults and {k: getattr(spec, k) for k in torch_defaults} == torch_defaults, kind
    assert gc.optim.RMSprop(momentum=0.9, centered=True).state_slots == ("square_avg", "momentum_buffer", "grad_avg")
    assert gc.optim.Adamax().state_slots == ("exp_avg", "exp_inf")
    with pytest.raises(ValueError, match="betas must each lie in"):
        gc.optim.Adamax(betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="alpha"):
        gc.optim.RMSprop(alpha=-0.5)
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        gc.optim.Adagrad(initial_accumulator_value=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        gc.optim.RMSprop(nesterov=True)


def test_cli_grad(tmp_path):
    import onnx

    onnx.save(gc.capture(_MLP(), x=gc.spec("float64", ("N", 5))).proto, tmp_path / "net.onnx")
    for flags, want in [(("--optimizer", "rmsprop", "--alpha", "0.9", "--momentum", "0.5", "--centered"),
                         gc.optim.RMSprop(alpha=0.9, momentum=0.5, centered=True)),
                        (("--optimizer", "adagrad", "--lr-decay", "0.1", "--initial-accumulator-value", "0.2"),
                         gc.optim.Adagrad(lr_decay=0.1, initial_accumulator_value=0.2)),
                        (("--optimizer", "adamax", "--betas", "0.8,0.9", "--eps", "1e-6", "--maximize"),
                         gc.optim.Adamax(betas=(0.8, 0.9), eps=1e-6, maximize=True))]:
        r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", *flags, "-o", tmp_path / want.kind)
        assert r.returncode == 0, r.stderr
        assert gc.optim.from_dict(gc.training.read_manifest(tmp_path / want.kind).optimizer) == want
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", "--optimizer", "adam", "--centered",
                "-o", tmp_path / "bad")
    assert r.returncode != 0 and "--centered applies to rmsprop, not --optimizer adam" in r.stderr, r.stderr
