"""`graphc train --schedule`: the lr schedules the command builds (``gc.optim.lr_scheduler``) from
a few options, as a recipe that checkpoints record so that ``--resume`` rebuilds the same one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from graphc.errors import did_you_mean

SCHEDULES = ("none", "step", "exponential", "cosine", "onecycle", "cyclic", "plateau")
PER_STEP = ("onecycle", "cyclic")  # stepped after each train step, always
# the schedules that span the run (its --epochs), and what training past their end would do
SPAN_RUN = {"onecycle": "OneCycleLR takes no step past its total_steps", "cosine": "the lr would climb back up "
            "from --min-lr"}
INTERVALS = ("epoch", "step")
# the train command's parameters that set the schedule
SCHEDULE_OPTIONS = ("schedule", "schedule_interval", "step_size", "gamma", "min_lr", "warmup", "patience")


def recipe(schedule: str, interval: Optional[str], epochs: int, steps_per_epoch: int, *, step_size: Optional[int],
           gamma: Optional[float], min_lr: Optional[float], warmup: int, patience: int) -> Optional[dict[str, Any]]:
    """The schedule the options ask for, checked (None for ``none``): name, interval, and the
    length of the run in that interval's units (``total``), fixed here so a resume with more
    ``--epochs`` does not stretch it."""
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}"
                         f"{did_you_mean(schedule, SCHEDULES)}")
    if schedule == "none":
        given = [o for o, v in (("--step-size", step_size), ("--gamma", gamma), ("--min-lr", min_lr),
                                ("--warmup", warmup or None), ("--schedule-interval", interval)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set an lr schedule: give --schedule too")
        return None
    interval = interval or ("step" if schedule in PER_STEP else "epoch")
    if interval not in INTERVALS:
        raise ValueError(f"--schedule-interval {interval!r}: expected epoch or step")
    if schedule in PER_STEP and interval != "step":
        raise ValueError(f"--schedule {schedule} steps the lr after each train step: leave out --schedule-interval epoch")
    if schedule == "step" and step_size is None:
        raise ValueError("--schedule step needs --step-size N (scheduler steps between decays)")
    if schedule == "cyclic" and (step_size is None or min_lr is None):
        raise ValueError("--schedule cyclic needs --min-lr (the cycle's lowest lr; its highest is the optimizer's) "
                         "and --step-size N (train steps up, and again down)")
    if gamma is not None and schedule in ("cosine", "onecycle"):
        raise ValueError(f"--gamma: --schedule {schedule} takes no decay factor (it applies to step, exponential, "
                         "plateau, and cyclic's exp_range)")
    if schedule == "exponential" and gamma is None:
        raise ValueError("--schedule exponential needs --gamma (the lr's factor per scheduler step)")
    if warmup and schedule in (*PER_STEP, "plateau"):
        raise ValueError(f"--warmup applies to --schedule step, exponential or cosine, not {schedule}"
                         + (" (onecycle warms up itself)" if schedule == "onecycle" else ""))
    total = _length(interval, epochs, steps_per_epoch)
    if schedule == "cosine" and total - warmup < 1:
        raise ValueError(f"--warmup {warmup} leaves no {interval} of the {total} to anneal over")
    return {"schedule": schedule, "interval": interval, "total": total, "step_size": step_size, "gamma": gamma,
            "min_lr": min_lr, "warmup": warmup, "patience": patience}


def _length(interval: str, epochs: int, steps_per_epoch: int) -> int:
    """A run of ``epochs`` in scheduler steps: epochs, or train steps with ``interval`` "step"."""
    return epochs * (steps_per_epoch if interval == "step" else 1)


def build(trainer: Any, spec: dict[str, Any]):
    """The scheduler of ``spec`` (a ``recipe``) on ``trainer``, which records it in checkpoints."""
    from graphc.runtime import lr_scheduler as S

    name, total, warmup = spec["schedule"], spec["total"], spec["warmup"]
    gamma, min_lr = spec["gamma"], spec["min_lr"] or 0.0
    ramp = S.LinearLR(trainer, start_factor=1.0 / (warmup + 1), total_iters=warmup) if warmup else None
    if name == "step":
        main = S.StepLR(trainer, step_size=spec["step_size"], gamma=0.1 if gamma is None else gamma)
    elif name == "exponential":
        main = S.ExponentialLR(trainer, gamma=gamma)
    elif name == "cosine":
        main = S.CosineAnnealingLR(trainer, T_max=total - warmup, eta_min=min_lr)
    elif name == "onecycle":
        main = S.OneCycleLR(trainer, max_lr=S.lr_group(trainer)["lr"], total_steps=total,
                            cycle_momentum=cycles_momentum(trainer))
    elif name == "cyclic":
        main = S.CyclicLR(trainer, base_lr=min_lr, max_lr=S.lr_group(trainer)["lr"], step_size_up=spec["step_size"],
                          cycle_momentum=cycles_momentum(trainer),
                          **({"mode": "exp_range", "gamma": gamma} if gamma is not None else {}))
    else:
        main = S.ReduceLROnPlateau(trainer, factor=0.1 if gamma is None else gamma, patience=spec["patience"],
                                   min_lr=min_lr)
    scheduler = S.SequentialLR(trainer, [ramp, main], milestones=[warmup]) if ramp is not None else main
    scheduler.recipe = spec
    return scheduler


def cycles_momentum(trainer: Any) -> bool:
    """Do onecycle and cyclic cycle the momentum (torch's default)? Where the artifacts take it as
    an input (``graphc grad --scheduled momentum``); others hold it constant (``momentum_note``)."""
    from graphc.passes.training.scheduled import momentum_scheduled

    return momentum_scheduled(trainer.manifest.optimizer)


def momentum_note(trainer: Any) -> Optional[str]:
    """What to say when ``trainer``'s onecycle or cyclic schedule leaves the momentum constant,
    where torch's would cycle it; None otherwise."""
    from graphc.runtime import momentum

    recipe_ = getattr(trainer.scheduler, "recipe", None) or {}
    optimizer = trainer.manifest.optimizer
    if recipe_.get("schedule") not in PER_STEP or cycles_momentum(trainer) or momentum.momentum_key(optimizer) is None:
        return None
    return (f"note: --schedule {recipe_['schedule']} cycles the lr only: these artifacts hold {momentum.what(optimizer)} "
            "constant (torch's default cycles it too: generate them with graphc grad --scheduled momentum)")


def use_schedule(trainer: Any, resumed: Optional[Path], asked: Optional[dict[str, Any]], options_given: list[str],
                 epochs: int, steps_per_epoch: int):
    """Give ``trainer`` the scheduler ``asked`` (a ``recipe``), or on a resume the one its
    checkpoint recorded: ``options_given`` (of ``SCHEDULE_OPTIONS``) asking for another is an
    error, and so is ``epochs`` past the end of a schedule that spans the recorded run."""
    import json

    from graphc.runtime.checkpoint import read_meta

    saved = json.loads(read_meta(resumed).schedule or "null") if resumed is not None else None
    if saved is not None and saved.get("recipe") is None:
        raise ValueError(f"{resumed} saved a {saved['kind']} scheduler that was not made by --schedule; resume it "
                         "in Python (trainer.fit(..., scheduler=...))")
    if resumed is not None and (trainer.step_count or trainer.epoch):
        then = saved["recipe"] if saved is not None else None
        if options_given and _without_total(asked) != _without_total(then):
            raise ValueError(f"--resume: the checkpoint recorded the lr schedule {_describe(then)}; "
                             f"--{options_given[0].replace('_', '-')} asks for {_describe(asked)}. Leave the "
                             "schedule options out to continue it")
        _check_span(then, resumed, epochs, steps_per_epoch)
        asked = then
    if asked is None:
        return
    trainer.scheduler = build(trainer, asked)
    trainer.scheduler_interval = asked["interval"]


def _check_span(spec: Optional[dict], resumed: Path, epochs: int, steps_per_epoch: int) -> None:
    """Refuse, before any step, a resume to ``epochs`` past the end of ``spec``'s schedule when it
    spans its run (``SPAN_RUN``): stretching it would change the lrs the run already took."""
    if spec is None or spec["schedule"] not in SPAN_RUN:
        return
    if _length(spec["interval"], epochs, steps_per_epoch) <= spec["total"]:
        return
    recorded = spec["total"] // _length(spec["interval"], 1, steps_per_epoch)
    raise ValueError(f"resuming {resumed}: --epochs {epochs}, but the checkpoint's run was --epochs {recorded} and "
                     f"its --schedule {spec['schedule']} ends there ({SPAN_RUN[spec['schedule']]}); pass --epochs "
                     f"{recorded} to finish the run as recorded, or start a new run with --epochs {epochs} in another "
                     "--checkpoint folder")


def _without_total(spec: Optional[dict]) -> Optional[dict]:
    return None if spec is None else {k: v for k, v in spec.items() if k != "total"}


def _describe(spec: Optional[dict]) -> str:
    if spec is None:
        return "none"
    return spec["schedule"] + "".join(f" {k}={v}" for k, v in spec.items() if k != "schedule" and v not in (None, 0))
