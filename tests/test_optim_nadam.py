"""``gc.optim.NAdam`` and ``RAdam`` against torch.optim (single-tensor path): the update graph over
25 steps in float64 and float32 on numpy and ort-cpu; NAdam's ``mu_product``, computed from the
step, against torch's running product up to step 100,000; RAdam's switch at ``rho_t > 5``; the
Trainer's fused and per-param updates (a frozen param, a no_decay group); checkpoint/resume;
float16 and bfloat16 params; the CLI. torch keeps ``step`` and ``mu_product`` in its default dtype:
the float64 comparisons run it with float64 as the default (``torch_float64``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import graphc as gc
import test_optim_more as more
from graphc.passes.training import optimizers
from test_grad_clipping import _graphc
from test_optim import SHAPE, run_steps, torch_kwargs, torch_steps, update_model

SPECS = [
    gc.optim.NAdam(),
    gc.optim.NAdam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, momentum_decay=0.01),
    gc.optim.NAdam(0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
    gc.optim.NAdam(0.005, momentum_decay=0.0, maximize=True),
    gc.optim.RAdam(),  # rectified from step 6 on (rho_5 = 4.99, rho_6 = 5.99)
    gc.optim.RAdam(0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05),
    gc.optim.RAdam(0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_matches_torch_optim(spec, backend, dtype, torch_float64):
    p0, grads = more._grads(SPECS.index(spec))
    got = run_steps(spec, backend, grads, p0, dtype=dtype)
    want = torch_steps(torch_float64, spec, p0, grads, dtype)
    rtol, atol = (1e-12, 1e-14) if dtype == np.float64 else (2e-5, 1e-6)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        np.testing.assert_allclose(p_graph, p_torch, rtol=rtol, atol=atol, err_msg=f"step {t}")
        assert set(state_graph) == set(state_torch) == {"exp_avg", "exp_avg_sq"}
        for slot, value in state_graph.items():
            assert value.dtype == dtype
            np.testing.assert_allclose(value, state_torch[slot], rtol=rtol, atol=atol, err_msg=f"step {t} {slot}")


def _rho(beta2: float, t: int) -> float:
    """RAdam's rho_t as torch.optim computes it."""
    return 2 / (1 - beta2) - 1 - 2 * t * beta2**t / (1 - beta2**t)


def test_radam_cases_cross_the_switch():
    """Each RAdam spec above steps both ways within the 25 steps (the default within 1e-2 of 5)."""
    for spec in SPECS:
        if spec.kind == "radam":
            rho = [_rho(spec.betas[1], t) for t in range(1, more.STEPS + 1)]
            assert min(rho) <= 5 < max(rho), spec
    assert abs(_rho(0.999, 5) - 5) < 1e-2


@pytest.mark.parametrize("momentum_decay", [4e-3, 0.0, 0.5])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_mu_product_from_the_step(momentum_decay, backend, torch_float64):
    """One NAdam step at step t + 1 from a state torch carried there: torch reads its
    ``mu_product``, the running product of t factors in float64; the graph computes it from t."""
    torch = torch_float64
    spec = gc.optim.NAdam(0.01, betas=(0.95, 0.99), momentum_decay=momentum_decay)
    session = gc.Session(update_model(spec, ir.DataType.DOUBLE), backend=backend)
    rng = np.random.default_rng(3)
    product, done = 1.0, 0
    for t in (0, 1, 9, 99, 999, 4999, 29999, 99999):
        for i in range(done + 1, t + 1):  # torch's mu_product *= mu, step by step
            product *= 0.95 * (1.0 - 0.5 * (0.96 ** (i * momentum_decay)))
        done = t
        p, g = np.zeros(SHAPE), rng.normal(size=SHAPE)  # p 0: the step itself compared
        m, v = rng.normal(size=SHAPE) * 0.1, rng.uniform(0.5, 2.0, size=SHAPE)
        out = session.run({"p": p, "g": g, "exp_avg": m, "exp_avg_sq": v, "step": np.array(t, np.int64),
                           "lr": np.array(spec.lr)})
        param = torch.nn.Parameter(torch.from_numpy(p.copy()))
        opt = torch.optim.NAdam([param], foreach=False, **torch_kwargs(spec))
        opt.state[param] = {"step": torch.tensor(float(t)), "mu_product": torch.tensor(product),
                            "exp_avg": torch.from_numpy(m.copy()), "exp_avg_sq": torch.from_numpy(v.copy())}
        param.grad = torch.from_numpy(g)
        opt.step()
        np.testing.assert_allclose(out["p.next"], param.detach().numpy(), rtol=1e-12, err_msg=f"step {t + 1}")


