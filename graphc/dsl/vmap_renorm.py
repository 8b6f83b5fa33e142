"""An embedding's ``max_norm`` inside a ``gc.vmap`` body, written back as torch's Python loop over the
examples leaves the weights (``torch.func.vmap`` refuses the in-place renormalisation).

* A mapped weight (an ensemble's stacked tables, ``in_dims`` 0): each example's table is its own, so the
  body renormalises it in place as any lookup does (``renorm_in_place``); the body's last value of it is
  one more output, and after the call the outer Tensor is rebound to it, stacked at its ``in_dims``: each
  member's table with its own member's rows renormalised, as a loop over the members leaves them.
* A weight from outside the body (closed over, or ``in_dims`` None): the loop renormalises, one example
  after the other, the rows each looks up in the one table. The body records its lookups
  (``renorm.OuterLookup``), outputs their indices, and after the call the same lookup is made on every
  example's indices, which writes their union back (a row repeated is scaled once, from the same
  value). Exact where the body reads that weight only by lookups with one ``max_norm`` and
  ``norm_type`` (a row renormalised again is unchanged, as for ``passes/training/max_norm_carries.py``);
  any other read, which in torch's loop would see the rows earlier examples renormalised, keeps the
  rows-only lookup, which the training graphs refuse (``renorm.refuse``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from graphc.dsl import ops_nn, renorm
from graphc.dsl.tensor import Tensor
from graphc.passes.values import MAX_NORM_LOOKUP_KEY

__all__ = ["Renormed"]

Place = Callable[[Tensor, bool, int], Tensor]  # a body output, batched or not, placed at a dim


@dataclass
class Renormed:
    """What a traced ``gc.vmap`` body renormalised: ``values``, the body values to output besides the
    function's, and the write-backs ``write_back`` makes of them after the call."""

    values: list[ir.Value]
    _mapped: list[tuple[Tensor, int]]  # (the outer Tensor, its in_dims) of each renormalised mapped weight
    _lookups: list[renorm.OuterLookup]

    @classmethod
    def of(cls, nodes: list[ir.Node], lookups: list[renorm.OuterLookup],
           mapped: list[tuple[Tensor, Tensor, ir.Value, int]]) -> Renormed:
        """From the body's ``nodes``, its ``lookups`` of outer weights and ``mapped`` (the outer Tensor,
        the per-example one ``func`` got, the body input, the mapped dim) of each mapped argument."""
        changed = [(outer, inner, dim) for outer, inner, value, dim in mapped
                   if inner.value is not value and renorm.renormed_param(inner) == value.name]
        exact = [lk for lk in lookups if _only_lookups(nodes, lk.weight.value, lookups)]
        for lk in lookups:
            if lk not in exact:
                renorm.refuse(lk.rows, lk.record)
        return cls([inner.value for _, inner, _ in changed] + [lk.indices.value for lk in exact],
                   [(outer, dim) for outer, _, dim in changed], exact)

    def write_back(self, outs: list[tuple[Tensor, bool]], place: Place, source: str) -> None:
        """After the call: ``outs`` (``values`` as the call made them, batched or not) written back."""
        tables, indices = outs[:len(self._mapped)], outs[len(self._mapped):]
        for (outer, dim), (table, batched) in zip(self._mapped, tables):
            renorm.write_back([place(table, batched, dim)], [renorm.Carried(outer, outer.value, outer.eager_value)],
                              source)
        for lk, (idx, batched) in zip(self._lookups, indices):
            every = place(idx, batched, 0)
            ops_nn.renormed(ops_nn.gather_rows(lk.weight, every, lk.norms), lk.weight, *lk.norms, every,
                            lk.record["at"])


def _only_lookups(nodes: list[ir.Node], weight: ir.Value, lookups: list[renorm.OuterLookup]) -> bool:
    """Whether every read of ``weight`` in the body (``nodes`` and their subgraphs) is a Gather of one of
    ``lookups``, all with the same ``max_norm`` and ``norm_type``."""
    body = {id(n) for n in nodes} | {id(inner) for n in nodes for attr in n.attributes.values()
                                     if isinstance(attr.value, ir.Graph)
                                     for inner in ir.traversal.RecursiveGraphIterator(attr.value)}
    norms = {lk.norms for lk in lookups if lk.weight.value is weight}
    keys = {json.dumps({"max_norm": float(m), "norm_type": float(p)}) for m, p in norms}
    return len(norms) == 1 and all(
        use.op_type == "Gather" and at == 0 and use.metadata_props.get(MAX_NORM_LOOKUP_KEY) in keys
        for use, at in weight.uses() if id(use) in body)
