"""The slices an unrolled loop reads one step at a time, taken by one Split per value.

Step t of an unrolled Scan reads slice t of each scanned input, and a Loop body often reads
``x[i]`` of an outer ``x`` at its iteration number. Read by a Gather per step, each step's
gradient would scatter into zeros of the whole of ``x``, and the steps' sum of them would be
quadratic in the length; one Split's gradient is one Concat of the slices' gradients.
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, folded_array, static_shape
from graphc.passes.emit import Emitter


class StepSlices:
    """The slices of values along an axis, each value split once (on first read) by ``e``;
    Gathers are read this way only along axes no longer than ``steps``."""

    def __init__(self, e: Emitter, steps: int):
        self.e, self.steps = e, steps
        self.parts: dict[tuple[ir.Value, int], tuple[ir.Value, ...]] = {}

    def read(self, x: ir.Value, axis: int, position: int) -> ir.Value:
        """Slice ``position`` of ``x`` along ``axis`` (a static dim), that axis dropped."""
        if (x, axis) not in self.parts:
            dim = static_shape(x)[axis]
            self.parts[(x, axis)] = self.e.split(x, [1] * dim, axis, dim)
        return self.e.squeeze(self.parts[(x, axis)][position], [axis])

    def copy_gather(self, node: ir.Node, mapping: dict[ir.Value, ir.Value]) -> bool:
        """Copy ``node`` as a ``read`` (its output mapped to the slice) when it is a Gather of an
        outer value (not in ``mapping``) at one position the constants decide, along a static axis
        no longer than ``steps``; False, copying nothing, for any other node."""
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[0] in mapping:
            return False
        x, shape = node.inputs[0], static_shape(node.inputs[0])
        index = folded_array(mapping.get(node.inputs[1], node.inputs[1]))
        if not shape or index is None or index.ndim != 0:
            return False
        axis = attr(node, "axis", 0) % len(shape)
        dim = shape[axis]
        if not isinstance(dim, int) or dim > self.steps or not -dim <= int(index) < dim:
            return False
        out = self.read(x, axis, int(index) % dim)
        out.type, out.shape = node.outputs[0].type, node.outputs[0].shape
        mapping[node.outputs[0]] = out
        return True
