"""What a resume may change, and what it refuses: a checkpoint records the optimizer spec it
was trained with and the loader settings; ``Trainer.load_checkpoint`` and ``fit`` compare them
with what the resumed run is given, so a changed setting does what torch would do with it, or
fails naming the change before any step, never trains silently on something else.

- lr: the checkpoint's, as torch's ``optimizer.load_state_dict`` restores ``param_groups``; a
  spec lr that differs from the recorded one is warned about (set ``trainer.lr`` to use it).
- the optimizer's kind and its constants (weight decay, betas, eps, momentum, ...): the training
  graphs hold them, so they cannot take the checkpoint's as torch's param groups would: a
  difference is a ``CheckpointError`` naming each, unless ``changed_optimizer=True`` asks for
  the graphs' values (torch: setting ``param_groups`` after ``load_state_dict``).
- the loader mid-epoch: another batch size, seed, shuffle or sample count would cover the rest
  of the epoch with other samples (some twice, some never): refused until the epoch's end.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection
from typing import Any, Optional

from graphc.passes.training.scheduled import MOMENTUM, momentum_key
from graphc.runtime.checkpoint import CheckpointError, LoaderState

__all__ = ["OptimizerChanged", "check_optimizer", "check_position"]

# loader settings whose change mid-epoch changes which samples the rest of the epoch holds
_POSITION_FIELDS = ("batch_size", "shuffle", "seed", "num_samples")


class OptimizerChanged(CheckpointError):
    """A checkpoint trained with another optimizer kind or constants than the training graphs';
    ``words(accept)`` is the message naming ``accept`` as the way to train on regardless (Python's
    ``changed_optimizer=True``, the CLI's ``--changed-optimizer``)."""

    def __init__(self, words: Callable[[str], str]):
        super().__init__(words("changed_optimizer=True"))
        self.words = words


def _constants(spec: dict[str, Any], carried: Collection[str]) -> dict[str, Any]:
    """``spec`` without what the checkpoint carries as a tensor: the lr, and the momentum (beta1)
    where the graphs take it as an input (``scheduled=("momentum",)``)."""
    out = {k: v for k, v in spec.items() if k != "lr"}
    key = momentum_key(spec) if MOMENTUM in carried else None
    if key == "betas" and "betas" in out:
        out["betas"] = list(out["betas"])[1:]
    elif key is not None:
        out.pop(key, None)
    return out


def _changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    return [f"{key} {saved.get(key)!r} (now {now.get(key)!r})" for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key)]


def check_optimizer(path: Any, saved: dict[str, Any], now: dict[str, Any], carried: Collection[str],
                    changed_optimizer: bool = False) -> None:
    """Refuse a checkpoint trained with optimizer spec ``saved`` for graphs of spec ``now`` whose
    kind or constants differ (unless ``changed_optimizer``); warn of a changed spec lr. A
    checkpoint from before the spec was recorded (``saved`` empty) is not checked."""
    if not saved:
        return
    kind, was = now.get("kind"), saved.get("kind")
    if kind != was and not changed_optimizer:
        raise OptimizerChanged(lambda accept: f"{path}: the checkpoint was trained with {was}, these training graphs "
                               f"train with {kind}; resume with artifacts generated with the checkpoint's optimizer "
                               f"({saved}), or pass {accept} where its state fits (torch's load_state_dict into "
                               "another optimizer)")
    changes = _changes(_constants(saved, carried), _constants(now, carried))
    if changes and not changed_optimizer:
        raise OptimizerChanged(lambda accept: f"{path}: the checkpoint's {was} ran with other constants than these "
                               f"training graphs hold: {', '.join(changes)}. torch would resume with the checkpoint's "
                               "(optimizer.load_state_dict restores param_groups), which the graphs cannot take: "
                               f"generate them with the checkpoint's values to resume exactly, or pass {accept} to "
                               "train on with the graphs' (as setting param_groups after load_state_dict)")
    if saved.get("lr") != now.get("lr"):
        warnings.warn(f"{path}: these training graphs were generated with lr {now.get('lr')!r}, the checkpoint's run "
                      f"with {saved.get('lr')!r}: the run resumes with the checkpoint's lr, as torch's "
                      "optimizer.load_state_dict restores it; set trainer.lr after loading to use another",
                      stacklevel=3)


def check_position(then: Optional[LoaderState], now: LoaderState, epoch: int, batch_in_epoch: int) -> None:
    """Refuse to continue epoch ``epoch`` mid-way (``batch_in_epoch`` batches of it done with
    loader settings ``then``) with settings ``now`` that would serve other samples as the rest."""
    if then is None or not batch_in_epoch or batch_in_epoch >= then.batches():
        return
    changed = [f"{field} {getattr(then, field)} (now {getattr(now, field)})" for field in _POSITION_FIELDS
               if getattr(then, field) != getattr(now, field)]
    if changed:
        raise ValueError(f"resuming mid-epoch: the checkpoint's run used {batch_in_epoch} of epoch {epoch + 1}'s "
                         f"batches of {then.batch_size} samples ({batch_in_epoch * then.batch_size} of "
                         f"{then.num_samples}); a loader with {', '.join(changed)} would serve other samples as the "
                         "rest of the epoch (some twice, some never). Finish the epoch with the checkpoint's loader "
                         f"(fit(loader, epochs={epoch + 1})), then fit with the new one")
