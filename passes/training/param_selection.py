"""Which float initializers a training run updates: the trainable, frozen and exporter-constant
params (names or glob patterns from ``trainable``/``frozen``/``params``; exporter constants are
``imports.exporter_constants`` and ``export_records.spectral_vectors``; params the loss never reads
left out, as torch.optim skips a param without a gradient, with a warning for one read only in
control flow that never runs), and which of them get weight decay. A pattern also selects a tensor
that a dynamo export folded from one parameter by moving its elements by that parameter's name. The
exact name of a parametrized tensor (``a.weight`` of ``gc.nn.utils.parametrize``) selects the params
it is computed from (``a.parametrizations.weight.original``, or ``original0``, ``original1``, ...);
glob patterns match the params' own names, as torch's ``named_parameters`` gives them."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import NamedTuple

import onnx_ir as ir

from graphc.errors import PassError, first_few
from graphc.passes.autodiff.autograd_functions import regions
from graphc.passes.autodiff.builder import is_float
from graphc.passes.autodiff.core import gradient_inputs, node_inputs
from graphc.passes.autodiff.registry import settings_only
from graphc.passes.training import export_records, guarded_params, imports
from graphc.passes.training.graph_outputs import by_name
from graphc.passes.training.loss_graph import LOSS
from graphc.version import PRODUCER

# a param torch's parametrize keeps a parametrized tensor in: <module>.parametrizations.<tensor>.original[N]
_ORIGINAL = re.compile(r"(?:(.*)\.)?parametrizations\.([^.]+)\.original\d*")
# what cuts a param off from the loss's gradient, as the warnings say it
_STOPS = "gc.detach (an exporter's detach) or an integer or bool value (an argmax, a comparison)"


class Selection(NamedTuple):
    """What ``select`` chose: the ``trainable``, ``frozen`` and exporter-``constants`` ({name: why})
    float initializers, whether each trainable one ``decays``, the ``sources`` of those that a dynamo
    export folded from one parameter by moving its elements ({tensor: parameter}: name patterns
    select them by it too) and ``notes`` on the other folds that a pattern names by a parameter
    ({tensor: text for ``imports.warn_folded_parameters``})."""

    trainable: list[str]
    frozen: list[str]
    constants: dict[str, str]
    decays: dict[str, bool]
    sources: dict[str, str]
    notes: dict[str, str]


def select(model: ir.Model, bn_stats: Sequence[str], trainable, frozen, params, order: dict[str, int],
           no_decay: Sequence[str] = ()) -> Selection:
    """The float initializers to train and keep, in the original model's initializer order.
    ``trainable``, ``frozen``, ``params`` and ``no_decay`` hold names or glob patterns; each also
    selects a tensor folded from one parameter by moving its elements by that parameter's name."""
    graph = model.graph
    candidates = [n for n, v in graph.initializers.items() if imports.is_float(v) and n not in bn_stats]
    candidates.sort(key=lambda n: order.get(n, len(order)))
    folds = imports.dynamo_folds(model, candidates)
    sources = _sources(folds)
    named = {"trainable": trainable or (), "frozen": frozen, "params": params, "no_decay": no_decay}
    named = {option: list(patterns) for option, patterns in named.items()}
    frozen = matching(named["frozen"], candidates, "frozen", folds)
    forced = matching(named["params"], candidates, "params", folds)
    both = [n for n in forced if n in frozen]
    if both:  # frozen had silently won
        raise PassError(f"{both} matched by both frozen= (--freeze) and params= (--param): give each param one of them")
    constants = imports.exporter_constants(model, candidates) | export_records.spectral_vectors(model, candidates)
    constants = {n: why for n, why in constants.items() if n not in forced}
    if trainable is None:
        trainable = [n for n in candidates if n in forced or (
            n not in constants and not settings_only(graph.initializers[n]))]
    else:
        chosen = set(matching(named["trainable"], candidates, "trainable", folds)) | set(forced)
        trainable = [n for n in candidates if n in chosen]
        constants = {n: why for n, why in constants.items() if n not in chosen}
        forced = chosen
    trainable = [n for n in trainable if n not in frozen]
    # a param the loss never reads (or reads only through gc.detach or an integer or bool value) has no gradient:
    # as torch.optim skips a param whose grad is None, it gets no step and no weight decay (it stays in ``frozen``)
    used = loss_inputs(graph)
    unread = [n for n in trainable if graph.initializers[n] not in used]
    # an imported graph's stop-gradients are the exporter's, not the user's code: name the params they cut off
    reached = set() if model.producer_name == PRODUCER else loss_inputs(graph, differentiable=False)
    cut = unread if any(n in forced for n in unread) else [n for n in unread if graph.initializers[n] in reached]
    if cut:
        warnings.warn(f"params {cut} do not reach the loss (or only through {_STOPS}): they have no gradient and "
                      "are not updated (no step, no weight decay, as torch.optim skips a param whose grad is None); "
                      "manifest.frozen lists them", UserWarning, stacklevel=4)
    trainable = [n for n in trainable if n not in unread]
    # read only inside control flow no step runs (a constant-false gc.cond branch, a loop of 0 trips): the
    # same, but a graph that reads a param there was meant to train it, so say so whether named or not
    idle = guarded_params.never_read(graph, by_name(graph, LOSS), trainable)
    if idle:
        warnings.warn(f"params {idle} are read only inside control flow that never runs (an If branch its constant "
                      "condition never takes, a Loop of 0 trips, a Scan of length 0) or, where it runs, only through "
                      f"{_STOPS}: they have no gradient on any step and are not updated, as torch.optim skips a "
                      "param whose grad is None; manifest.frozen lists them", UserWarning, stacklevel=4)
    trainable = [n for n in trainable if n not in idle]
    if not trainable:
        raise PassError("no trainable parameters: every float initializer is frozen, an exporter constant or does "
                        "not reach the loss")
    notes = _unselected_folds(named, folds)
    unwarned = [f"{n!r} ({folds[n]}){note}" for n, note in notes.items() if not folds[n].warned]
    if unwarned:
        warnings.warn(f"patterns name parameters that the exporter folded with others into one tensor, which they do "
                      f"not select: {'; '.join(unwarned)}. Name the tensor itself to select it", UserWarning, stacklevel=4)
    return Selection(trainable, [n for n in candidates if n not in trainable and n not in constants], constants,
                     decays(trainable, named["no_decay"], sources), sources, notes)


