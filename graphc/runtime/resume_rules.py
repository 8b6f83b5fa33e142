"""What a resume may change, and what it refuses: a checkpoint records the optimizer spec it
was trained with and the loader settings; ``Trainer.load_checkpoint`` and ``fit`` compare them
with what the resumed run is given, so a changed setting does what torch would do with it, or
fails naming the change before any step, never trains silently on something else.

- lr: the checkpoint's, as torch's ``optimizer.load_state_dict`` restores ``param_groups``; a
  spec lr that differs from the recorded one is warned about (``LrChanged``: set ``trainer.lr``
  to use it; ``graphc train`` has no lr option, its words say so).
- the optimizer's kind and its constants (weight decay, betas, eps, momentum, ...): the training
  graphs hold them, so they cannot take the checkpoint's as torch's param groups would: a
  difference is a ``CheckpointError`` naming each, unless ``changed_optimizer=True`` asks for
  the graphs' values (torch: setting ``param_groups`` after ``load_state_dict``).
  Where the graphs' optimizer keeps other state than the checkpoint's (Adam -> SGD, SGD's
  momentum 0 -> 0.9) nothing carries over: a ``CheckpointError`` names both (``check_state_fits``).
- the trainable set: a param moved between trained and frozen is a ``CheckpointError`` naming
  each move and the set to generate the graphs with; torch would go on (a newly trained param's
  state starting fresh, a newly frozen one keeping its trained value), which the graphs cannot:
  they hold a frozen param's initial value as a constant, and Adam's step count is one for all
  (per param only for params gated by a data-dependent branch). The refusal names the
  params-only resume (``fresh_optimizer=True``, ``graphc.runtime.params_only``) as the way on.
- gradient accumulation (``accumulate=k``, micro-batches per optimizer step): another k makes
  each step average other batches, the steps per epoch (and a per-step lr schedule) another
  count, a mid-epoch position fall in other groups; torch would go on, as another run. A
  ``CheckpointError`` names both k (a checkpoint from before k was kept ran with 1), the k to
  resume with and the params-only resume (``AccumulateChanged``).
- the loader mid-epoch: another batch size, seed, shuffle or sample count would cover the rest
  of the epoch with other samples (some twice, some never), another drop_last with other batches,
  other data of the same length (the loaders' fingerprints) with other values: refused until the
  epoch's end.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection
from typing import Any, Optional

from graphc.passes.training.adam_moments import sum_name
from graphc.passes.training.scheduled import MOMENTUM, momentum_key
from graphc.runtime.checkpoint import CheckpointError, LoaderState

__all__ = ["AccumulateChanged", "LrChanged", "OptimizerChanged", "StateChanged", "check_accumulate", "check_position",
           "check_resume", "check_state_fits", "check_trainable",
           "loader_changes", "refuse_optimizer"]

# loader settings whose change mid-epoch changes which samples the rest of the epoch holds
_POSITION_FIELDS = ("seed", "batch_size", "shuffle", "num_samples")


class OptimizerChanged(CheckpointError):
    """A checkpoint trained with another optimizer kind or constants than the training graphs';
    ``words(accept, fresh)`` is the message naming ``accept`` as the way to train on regardless
    (Python's ``changed_optimizer=True``, the CLI's ``--changed-optimizer``) and ``fresh`` as the
    way to take its params only (``fresh_optimizer=True``, ``--fresh-optimizer``)."""

    def __init__(self, words: Callable[[str, str], str]):
        super().__init__(words("changed_optimizer=True", "fresh_optimizer=True"))
        self.words = words


class StateChanged(CheckpointError):
    """A checkpoint whose optimizer state cannot carry over to the training graphs (another
    trainable set, an optimizer that keeps other state); ``words(fresh)`` is the message naming
    ``fresh`` as the way to take its params with a fresh optimizer (Python's
    ``fresh_optimizer=True``, the CLI's ``--fresh-optimizer``)."""

    def __init__(self, words: Callable[[str], str]):
        super().__init__(words("fresh_optimizer=True"))
        self.words = words


class AccumulateChanged(CheckpointError):
    """A checkpoint of a run that stepped the optimizer once per ``saved`` micro-batches, resumed
    with ``now``; ``words(accumulate, fresh)`` is the message naming ``accumulate`` (followed by
    ``saved``) as the way to resume it exactly (Python's ``accumulate=``, the CLI's
    ``--accumulate ``) and ``fresh`` as the way to take its params only."""

    def __init__(self, saved: int, now: int, words: Callable[[str, str], str]):
        super().__init__(words("accumulate=", "fresh_optimizer=True"))
        self.saved, self.now, self.words = saved, now, words


class LrChanged(UserWarning):
    """A checkpoint whose run's lr differs from the one the training graphs were generated with;
    ``words(how)`` is the message naming ``how`` to train at the graphs' lr instead."""

    def __init__(self, words: Callable[[str], str]):
        super().__init__(words("set trainer.lr after loading to use another"))
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


def refuse_optimizer(path: Any, saved: dict[str, Any], now: dict[str, Any], carried: Collection[str],
                     changed_optimizer: bool = False) -> None:
    """``OptimizerChanged`` for a checkpoint trained with optimizer spec ``saved`` on graphs of
    spec ``now`` whose kind or constants differ (unless ``changed_optimizer``). A checkpoint from
    before the spec was recorded (``saved`` empty) is not checked."""
    if not saved:
        return
    kind, was = now.get("kind"), saved.get("kind")
    if kind != was and not changed_optimizer:
        raise OptimizerChanged(lambda accept, fresh: f"{path}: the checkpoint was trained with {was}, these training "
                               f"graphs train with {kind}; resume with artifacts generated with the checkpoint's "
                               f"optimizer ({saved}), or pass {accept} where its state fits (torch's load_state_dict "
                               f"into another optimizer), or {fresh} to take its params with a fresh optimizer")
    changes = _changes(_constants(saved, carried), _constants(now, carried))
    if changes and not changed_optimizer:
        raise OptimizerChanged(lambda accept, fresh: f"{path}: the checkpoint's {was} ran with other constants than "
                               f"these training graphs hold: {', '.join(changes)}. torch would resume with the "
                               "checkpoint's (optimizer.load_state_dict restores param_groups), which the graphs cannot "
                               f"take: generate them with the checkpoint's values to resume exactly, or pass {accept} "
                               "to train on with the graphs' (as setting param_groups after load_state_dict), or "
                               f"{fresh} to take its params with a fresh optimizer")


def _slots(names: Collection[str]) -> str:
    """The optimizer-state slots (``fc1.weight.exp_avg`` -> ``exp_avg``) of ``names``."""
    return ", ".join(sorted({name.rsplit(".", 1)[-1] for name in names})) or "none"


def check_state_fits(path: Any, saved: dict[str, Any], now: dict[str, Any], roles: dict[str, str],
                     expected: dict[str, Any]) -> None:
    """Refuse a checkpoint trained with optimizer spec ``saved`` (its tensors' ``roles``) whose
    optimizer state is not the state the graphs' optimizer ``now`` keeps (``expected``: their
    carried entries), as after Adam -> SGD with ``changed_optimizer``: naming both, where the
    tensors' check would call it another model's."""
    if not saved or saved == now:
        return
    theirs = {name for name, role in roles.items() if role == "state"} - set(expected)
    ours = {name for name, entry in expected.items() if entry.role == "state"} - set(roles)
    if not (theirs or ours):
        return
    raise StateChanged(lambda fresh: f"{path}: the checkpoint's {saved.get('kind')} state ({_slots(theirs)}) does "
                       f"not fit the optimizer state these training graphs' {now.get('kind')} keeps ({_slots(ours)}): "
                       "the optimizer state carries over only to an optimizer that keeps the same (Adam <-> AdamW, "
                       "other constants). Resume with artifacts generated with the checkpoint's optimizer "
                       f"({saved}), or pass {fresh} to take its params with a fresh optimizer (torch's "
                       "model.load_state_dict and a new optimizer)")


def trained_params(saved: Collection[str], roles: dict[str, str], model: set[str]) -> set[str]:
    """The params a checkpoint holding tensors ``saved`` trained: those ``roles`` records as params,
    or (a checkpoint from before roles were kept) its tensors among ``model``'s params."""
    return {n for n in saved if roles.get(n) == "param"} if roles else set(saved) & model


def check_trainable(path: Any, saved: Collection[str], roles: dict[str, str], trainable: Collection[str],
                    frozen: Collection[str]) -> None:
    """Refuse a checkpoint holding tensors ``saved`` (``roles``: name -> role where recorded) for
    graphs that train ``trainable`` and freeze ``frozen`` params of the same model, where the two
    runs trained other sets of them, naming the params that moved each way."""
    model = set(trainable) | set(frozen)
    params = trained_params(saved, roles, model)
    if not params or not params <= model:  # another model's tensors: ``checkpoint.mismatch`` names them
        return
    now_frozen, now_trained = sorted(params & set(frozen)), sorted(set(trainable) - params)
    if not (now_frozen or now_trained):
        return
    moves = ([f"trained in the checkpoint's run, frozen here: {', '.join(now_frozen)}"] if now_frozen else []) + (
        [f"frozen in the checkpoint's run, trained here: {', '.join(now_trained)}"] if now_trained else [])
    was_frozen = sorted((set(frozen) - set(now_frozen)) | set(now_trained))
    raise StateChanged(lambda fresh: f"{path}: the trainable/frozen set changed ({'; '.join(moves)}). torch would go "
                       "on, a newly trained param's optimizer state starting fresh and a newly frozen one keeping its "
                       "trained value; these graphs cannot: they hold a frozen param's initial value as a constant, "
                       "and the optimizer's step count is one for every param. Generate the training graphs with the "
                       f"checkpoint's set, frozen={was_frozen!r} (graphc grad --freeze), to resume"
                       + ("" if now_frozen else f", or pass {fresh} to take its params with a fresh optimizer"))


def check_accumulate(path: Any, saved: Optional[int], now: int) -> None:
    """Refuse resuming a checkpoint whose run took ``saved`` micro-batches per optimizer step
    (None: from before it was kept, 1) with ``now`` (``AccumulateChanged``)."""
    saved = 1 if saved is None else saved
    if saved == now:
        return
    raise AccumulateChanged(saved, now, lambda accumulate, fresh: (
        f"{path}: the checkpoint's run stepped the optimizer once per {saved} micro-batch{'es' * (saved > 1)} "
        f"(accumulate={saved}), this one would once per {now} (accumulate={now}): each step would average other "
        "batches, an epoch hold another number of steps (and of per-step lr schedule steps), and the run would not "
        f"go on as it was. Resume with {accumulate}{saved} to continue it exactly, or pass {fresh} to take its params "
        f"into a new run (step 0) with {accumulate}{now}"))


def check_resume(path: Any, meta: Any, tensors: Collection[str], manifest: Any, expected: dict[str, Any],
                 changed_optimizer: bool = False, warn_lr: bool = True, accumulate: int = 1) -> None:
    """Refuse resuming from a checkpoint (``meta``: its ``CheckpointMeta``, holding ``tensors``)
    on the training graphs of ``manifest`` (``expected``: their carried entries) with another
    ``accumulate`` (``check_accumulate``), or trained with another optimizer
    (``refuse_optimizer``; a changed lr warned of unless not ``warn_lr``), trainable set
    (``check_trainable``) or optimizer state (``check_state_fits``, the checkpoint's moments by
    today's names), in that order."""
    check_accumulate(path, meta.accumulate, accumulate)
    saved, now = meta.optimizer, manifest.optimizer
    refuse_optimizer(path, saved, now, expected, changed_optimizer)
    if warn_lr and saved and saved.get("lr") != now.get("lr"):
        warnings.warn(LrChanged(lambda how: f"{path}: these training graphs were generated with lr {now.get('lr')!r}, "
                                f"the checkpoint's run with {saved.get('lr')!r}: the run resumes with the checkpoint's "
                                f"lr, as torch's optimizer.load_state_dict restores it; {how}"), stacklevel=3)
    check_trainable(path, tensors, meta.roles, manifest.trainable, manifest.frozen)
    check_state_fits(path, saved, now, {sum_name(n, expected): r for n, r in meta.roles.items()}, expected)


def loader_changes(then: LoaderState, now: LoaderState) -> list[str]:
    """How loader settings ``now`` differ from the run's ``then``, each as ``field old (now new)``:
    ``drop_last`` where it changes the epoch's batches (a partial last one), other data of the
    same length by the loaders' fingerprints (a digest of sampled rows: cheap at any size)."""
    changed = [f"{field} {getattr(then, field)} (now {getattr(now, field)})" for field in _POSITION_FIELDS
               if getattr(then, field) != getattr(now, field)]
    if then.drop_last != now.drop_last and then.num_samples % then.batch_size:
        changed.append(f"drop_last {then.drop_last} (now {now.drop_last})")
    if then.num_samples == now.num_samples and then.data and now.data and then.data != now.data:
        changed.append("other data (arrays of the same length whose values differ)")
    return changed


def check_position(then: Optional[LoaderState], changed: list[str], epoch: int, batch_in_epoch: int) -> None:
    """Refuse to continue epoch ``epoch`` mid-way (``batch_in_epoch`` batches of it done with
    loader settings ``then``) with settings that differ as ``changed`` (``loader_changes``: they
    would serve other batches as the rest)."""
    if then is None or not batch_in_epoch or batch_in_epoch >= then.batches():
        return
    if changed:
        raise ValueError(f"resuming mid-epoch: the checkpoint's run used {batch_in_epoch} of epoch {epoch + 1}'s "
                         f"batches of {then.batch_size} samples ({batch_in_epoch * then.batch_size} of "
                         f"{then.num_samples}); a loader with {', '.join(changed)} would serve other batches as the "
                         "rest of the epoch (other samples, some twice, some never, or other values). Finish the "
                         f"epoch with the checkpoint's loader (fit(loader, epochs={epoch + 1})), then fit with the "
                         "new one")
