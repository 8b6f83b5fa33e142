"""Regions a ``gc.autograd.Function`` marked: autodiff takes the user's backward there.

``Fn.apply(...)`` in a capture emits the forward's nodes as plain ONNX, each input read through a
``gc.detach`` Identity, and each differentiable output through a stop-gradient Identity (a *marker*)
whose ``AUTOGRAD_KEY`` metadata is a JSON record of the region: ``function``, the name of its backward,
a model-local function of the ``graphc.autograd`` domain that no node calls; ``output``, the marker's
index; ``inputs``, the value each of the function's outputs is the gradient of; ``reads``, the forward
values bound to the function's inputs after one gradient per marker (saved tensors, ctx attributes);
``class`` and ``source``, the Function and the line that applied it.

The driver (``core``) treats a region's markers as one node: a marker's output lies on a gradient path
when one of the region's ``inputs`` does, and the forward's own nodes, cut off by the detaches, get no
gradient (their ops need no rule). At the region's last marker the walk reaches, the backward's body is
copied in, reading each marker's gradient and the bound forward values: the record's ``variants`` (each
``given``, the markers it was captured with gradients for, and its own ``function``, ``inputs``, ``reads``) hold
the backward captured with None for the others, as torch passes for an output the loss does not reach; the
variant whose ``given`` are the markers the gradient reaches is taken, else the region's own backward, reading
zeros for those markers. Gradients of an input passed twice are summed. In a control-flow body the rules walk
copies of the body, whose markers bind the copies' values (``loops.fresh_names``); ``GradBuilder.functions``
holds the backwards for those walks. ``values.drop_autograd_functions``
drops the functions from graphs no pass differentiates again (the training artifacts, inference exports);
a model whose stop-gradient marks ``gc.optimize`` at level 3 dropped (the Functions' and ``gc.detach``'s)
records them in its metadata (``DROPPED_MARKS_KEY``), and ``refuse_dropped`` refuses to differentiate it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from graphc.errors import AutodiffError
from graphc.passes.autodiff.builder import GradBuilder
from graphc.passes.autodiff.loops import clone_body
from graphc.passes.values import (AUTOGRAD_DOMAIN, AUTOGRAD_KEY, DROPPED_MARKS_KEY, INFERENCE_ONLY_KEY,
                                  autograd_function_label)

__all__ = ["Region", "refuse_dropped", "regions"]


def refuse_dropped(model: ir.Model) -> None:
    """``AutodiffError`` for a model ``gc.optimize`` rewrote at level 3 (``INFERENCE_ONLY_KEY``,
    ``DROPPED_MARKS_KEY``), naming the stop-gradient marks it dropped (each Function whose backward went,
    how many others) and the parameters it folded: differentiating it would send gradients through the
    Functions' forwards and past the marks, and give folded parameters wrong gradients or none."""
    record, text = model.metadata_props.get(INFERENCE_ONLY_KEY), model.metadata_props.get(DROPPED_MARKS_KEY)
    if record is None and text is None:
        return
    dropped = json.loads(text or '{"functions": [], "stop_gradients": 0}')
    parts = [f"the backward of gc.autograd.Function {where} (its gradient would be the forward's own ops')"
             for where in dropped["functions"]]
    if count := dropped["stop_gradients"]:
        parts.append(f"{count} stop-gradient mark{'s' * (count != 1)} (gc.detach, gc.no_grad reads, frozen "
                     "parameters' reads, a gc.autograd.Function's arguments, gc.autograd.grad's and "
                     "gc.autograd.functional's results without create_graph=True: gradients would flow through them)")
    done = [f"dropped {' and '.join(parts)}"] if parts else []
    if folded := json.loads(record or "{}").get("folded_parameters"):
        names = ", ".join(map(repr, folded[:5])) + (f" and {len(folded) - 5} more" if len(folded) > 5 else "")
        done.append(f"folded, merged or dropped parameter{'s' * (len(folded) != 1)} {names} (their gradients "
                    "would be wrong or missing)")
    raise AutodiffError(f"model {model.graph.name or 'model'!r} cannot be differentiated: gc.optimize at level 3 "
                        f"(inference only) {' and '.join(done) or 'rewrote it for inference'}; differentiate or "
                        "train the captured model, or one from gc.optimize(model, level=2)")


