"""``gc.optim.Adadelta``, ``Rprop``, ``ASGD`` and ``Adafactor`` in a Trainer with what the update alone does
not see, against torch.optim 2.13 in float64: ``accumulate=2``, ``max_grad_norm``, a ``no_decay`` group, a
frozen weight and a ``LinearLR`` warm-up whose lr the first step reads (Rprop's first ``step_size``, ASGD's
first ``eta``); a fresh Rprop after Adam (``fresh_optimizer``) with its lr changed before its first step."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from test_optim import TORCH_OPTIM, torch_kwargs
from test_optim_torch_rest import TRAINED, _arts, _batches, _torch_forward

CLIP = 0.3


def _torch_optimizer(torch, spec, params):
    """torch's optimizer over ``params`` as ``_arts`` trains them: head.weight frozen, the biases a group
    without weight decay."""
    params["head.weight"].requires_grad_(False)
    decayed = {"params": [v for k, v in params.items() if k.endswith(".weight") and k != "head.weight"]}
    plain = {"params": [v for k, v in params.items() if k.endswith(".bias")]}
    if "weight_decay" in type(spec).model_fields:
        plain["weight_decay"] = 0.0
    kwargs = {k: v for k, v in torch_kwargs(spec).items() if k not in ("max_grad_norm", "grad_norm_type",
                                                                         "clip_grad_value")}
    return getattr(torch.optim, TORCH_OPTIM[spec.kind])([decayed, plain], foreach=False, **kwargs)


@pytest.mark.parametrize("spec", TRAINED, ids=[s.kind for s in TRAINED])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_accumulated_clipped_warmed_up_steps_are_torch_s(spec, backend, torch_float64):
    """4 steps of 2 micro-batches each, the gradient norm clipped to 0.3 and the lr 0.3x at step 1 rising to
    1x at step 4: losses and every param within 1e-12 of torch's."""
    torch = torch_float64
    spec = spec.model_copy(update={"max_grad_norm": CLIP})
    trainer = gc.Trainer(_arts(spec), backend=backend, accumulate=2)
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in trainer.params.items()}
    opt = _torch_optimizer(torch, spec, params)
    ours = gc.optim.lr_scheduler.LinearLR(trainer, start_factor=0.3, total_iters=3)
    theirs = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.3, total_iters=3)
    for t, batch in enumerate(_batches(4), start=1):
        opt.zero_grad()
        want = 0.0
        for x, y in zip(*(torch.from_numpy(batch[k]).tensor_split(2) for k in ("x", "y"))):
            loss = torch.nn.functional.mse_loss(_torch_forward(torch, params, x), y) / 2
            loss.backward()
            want += loss.item()
        torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.requires_grad], CLIP)
        opt.step()
        np.testing.assert_allclose(trainer.step(batch), want, rtol=1e-12, err_msg=f"step {t}")
        for name, value in trainer.params.items():
            np.testing.assert_allclose(value, params[name].detach().numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"step {t} {name}")
        ours.step()
        theirs.step()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_fresh_rprop_after_adam_starts_its_step_sizes_at_the_lr_set_then(tmp_path, backend, torch_float64):
    """Adam for 3 steps, checkpointed; Rprop(0.05) takes its params (``fresh_optimizer``) with the lr set
    to 0.02 before its first step, as torch's new Rprop whose param_groups' lr is set so: its step sizes
    start at 0.02, and 3 steps later params and step sizes are torch's to 1e-12."""
    torch = torch_float64
    batches = _batches(6)
    first = gc.Trainer(_arts(gc.optim.Adam(0.01)), backend=backend)
    for batch in batches[:3]:
        first.step(batch)
    first.save_checkpoint(tmp_path / "ck")
    spec = gc.optim.Rprop(0.05)
    trainer = gc.Trainer(_arts(spec), backend=backend)
    trainer.load_checkpoint(tmp_path / "ck", fresh_optimizer=True)
    trainer.lr = 0.02
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in trainer.params.items()}
    opt = _torch_optimizer(torch, spec, params)
    opt.param_groups[0]["lr"] = opt.param_groups[1]["lr"] = 0.02
    for t, batch in enumerate(batches[3:], start=1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(_torch_forward(torch, params, torch.from_numpy(batch["x"])),
                                     torch.from_numpy(batch["y"])).backward()
        opt.step()
        trainer.step(batch)
        if t == 1:  # no sign seen before: every step size stays the lr
            np.testing.assert_array_equal(trainer.state_dict()["fc.weight.step_size"], 0.02)
    state = trainer.state_dict()
    for name, value in trainer.params.items():
        np.testing.assert_allclose(value, params[name].detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
        if params[name].requires_grad:
            np.testing.assert_allclose(state[f"{name}.step_size"], opt.state[params[name]]["step_size"].numpy(),
                                       rtol=1e-12, err_msg=name)
