"""Resuming a checkpoint's params with a fresh optimizer (``Trainer.load_checkpoint(path,
fresh_optimizer=True)``, ``graphc train --resume --fresh-optimizer``): torch's
``model.load_state_dict(checkpoint["model"])`` followed by a new optimizer.

The model's tensors come from the checkpoint: its params and buffers (BatchNorm's running
statistics and ``num_batches_tracked``). The rest of what train_step carries starts as the
training graphs' initial state, as a new optimizer's: step 0, zero moments and momentum buffers,
the graphs' lr, momentum and loss scale. Any optimizer kind or constants may differ.

The trainable set may grow: a param frozen in the checkpoint's run is a constant of its graphs,
not in the checkpoint, and takes the value those graphs hold (beside the checkpoint, or where its
header records them, if their digest is the one it records; else these graphs' value, warned
of). It may not shrink: a param trained in the checkpoint's run that these graphs freeze is
refused, as they hold its initial value as a constant and its trained value would be lost
(``graphc export`` folds the checkpoint's params into a model to generate graphs from).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from graphc.passes.training.artifacts import STEP
from graphc.passes.training.loss_scaling import state_names
from graphc.passes.training.scheduled import running_state
from graphc.runtime.checkpoint import CheckpointError, CheckpointMeta, mismatch
from graphc.runtime.feeds import dtype_name
from graphc.runtime.resume_rules import trained_params

__all__ = ["buffers", "check", "restart"]


def buffers(manifest: Any) -> list[str]:
    """The model's buffers among what ``manifest``'s train_step carries: state that is not the
    optimizer's (a trainable param's ``<param>.<slot>``, the step, scheduled momentum's running
    state) nor loss scaling's."""
    own = {STEP, *running_state(manifest.optimizer), *state_names(manifest.loss_scale)}
    slots = tuple(f"{p}." for p in manifest.trainable)
    return [n for n, e in manifest.carried().items() if e.role == "state" and n not in own and not n.startswith(slots)]


def check(path: Any, meta: CheckpointMeta, table: Mapping[str, tuple[str, list]], manifest: Any) -> None:
    """``CheckpointError`` where a params-only resume from the checkpoint at ``path`` (header
    ``meta``, tensor table ``table``: name -> (dtype name, shape)) into the graphs of ``manifest``
    is refused: another model's checkpoint, a param these graphs freeze that it trained, or a
    tensor of another dtype or shape, naming it. From the header alone: the tensors are not read."""
    model = set(manifest.trainable) | set(manifest.frozen)
    saved = trained_params(table, meta.roles, model)
    other = sorted(saved - model)
    if other:
        raise CheckpointError(f"{path}: the checkpoint has param(s) {', '.join(other)}, which this model lacks; it "
                              "was saved from another model's training graphs")
    now_frozen = sorted(saved & set(manifest.frozen))
    if now_frozen:
        raise CheckpointError(f"{path}: the checkpoint's run trained {', '.join(now_frozen)}, which these training "
                              "graphs freeze: they hold its initial value as a constant, so its trained value would "
                              "be lost. Fold the checkpoint's params into a model (graphc export CHECKPOINT -o "
                              "model.onnx) and generate the training graphs from it with that frozen set")
    expected = manifest.carried()
    present = [n for n in _wanted(manifest) if n in table]
    problem = mismatch({n: expected[n] for n in present}, {n: table[n] for n in present})
    if problem is not None:
        raise CheckpointError(f"{path}: the checkpoint {problem}; it was saved from another model's training graphs")


def restart(path: Any, tensors: Mapping[str, np.ndarray], meta: CheckpointMeta, manifest: Any,
            initial: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The carried tensors (named per param) a params-only resume from the checkpoint at ``path``
    (``tensors``, header ``meta``) starts the graphs of ``manifest`` from: ``initial`` (their
    initial state) with the model's params and buffers from the checkpoint; ``check``'s refusals
    first, and a value frozen in its run that its training graphs hold of another dtype or shape."""
    arrays = {n: np.asarray(a) for n, a in tensors.items()}
    check(path, meta, {n: (dtype_name(a.dtype), list(a.shape)) for n, a in arrays.items()}, manifest)
    wanted = _wanted(manifest)
    picked = {n: arrays[n] for n in wanted if n in arrays}
    missing = [n for n in wanted if n not in picked]
    if missing:
        picked.update(_constants_of(path, meta, missing, manifest.carried()))
    return {**initial, **picked}


def _wanted(manifest: Any) -> list[str]:
    """What a params-only resume takes from the checkpoint: the trainable params and ``buffers``."""
    return [*manifest.trainable, *buffers(manifest)]


def _constants_of(path: Any, meta: CheckpointMeta, names: list[str], expected: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The values of ``names`` (frozen in the checkpoint's run, so not in it) in the checkpoint's
    training graphs, where they are found; a warning names those that are not, which keep these
    graphs' initial values."""
    found = {}
    graphs = _checkpoint_graphs(path, meta)
    if graphs is not None:
        initializers = graphs.inference.ir.graph.initializers
        for name in names:
            value = initializers.get(name)
            if value is not None and value.const_value is not None:
                found[name] = value.const_value.numpy()
    problem = mismatch({n: expected[n] for n in found}, {n: (dtype_name(a.dtype), list(a.shape)) for n, a in found.items()})
    if problem is not None:
        raise CheckpointError(f"{path}: the checkpoint's training graphs hold {problem.removeprefix('holds ')}")
    left = [n for n in names if n not in found]
    if left:
        warnings.warn(f"{path}: the checkpoint holds no {', '.join(left)} (frozen in its run) and its training graphs "
                      "are not beside it nor where its header says (or are not those it was saved with): they start "
                      "from these graphs' values, the same where both were generated from one model", stacklevel=4)
    return found


def _checkpoint_graphs(path: Any, meta: CheckpointMeta) -> Optional[Any]:
    """The training graphs of the checkpoint at ``path``: beside it or where its header says, if
    their manifest's digest and inference graph's structure are the ones it records."""
    from graphc.compile import training
    from graphc.runtime.checkpoint_folder import find_artifacts

    try:
        folder: Optional[Path] = find_artifacts(path)
    except CheckpointError:  # graphs of another model there: these graphs' values, warned of
        return None
    if folder is None or not meta.graphs or training.read_manifest(folder).digest() != meta.graphs:
        return None
    return training.load(folder)