HALF = [SPECS[1], SPECS[2], SPECS[5], SPECS[6]]


@pytest.mark.parametrize("spec", HALF, ids=[f"{s.kind}-{i}" for i, s in enumerate(HALF)])
@pytest.mark.parametrize(("dtype", "backend"), [("float16", "numpy"), ("float16", "ort-cpu"), ("bfloat16", "numpy")])
def test_half_params_step_in_float32(spec, dtype, backend):
    more.check_half_params(spec, dtype, backend, 60 + HALF.index(spec))


TRAINED = [gc.optim.NAdam(0.02, weight_decay=0.05, no_decay="*.bias"),
           gc.optim.NAdam(0.02, weight_decay=0.05, decoupled_weight_decay=True, no_decay="*.bias"),
           gc.optim.RAdam(0.02, betas=(0.9, 0.9), weight_decay=0.05, no_decay="*.bias"),
           gc.optim.RAdam(0.02, betas=(0.9, 0.9), weight_decay=0.05, decoupled_weight_decay=True, no_decay="*.bias")]
TRAINED_IDS = [f"{s.kind}-{'decoupled' if s.decoupled_weight_decay else 'l2'}" for s in TRAINED]


@pytest.mark.parametrize("spec", TRAINED, ids=TRAINED_IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_trainer_matches_torch(spec, fused, backend, torch_float64):
    """12 Trainer steps against torch: fc1.weight frozen, the biases without weight decay."""
    more.test_trainer_matches_torch(spec, fused, backend)


@pytest.mark.parametrize("spec", TRAINED, ids=TRAINED_IDS)
def test_resume_is_bit_exact(tmp_path, spec):
    more.test_resume_is_bit_exact(tmp_path, spec)


def test_decoupled_decay_does_not_read_the_param():
    """With decoupled weight decay the step needs no param (the fused update concatenates none)."""
    assert optimizers.needs_param(gc.optim.NAdam(weight_decay=0.1).model_dump())
    assert not optimizers.needs_param(gc.optim.NAdam(weight_decay=0.1, decoupled_weight_decay=True).model_dump())
    assert not optimizers.needs_param(gc.optim.RAdam(weight_decay=0.1, decoupled_weight_decay=True).model_dump())


def test_specs_refuse_bad_values():
    assert gc.optim.NAdam().state_slots == gc.optim.RAdam().state_slots == ("exp_avg", "exp_avg_sq")
    with pytest.raises(ValueError, match="momentum_decay"):
        gc.optim.NAdam(momentum_decay=-0.1)
    with pytest.raises(ValueError, match="betas must each lie in"):
        gc.optim.RAdam(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="momentum_decay"):
        gc.optim.RAdam(momentum_decay=0.1)


def test_cli_grad(tmp_path):
    import onnx

    onnx.save(gc.capture(more._MLP(), x=gc.spec("float64", ("N", 5))).proto, tmp_path / "net.onnx")
    for flags, want in [(("--optimizer", "nadam", "--momentum-decay", "0.01", "--weight-decay", "0.1",
                          "--decoupled-weight-decay"),
                         gc.optim.NAdam(momentum_decay=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
                        (("--optimizer", "radam", "--betas", "0.8,0.9", "--lr", "0.01"),
                         gc.optim.RAdam(0.01, betas=(0.8, 0.9)))]:
        r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", *flags, "-o", tmp_path / want.kind)
        assert r.returncode == 0, r.stderr
        assert gc.optim.from_dict(gc.training.read_manifest(tmp_path / want.kind).optimizer) == want
        assert ("decoupled_weight_decay" in r.stdout) == want.decoupled_weight_decay, r.stdout  # the summary line
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", "--optimizer", "radam", "--momentum-decay",
                "0.01", "-o", tmp_path / "bad")
    assert r.returncode != 0 and "--momentum-decay applies to nadam, not --optimizer radam" in r.stderr, r.stderr