def _unselected_folds(named: dict[str, list[str]], folds: dict[str, imports.Fold]) -> dict[str, str]:
    """{tensor: "; frozen= 'gate*' names gate, not this tensor"} for each fold, other than an element
    move of one parameter, one of whose parameters a pattern of an option (``named``) names and
    the tensor's own name does not."""
    notes = {}
    for name, fold in ((n, f) for n, f in folds.items() if not f.moved):
        said = [f"{option}= {pat!r} names {', '.join(p for p in fold.params if _named(p, pat))}"
                for option, patterns in named.items() for pat in patterns
                if any(_named(p, pat) for p in fold.params) and not _named(name, pat)]
        if said:
            notes[name] = f"; {', '.join(said)}, not this tensor"
    return notes


def parametrized(names: Iterable[str]) -> dict[str, list[str]]:
    """{parametrized tensor: its params among ``names``}: ``a.weight`` for
    ``a.parametrizations.weight.original0`` and ``original1``."""
    out: dict[str, list[str]] = {}
    for name in names:
        found = _ORIGINAL.fullmatch(name)
        if found:
            out.setdefault(".".join(p for p in found.groups() if p), []).append(name)
    return out


def _picked(patterns: Iterable[str], names: Sequence[str], sources: Mapping[str, str]) -> dict[str, list[str]]:
    """{pattern: the ``names`` it selects}: by name or source (``_selects``), else, for the exact name of a
    parametrized tensor, its params."""
    aliases = parametrized(names)
    return {pat: [n for n in names if _selects(n, pat, sources)] or aliases.get(pat, []) for pat in patterns}


