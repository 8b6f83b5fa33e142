"""`graphc grad --averaged`: weight averaging (SWA/EMA) as ``gc.training.generate(averaged=)`` takes it,
an ``gc.optim.swa_utils.AveragedModel``, from the options ``--averaged KIND[:DECAY]``,
``--averaged-start N``, ``--averaged-every N`` and ``--averaged-buffers``."""

from __future__ import annotations

import inspect
from typing import Optional

from graphc.errors import did_you_mean

# --averaged KIND, each built by gc.optim.swa_utils.get_<KIND>_avg_fn (the order the error lists them in)
KINDS = ("swa", "swa_multi", "ema", "ema_multi")


def model_default(name: str):
    """``AveragedModel``'s default of ``name`` (``start``, ``every``, ``use_buffers``), for the help."""
    from graphc.runtime.swa_utils import AveragedModel

    return inspect.signature(AveragedModel).parameters[name].default


def ema_decay_default() -> float:
    """``get_ema_avg_fn``'s default decay (0.999), for the help."""
    from graphc.runtime import swa_utils

    return inspect.signature(swa_utils.get_ema_avg_fn).parameters["decay"].default


def averaged_model(text: Optional[str], start: Optional[int], every: Optional[int], buffers: bool):
    """``--averaged swa|swa_multi|ema[:DECAY]|ema_multi[:DECAY]`` and the options refining it as the
    ``AveragedModel`` generate takes (None: no ``--averaged``; a refining option without it is an
    error, as is anything the Python keyword refuses, each naming the option)."""
    from graphc.runtime import swa_utils

    if text is None:
        given = [option for option, value in (("--averaged-start", start), ("--averaged-every", every),
                                              ("--averaged-buffers", buffers or None)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} refine{'s' if len(given) == 1 else ''} the weight averaging "
                             "--averaged chooses; give --averaged swa or --averaged ema:DECAY too")
        return None
    kind, colon, decay = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown --averaged kind {kind!r}; choose one of {', '.join(KINDS)}"
                         f"{did_you_mean(kind, KINDS)}")
    if colon and kind.startswith("swa"):
        raise ValueError(f"--averaged {kind} takes no decay (the running mean weighs step n by 1/(n+1)), "
                         f"got {text!r}; ema:DECAY takes one")
    args = []
    if colon:
        try:
            args.append(float(decay))
        except ValueError:
            raise ValueError(f"--averaged {kind}:DECAY: DECAY must be a number in [0, 1], got {decay!r}") from None
    try:
        fn = getattr(swa_utils, f"get_{kind}_avg_fn")(*args)
    except ValueError as e:  # the decay's range, as torch words it
        raise ValueError(f"--averaged {kind}:DECAY: {e}") from None
    options = {"start": start, "every": every}
    return swa_utils.AveragedModel(**{"multi_avg_fn" if fn.multi else "avg_fn": fn}, use_buffers=buffers,
                                   **{k: v for k, v in options.items() if v is not None})


def described(spec: dict) -> str:
    """``ema decay=0.999 from step 1`` (``, every 5 steps``, ``, buffers averaged too``): the
    manifest's record of the averaging as grad's summary line and `graphc inspect` say it."""
    decay = "" if spec["decay"] is None else f" decay={spec['decay']:g}"
    every = "" if spec["every"] == 1 else f", every {spec['every']} steps"
    buffers = ", buffers averaged too" if spec["use_buffers"] else ""
    return f"{spec['fn']}{decay} from step {spec['start'] + spec['every']}{every}{buffers}"
