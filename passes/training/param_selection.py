"""Which float initializers a training run updates: the trainable, frozen and exporter-constant
params (names or glob patterns from ``trainable``/``frozen``/``params``, params the loss never reads
left out, as torch.optim skips a param without a gradient, with a warning for one read only in
control flow that never runs), and which of them get weight decay."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.autodiff.core import node_inputs
from graphc.passes.autodiff.registry import settings_only
from graphc.passes.training import guarded_params, imports
from graphc.passes.training.graph_outputs import by_name
from graphc.passes.training.loss_graph import LOSS
from graphc.passes.values import stops_gradient


def select(model: ir.Model, bn_stats: Sequence[str], trainable, frozen, params,
                   order: dict[str, int]) -> tuple[list[str], list[str], dict[str, str]]:
    """(trainable, frozen, {exporter constant: why}) float initializers, in the original model's
    initializer order. ``trainable``, ``frozen`` and ``params`` hold names or glob patterns."""
    graph = model.graph
    candidates = [n for n, v in graph.initializers.items() if imports.is_float(v) and n not in bn_stats]
    candidates.sort(key=lambda n: order.get(n, len(order)))
    frozen, forced = matching(frozen, candidates, "frozen"), matching(params, candidates, "params")
    both = [n for n in forced if n in frozen]
    if both:  # frozen had silently won
        raise PassError(f"{both} matched by both frozen= (--freeze) and params= (--param): give each param one of them")
    constants = {n: why for n, why in imports.exporter_constants(model, candidates).items() if n not in forced}
    if trainable is None:
        trainable = [n for n in candidates if n in forced or (
            n not in constants and not settings_only(graph.initializers[n]))]
    else:
        chosen = set(matching(trainable, candidates, "trainable")) | set(forced)
        trainable = [n for n in candidates if n in chosen]
        constants = {n: why for n, why in constants.items() if n not in chosen}
        forced = chosen
    trainable = [n for n in trainable if n not in frozen]
    # a param the loss never reads (or reads only through gc.detach) has no gradient: as
    # torch.optim skips a param whose grad is None, it gets no step and no weight decay (it stays in ``frozen``)
    used = loss_inputs(graph)
    unread = [n for n in trainable if graph.initializers[n] not in used]
    if any(n in forced for n in unread):
        warnings.warn(f"params {unread} do not reach the loss (or only through gc.detach): they have no gradient and "
                      "are not updated (no step, no weight decay, as torch.optim skips a param whose grad is None); "
                      "manifest.frozen lists them",
                      UserWarning, stacklevel=4)
    trainable = [n for n in trainable if n not in unread]
    # read only inside control flow no step runs (a constant-false gc.cond branch, a loop of 0 trips): the
    # same, but a graph that reads a param there was meant to train it, so say so whether named or not
    idle = guarded_params.never_read(graph, by_name(graph, LOSS), trainable)
    if idle:
        warnings.warn(f"params {idle} are read only inside control flow that never runs (an If branch its constant "
                      "condition never takes, a Loop of 0 trips, a Scan of length 0) or there only through gc.detach: "
                      "they have no gradient on any step and are not updated, as torch.optim skips a param whose "
                      "grad is None; manifest.frozen lists them", UserWarning, stacklevel=4)
    trainable = [n for n in trainable if n not in idle]
    if not trainable:
        raise PassError("no trainable parameters: every float initializer is frozen, an exporter constant or does "
                        "not reach the loss")
    return trainable, [n for n in candidates if n not in trainable and n not in constants], constants


def matching(patterns: Iterable[str], candidates: Sequence[str], option: str) -> list[str]:
    """The candidates each name or glob pattern (``fnmatch``: ``*.bias``) selects; one that
    selects none is an error naming the option."""
    patterns = list(patterns)
    picked = {pat: [n for n in candidates if n == pat or fnmatchcase(n, pat)] for pat in patterns}
    unknown = [pat for pat, names in picked.items() if not names]
    if unknown:
        shown = ", ".join(candidates[:12]) + (", ..." if len(candidates) > 12 else "")
        raise PassError(f"{option}: unknown parameter(s) {unknown}; float initializers of the model: {shown}")
    return [n for n in candidates if any(n in names for names in picked.values())]


def loss_inputs(graph: ir.Graph) -> set[ir.Value]:
    """The values the loss reads differentiably: not through a ``gc.detach`` (``stops_gradient``)."""
    needed = {by_name(graph, LOSS)}
    for node in reversed(list(graph)):
        if not stops_gradient(node) and any(v in needed for v in node.outputs):
            needed.update(node_inputs(node))
    return needed


def decays(params: Sequence[str], no_decay: Sequence[str]) -> dict[str, bool]:
    """Whether each param gets weight decay: not when a ``no_decay`` pattern matches its name."""
    unmatched = [pat for pat in no_decay if not any(fnmatchcase(p, pat) for p in params)]
    if unmatched:
        shown = ", ".join(params[:8]) + (", ..." if len(params) > 8 else "")
        raise PassError(f"no_decay pattern(s) {unmatched} match no trainable param (params: {shown})")
    return {p: not any(fnmatchcase(p, pat) for pat in no_decay) for p in params}