def _parametrized_note(patterns: Iterable[str], names: Sequence[str]) -> str:
    """"; a.weight is parametrized: its params are a.parametrizations.weight.original" for each
    parametrized tensor of ``names`` a pattern names (by a glob: only its exact name selects them)."""
    return "".join(f"; {tensor} is parametrized: its params are {', '.join(params)}"
                   for tensor, params in parametrized(names).items() if any(_named(tensor, p) for p in patterns))


def _named(name: str, pattern: str) -> bool:
    return name == pattern or fnmatchcase(name, pattern)


def _selects(name: str, pattern: str, sources: Mapping[str, str]) -> bool:
    """Whether ``pattern`` names the tensor ``name`` or the parameter it was folded from (``sources``)."""
    return _named(name, pattern) or (name in sources and _named(sources[name], pattern))


def _sources(folds: Mapping[str, imports.Fold]) -> dict[str, str]:
    """{tensor: parameter} for the ``folds`` that only move one parameter's elements."""
    return {n: fold.params[0] for n, fold in folds.items() if fold.moved}


def _label(name: str, sources: Mapping[str, str], folds: Mapping[str, imports.Fold] = {}) -> str:
    """``name`` as messages show it: ``view (fc1.bias, reshaped)`` for a folded tensor."""
    fold = folds.get(name)
    return f"{name} ({fold})" if fold is not None else f"{name} ({sources[name]})" if name in sources else name


def matching(patterns: Iterable[str], candidates: Sequence[str], option: str,
             folds: Mapping[str, imports.Fold] = {}) -> list[str]:
    """The candidates each name or glob pattern (``fnmatch``: ``*.bias``) selects, by their names or,
    for a tensor folded from one parameter by moving its elements (``folds``), by that one's; one
    that selects none is an error naming the option (and any fold that holds the parameter it names)."""
    patterns = list(patterns)
    sources = _sources(folds)
    picked = _picked(patterns, candidates, sources)
    unknown = [pat for pat, names in picked.items() if not names]
    if unknown:
        shown = first_few([_label(n, sources, folds) for n in candidates], 12, more=", ...")
        held = [f"{pat!r} names a parameter folded into {n!r} ({fold}): name that tensor to select it"
                for pat in unknown for n, fold in folds.items() if any(_named(p, pat) for p in fold.params)]
        raise PassError(f"{option}: unknown parameter(s) {unknown}; float initializers of the model: {shown}"
                        + "".join(f"; {h}" for h in held) + _parametrized_note(unknown, candidates))
    return [n for n in candidates if any(n in names for names in picked.values())]


def loss_inputs(graph: ir.Graph, differentiable: bool = True) -> set[ir.Value]:
    """The values the loss reads; ``differentiable``: only those it reads with a gradient, float
    ones (``is_float``: an integer or bool value, an argmax or a comparison, carries none, as in
    torch) not through a ``gc.detach`` and, through a ``gc.autograd.Function``'s outputs, the
    arguments its backward returns gradients for (``gradient_inputs``)."""
    needed = {by_name(graph, LOSS)}
    nodes = list(graph)
    marked = regions(nodes, None) if differentiable else {}
    for node in reversed(nodes):
        if any(v in needed for v in node.outputs):
            reads = gradient_inputs(node, marked) if differentiable else node_inputs(node)
            needed.update(v for v in reads if is_float(v) or not differentiable)
    return needed


def decays(params: Sequence[str], no_decay: Sequence[str], sources: Mapping[str, str] = {}) -> dict[str, bool]:
    """Whether each param gets weight decay: not when a ``no_decay`` pattern matches its name or,
    for a tensor folded from one parameter by moving its elements, that one's (``sources``)."""
    picked = _picked(no_decay, params, sources)
    unmatched = [pat for pat, names in picked.items() if not names]
    if unmatched:
        raise PassError(f"no_decay pattern(s) {unmatched} match no trainable param "
                        f"(params: {first_few([_label(p, sources) for p in params], 8, more=', ...')})"
                        + _parametrized_note(unmatched, params))
    return {p: not any(p in names for names in picked.values()) for p in params}
