"""``gc.optim``'s argument checks are torch.optim's (torch 2.13, probed live): each spec accepts
exactly the (finite) values the torch optimizer accepts, naming the optimizer, argument, value and
range when it refuses one, and trains with the edge values torch allows (lr 0, eps 0, dampening
outside [0, 1], RMSprop's alpha above 1, ...) step for step as torch does, NaNs included."""

from __future__ import annotations

import inspect
import math

import numpy as np
import onnx
import pytest
from cli_util import one_line_error, run_cli
from test_optim import TORCH_OPTIM, run_steps, torch_steps
from trainer_models import imported_mlp

import graphc as gc

torch = pytest.importorskip("torch")

BETAS = ((0.0, 0.0), (0.999999, 0.5), (1.0, 0.9), (0.9, 1.0), (-0.1, 0.9), (0.9, -1e-12))
VALUES = (-1.0, -1e-12, 0.0, 1e-12, 0.5, 1.0, 1.5, 1e6)


def _numeric_args(kind: str) -> list[str]:
    """The torch optimizer's float arguments that the spec takes (lr, momentum, dampening, eps, ...)."""
    params = inspect.signature(getattr(torch.optim, TORCH_OPTIM[kind])).parameters
    return [name for name, p in params.items() if name in gc.optim.BY_KIND[kind].model_fields
            and type(p.default) in (int, float)]


def _cases():
    for kind in TORCH_OPTIM:
        for arg in _numeric_args(kind):
            for value in VALUES:
                yield kind, {arg: value}
        if "betas" in gc.optim.BY_KIND[kind].model_fields:
            for betas in BETAS:
                yield kind, {"betas": betas}
    for momentum in (0.0, 0.9):
        for dampening in (0.0, 0.5, -0.5):
            yield "sgd", {"nesterov": True, "momentum": momentum, "dampening": dampening}


def _refusal(make) -> str | None:
    try:
        make()
    except (ValueError, TypeError) as error:
        return str(error)
    return None


def test_the_table_covers_every_optimizer_and_argument():
    args = {kind: _numeric_args(kind) for kind in TORCH_OPTIM}
    assert args["sgd"] == ["lr", "momentum", "dampening", "weight_decay"]
    assert args["rmsprop"] == ["lr", "alpha", "eps", "weight_decay", "momentum"]
    assert args["adagrad"] == ["lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"]
    assert args["nadam"] == ["lr", "eps", "weight_decay", "momentum_decay"]
    assert all(args[kind] == ["lr", "eps", "weight_decay"] for kind in ("adam", "adamw", "adamax", "radam"))


@pytest.mark.parametrize("kind, options", list(_cases()), ids=str)
def test_specs_accept_exactly_what_torch_accepts(kind, options):
    name = TORCH_OPTIM[kind]
    theirs = _refusal(lambda: getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **options))
    ours = _refusal(lambda: getattr(gc.optim, name)(**options))
    assert (ours is None) == (theirs is None), (theirs, ours)
    if ours is None:
        return
    assert f"validation error for {name}" in ours
    if "nesterov" in options:
        assert f"got momentum={options['momentum']}, dampening={options['dampening']}" in ours, ours
        return
    (arg, value), = options.items()
    got = value if arg == "betas" else float(value)
    assert f"{arg} must " in ours and f"as torch.optim.{name} checks" in ours and f"got {got!r}" in ours, ours


@pytest.mark.parametrize("kind", TORCH_OPTIM)
def test_inf_and_nan_are_refused_saying_why(kind):
    name = TORCH_OPTIM[kind]
    for arg in _numeric_args(kind):
        for value in (math.inf, math.nan):
            message = _refusal(lambda options={arg: value}: getattr(gc.optim, name)(**options))
            assert message and f"{arg} must be a finite number for {name}, got {value!r}: graphc refuses" in message


# edge values torch accepts; 8 steps, so RAdam's rectification starts (step 6 at b2 = 0.999)
EDGES = [
    ("sgd", dict(lr=0.0, momentum=0.9)),  # lr 0: the params stay, the buffer moves
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=1.5)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=-0.5)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=1.0, weight_decay=0.0)),
    ("adam", dict(lr=0.0)),
    ("adam", dict(lr=0.01, eps=0.0)),
    ("adam", dict(lr=0.01, betas=(0.0, 0.0), eps=0.0, amsgrad=True)),
    ("adamw", dict(lr=0.0, weight_decay=0.1)),
    ("adamw", dict(lr=0.01, eps=0.0, weight_decay=0.0)),
    ("rmsprop", dict(lr=0.0, momentum=0.5, centered=True)),
    ("rmsprop", dict(lr=0.01, alpha=1.5)),
    ("rmsprop", dict(lr=0.01, alpha=0.0, eps=0.0, momentum=0.0)),
    ("adagrad", dict(lr=0.0, lr_decay=0.5)),
    ("adagrad", dict(lr=0.1, eps=0.0, initial_accumulator_value=0.0)),
    ("adamax", dict(lr=0.0)),
    ("adamax", dict(lr=0.01, eps=0.0)),
    ("nadam", dict(lr=0.0, momentum_decay=0.0)),
    ("nadam", dict(lr=0.01, eps=0.0, decoupled_weight_decay=True, weight_decay=0.0)),
    ("radam", dict(lr=0.0)),
    ("radam", dict(lr=0.01, eps=0.0)),
]


