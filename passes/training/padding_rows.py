"""An Embedding's ``padding_idx`` in a dynamo export: torch sends its row no gradient (the row
is never trained), but the export is a plain ``Gather``, which autodiff differentiates into
every row read. The exporter records torch's call on the node (``pkg.torch.onnx.fx_node``:
``aten.embedding.default(args = (%p_emb_weight, %ids, 0))``, padding_idx the third argument);
``freeze_padding_rows`` rewrites each such Gather's output ``out`` to
``Where(ids == padding_idx, detach(out), out)``: the same values, no gradient for the rows the
padding index reads. On the output, not the weight, so the cost is the lookup's size, not the
table's. The TorchScript exporter records no padding_idx: its exports train the row."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir

from graphc.passes.training.imports import FX_NODE
from graphc.passes.values import STOP_GRADIENT_KEY, replace_value

_EMBEDDING = re.compile(r"aten\.embedding\.default\]\(args = \(%\w+, %\w+, (-?\d+)")


def padding_index(node: ir.Node) -> int | None:
    """The padding_idx torch's ``embedding`` call behind the Gather ``node`` had, else None."""
    found = _EMBEDDING.search(node.metadata_props.get(FX_NODE, ""))
    return int(found.group(1)) if found and int(found.group(1)) >= 0 else None


def freeze_padding_rows(graph: ir.Graph) -> list[str]:
    """Rewrite (see the module docstring) each top-level Gather of a torch embedding with a
    padding_idx; returns the names of the weights it reads."""
    frozen = []
    for node in list(graph):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or (index := padding_index(node)) is None \
                or node.attributes.get_int("axis", 0) != 0:
            continue
        weight, ids = node.inputs[0], node.inputs[1]
        out = node.outputs[0]
        uses = list(out.uses())  # before the nodes below read it too
        pad = ir.node("Constant", [], {"value": ir.tensor(np.array(index, dtype=ids.dtype.numpy()))})
        hit = ir.node("Equal", [ids, pad.outputs[0]])
        axis = ir.node("Constant", [], {"value": ir.tensor(np.array([-1], dtype=np.int64))})
        rows = ir.node("Unsqueeze", [hit.outputs[0], axis.outputs[0]])
        detached = ir.node("Identity", [out])
        detached.metadata_props[STOP_GRADIENT_KEY] = "true"
        kept = ir.node("Where", [rows.outputs[0], detached.outputs[0], out])
        new = kept.outputs[0]
        new.type, new.shape = out.type, out.shape
        graph.insert_after(node, [pad, hit, axis, rows, detached, kept])
        replace_value(out, new, uses, "embedding")
        frozen.append(weight.name)
    return frozen
