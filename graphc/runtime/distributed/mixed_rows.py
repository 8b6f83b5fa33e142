"""The warning ``gc.Trainer(workers=N)`` and ``gc.distributed.map_batches`` give for a forward that
mixes the batch's rows (``passes/training/row_mixing.py``): each worker computes such a node on its
shard (or batch) alone, so the step is not one process's on the whole batch, nor the outputs one
``gc.Session``'s on all the rows. A warning, not a refusal: the analysis is conservative, and a node
it cannot follow may well keep rows apart."""

from __future__ import annotations

import warnings
from collections.abc import Collection

from graphc.errors import DataParallelWarning, first_few
from graphc.model import node_source
from graphc.passes.training.row_mixing import Mixing, mixing_nodes

__all__ = ["warn_mixed_batches", "warn_mixed_rows"]

SHOWN = 3  # nodes a warning names; it counts the others


def warn_mixed_rows(eval_model, manifest, rows: Collection[str], workers: int) -> list[Mixing]:
    """Warn (one ``DataParallelWarning``, one line) when the eval graph's forward to the loss's
    model output mixes the rows of the inputs split by rows (``rows``, their axis 0); returns the
    nodes found. Nothing with one worker or a loss that reads no model output."""
    output = manifest.loss.get("output")
    if workers < 2 or manifest.loss.get("kind") == "output" or output is None:
        return []
    batched = {e.name: 0 for e in manifest.graphs["eval"].inputs if e.name in rows}
    found = mixing_nodes(eval_model.ir.graph, batched, output)
    _warn(found, f"gc.Trainer(workers={workers}): the model's forward may mix the batch's rows",
          "each worker computes it on its own shard, so a step may differ from one process's on the whole batch")
    return found


def warn_mixed_batches(model, rows: Collection[str]) -> list[Mixing]:
    """``map_batches``'s warning, as ``warn_mixed_rows``'s, for the nodes that compute any output of
    ``model`` (a ``gc.Model``) and mix the rows of the inputs cut into batches (``rows``, axis 0)."""
    found: dict[str, Mixing] = {}
    for spec in model.outputs:
        for m in mixing_nodes(model.ir.graph, {name: 0 for name in rows}, spec.name):
            found.setdefault(m.node.name, m)
    _warn(list(found.values()), "gc.distributed.map_batches: the model's forward may mix the rows of a batch",
          "each batch is computed alone, so the outputs may differ from one gc.Session's on all the rows")
    return list(found.values())


def _warn(found: list[Mixing], head: str, consequence: str) -> None:
    """One ``DataParallelWarning`` line naming the first few ``found`` nodes, if any."""
    if found:
        named = first_few([_describe(m) for m in found], SHOWN, "; ", " (and {} more nodes)")
        warnings.warn(DataParallelWarning(f"{head}: {named}; {consequence} (harmless where the node keeps rows "
                                          "apart after all)"), stacklevel=4)


def _describe(m: Mixing) -> str:
    source = node_source(m.node)
    return f"node {m.node.name!r} ({m.node.op_type}{', ' + source if source else ''}): {m.why}"