def _grads(steps: int = 8):
    """A start and gradients whose first column is 0 throughout (eps 0 then divides 0 by 0: NaN)."""
    rng = np.random.default_rng(7)
    grads = [rng.normal(size=(3, 4)) for _ in range(steps)]
    for g in grads:
        g[:, 0] = 0.0
    return rng.normal(size=(3, 4)), grads


@pytest.mark.parametrize("kind, options", EDGES, ids=[f"{kind}-{i}" for i, (kind, _) in enumerate(EDGES)])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_edge_values_train_as_torch_step_for_step(kind, options, backend, torch_float64):
    spec = gc.optim.BY_KIND[kind](**options)
    p0, grads = _grads()
    got = run_steps(spec, backend, grads, p0, dtype=np.float64)
    want = torch_steps(torch, spec, p0, grads, np.float64)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        np.testing.assert_allclose(p_graph, p_torch, rtol=1e-12, atol=1e-14, err_msg=f"step {t}")
        assert set(state_graph) == set(state_torch)
        for slot, value in state_graph.items():
            np.testing.assert_allclose(value, state_torch[slot], rtol=1e-12, atol=1e-14, err_msg=f"step {t} {slot}")
        if spec.lr == 0:  # the params stay, the state advances
            np.testing.assert_array_equal(p_graph, p0)
            assert all(np.abs(v).max() > 0 for v in state_graph.values()), t
    if getattr(spec, "eps", None) == 0 and spec.kind in ("adam", "adamw", "adagrad", "rmsprop", "nadam"):
        assert np.isnan(got[-1][0][:, 0]).all()  # 0/0 where every gradient was 0, as torch


def test_nesterov_without_momentum_is_refused_as_torch():
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        torch.optim.SGD([torch.zeros(2, requires_grad=True)], momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match=r"SGD\(nesterov=True\) needs momentum > 0 and dampening 0"):
        gc.optim.SGD(0.1, momentum=0.0, nesterov=True)


@pytest.mark.parametrize("flags, message", [
    (["--optimizer", "rmsprop", "--alpha", "-0.5"],
     "--alpha: alpha must be >= 0, as torch.optim.RMSprop checks it, got -0.5"),
    (["--optimizer", "nadam", "--momentum-decay", "-1"],
     "--momentum-decay: momentum_decay must be >= 0, as torch.optim.NAdam checks it, got -1.0"),
    (["--optimizer", "adagrad", "--eps", "nan"], ("--eps: eps must be a finite number for Adagrad, got nan: graphc "
     "refuses inf and NaN, which torch takes in places (its step then turns params to inf or NaN, or stops them)")),
])
def test_cli_refuses_as_torch_in_one_line(capsys, tmp_path, flags, message):
    onnx.save(imported_mlp(), tmp_path / "mlp.onnx")
    result = run_cli(capsys, "grad", tmp_path / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o",
                     tmp_path / "arts", *flags)
    assert one_line_error(result).strip() == f"error: ValueError: {message}"
    assert not (tmp_path / "arts").exists()


@pytest.mark.parametrize("flags, want", [
    (["--lr", "0", "--momentum", "0.9", "--dampening", "1.5"], {"kind": "sgd", "lr": 0.0, "momentum": 0.9,
                                                                "dampening": 1.5}),
    (["--optimizer", "rmsprop", "--alpha", "1.5", "--eps", "0"], {"kind": "rmsprop", "alpha": 1.5, "eps": 0.0}),
])
def test_cli_takes_what_torch_takes(capsys, tmp_path, flags, want):
    onnx.save(imported_mlp(), tmp_path / "mlp.onnx")
    result = run_cli(capsys, "grad", tmp_path / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o",
                     tmp_path / "arts", *flags)
    assert result.code == 0, result.err
    assert gc.optim.from_dict(gc.training.load(tmp_path / "arts").manifest.optimizer) == gc.optim.from_dict(want)
