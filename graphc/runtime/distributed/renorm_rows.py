"""Data-parallel training of params an embedding with ``max_norm`` renormalises in place
(``manifest.renormed``), as one process on the whole batch: before each step every worker reports the rows
each write-back looks up in its shard (the ``renorm_rows`` graph), and each worker's gradients graph
renormalises and writes back their union (``passes/training/max_norm_shards.py``): the forward, a tied
layer included, reads the weight one process does, and the update steps each such param from its
``<param>.renormed`` value, which rank 0's gradients carry (as its BatchNorm statistics). ``evaluate`` and
``predict`` do the same with the eval graph (``EVAL_ROWS``), so a tied layer there reads every row the whole
batch looks up renormalised, as one process does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graphc.errors import ArtifactsError
from graphc.passes.training.max_norm_branches import WHOLE
from graphc.passes.training.max_norm_shards import RENORMED, sharded
from graphc.passes.training.max_norm_steps import STEPS

__all__ = ["EVAL_ROWS", "RENORMED", "ROWS", "union", "worker_graphs"]

ROWS = "renorm_rows"  # the workers' graphs: shard -> the flat indices of each write-back, in graph order
EVAL_ROWS = "eval_renorm_rows"  # the same for the eval graph's write-backs

BATCH = ("data", "label")  # the inputs a shard holds that the rows may read


def worker_graphs(graphs: Mapping, manifest) -> dict:
    """``{"gradients": ..., ROWS: ..., "eval": ..., EVAL_ROWS: ...}`` as ``gc.Model``s where
    ``manifest.renormed`` names params (``graphs``' workers' gradients and eval models made at the union
    of the shards' rows, each with its rows graph), else ``{}``."""
    from graphc.model import Model

    if not manifest.renormed:
        return {}
    out = {}
    for key, rows in (("gradients", ROWS), ("eval", EVAL_ROWS)):
        data = [e.name for e in manifest.graphs[key].inputs if e.role in BATCH]
        made = sharded(graphs[key].ir, manifest.renormed, data, renormed=key == "gradients")
        out.update({key: Model(made.graph), rows: Model(made.rows)})
    return out


def union(shards: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each write-back's rows over every shard that has any (``shards``: the workers' ``renorm_rows``
    outputs in rank order, an empty dict for an empty shard), sorted, each row once: the same on every
    worker. A loop body's (``<flat>.steps``) per iteration (``_steps``); a batch input a gc.cond's predicate
    reads (``<input>.whole``), the shards' joined in rank order: the whole batch."""
    given = [s for s in shards if s]
    return {name: _steps(name, [s[name] for s in given]) if name.endswith(STEPS)
            else np.concatenate([s[name] for s in given]) if name.endswith(WHOLE)
            else np.unique(np.concatenate([s[name].reshape(-1) for s in given])) for name in given[0]}


def _steps(name: str, parts: Sequence[np.ndarray]) -> np.ndarray:
    """The rows a loop body's write-back looks up at each iteration over all ``parts`` (each shard's
    [steps, k, 1]), sorted, each once, padded with -1 to [steps, rows]: an error where the shards' loops
    ran different numbers of iterations (the workers could not agree on an iteration's rows)."""
    steps = sorted({len(p) for p in parts})
    if len(steps) > 1:
        raise ArtifactsError(f"the loop body's embedding with max_norm ({name!r}) ran {steps} iterations on the "
                             "workers' shards: the workers renormalise at each iteration the rows the whole batch "
                             "looks up there, so every shard must run the same iterations (a trip count that follows "
                             "the shard's rows does not); train with one worker")
    rows = [np.unique(np.concatenate([p[t].reshape(-1) for p in parts])) for t in range(steps[0])]
    out = np.full((steps[0], max((len(r) for r in rows), default=0)), -1, np.int64)
    for t, r in enumerate(rows):
        out[t, :len(r)] = r
    return out