@dataclass
class Region:
    """One application of a Function: its markers (by output index), the value each gradient goes to,
    and, where the model has it, its backward (None: an error once the walk reaches it)."""

    record: dict
    body: ir.Function | None
    named: Mapping[str, ir.Value]  # the graph's values by name
    markers: dict[int, ir.Node] = field(default_factory=dict)
    inputs: list[ir.Value] = field(default_factory=list)  # the value each body output is the gradient of
    waiting: int = 0  # markers on the gradient path the walk has still to reach
    dys: dict[int, ir.Value] = field(default_factory=dict)
    variants: dict[tuple[int, ...], tuple[dict, ir.Function]] = field(default_factory=dict)  # by ``given``

    @property
    def where(self) -> str:
        return f"gc.autograd.Function {autograd_function_label(self.record)}"

    def bound(self, name: str) -> ir.Value:
        """The graph's value ``name``, or ``AutodiffError`` naming the Function."""
        if name not in self.named:
            raise AutodiffError(f"the backward of {self.where} is bound to the value {name!r}, which this graph "
                                "no longer has (a pass renamed or folded it)")
        return self.named[name]

    def backward(self, g: GradBuilder, marker: ir.Node, dy: ir.Value | None) -> dict[ir.Value, ir.Value] | None:
        """Record ``marker``'s gradient; at the region's last marker on the path, the backward's
        gradients by input value (None before)."""
        if self.body is None:
            raise AutodiffError(
                f"{self.where} lies on the path to the loss, but its backward {self.record['function']!r} is not "
                "in this graph's model: gc.grad, gc.training.generate and the Trainer take it from the captured "
                "model (gc.optimize at level 3 and the training artifacts drop it)")
        index = json.loads(marker.metadata_props[AUTOGRAD_KEY])["output"]
        if dy is not None:
            self.dys[index] = dy
        self.waiting -= 1
        if self.waiting:
            return None
        record, body = self.variants.get(tuple(sorted(self.dys)), (self.record, self.body))
        inputs = self.inputs if record is self.record else [self.bound(name) for name in record["inputs"]]
        reads = [self.bound(name) for name in record["reads"]]
        count = len(body.inputs) - len(reads)
        mapping: dict[ir.Value, ir.Value] = {}
        for j, param in enumerate(body.inputs[:count]):
            mapping[param] = self.dys[j] if j in self.dys else g.zeros_like(self.markers[j].outputs[0])
        mapping.update(zip(body.inputs[count:], reads))
        grads: dict[ir.Value, ir.Value] = {}
        for value, dx in zip(inputs, clone_body(g, body.graph, mapping)):
            grads[value] = g.op("Add", grads[value], dx) if value in grads else dx
        return grads


def regions(nodes: Sequence[ir.Node], functions: Mapping[ir.OperatorIdentifier, ir.Function] | None
            ) -> dict[ir.Node, Region]:
    """Each marker among ``nodes`` mapped to its region: its values found by name in the marker's
    graph, its backward in ``functions``. The copies of one application (a loop body's unrolled
    steps) bind their own values, and where they bind the same (values from outside the body), a
    marker seen again starts the next copy's region."""
    found: dict[tuple, Region] = {}
    out: dict[ir.Node, Region] = {}
    named: dict[str, ir.Value] | None = None
    for node in nodes:
        text = node.metadata_props.get(AUTOGRAD_KEY)
        if text is None:
            continue
        record = json.loads(text)
        key = (record["function"], *record["inputs"], "", *record["reads"])
        region = found.get(key)
        if region is None or record["output"] in region.markers:
            named = _named(node.graph) if named is None else named
            body = (functions or {}).get((AUTOGRAD_DOMAIN, record["function"], ""))
            region = found[key] = Region(record, body, named)
            # without its backward, a region is refused where the walk reaches it (``Region.backward``)
            region.inputs = [region.bound(name) for name in record["inputs"] if body is not None or name in named]
            region.variants = {tuple(v["given"]): (v, variant) for v in record.get("variants", ())
                               if (variant := (functions or {}).get((AUTOGRAD_DOMAIN, v["function"], ""))) is not None}
        region.markers[record["output"]] = node
        out[node] = region
    return out


def _named(graph: ir.Graph | None) -> dict[str, ir.Value]:
    """``graph``'s inputs, initializers, node outputs and the outer values its nodes read (a gc.func
    transform's traced nodes read the inputs it made before them), by name."""
    if graph is None:
        return {}
    values = {v.name: v for node in graph for v in node.inputs if v is not None and v.name}
    values.update((v.name, v) for v in graph.inputs)
    values.update(graph.initializers)
    values.update((v.name, v) for node in graph for v in node.outputs if v.name)
    return values
