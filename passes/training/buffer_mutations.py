"""A dynamo export's buffer mutations as training state.

torch.export functionalises a forward that writes a module buffer in place (an EMA's
``self.ema.mul_(0.9).add_(...)``, spectral norm's power iteration updating ``weight_u``/``weight_v``,
an InstanceNorm's running statistics): the written value is a node of the graph, later reads of the
buffer read it, and the export's signature (``pkg.torch.export.ExportedProgram.graph_signature``)
lists it as ``div_1: BUFFER_MUTATION target='fc.weight_u'``; the ONNX graph drops that output, so
before, each step read the buffer as exported and differentiated through the update (the export
does not record the ``no_grad`` such writes run under). ``mark_buffer_mutations`` records each such
value as ``gc.capture`` records a buffer write: a stop-gradient Identity marked with the buffer's name
(``buffer_updates``), which the training graphs carry from step to step (``<buffer>.next``) and eval
and inference graphs skip (they read the buffer as stored). A BatchNormalization's own statistics
are ``modes``' and stay so.
"""

from __future__ import annotations

import re

import onnx_ir as ir

from graphc.passes.training import modes
from graphc.passes.training.imports import SIGNATURE
from graphc.passes.values import BUFFER_UPDATE_KEY, BUFFER_WRITE_KEY, STOP_GRADIENT_KEY, replace_value

_MUTATION = re.compile(r"^(\S+): BUFFER_MUTATION target='([^']+)'", re.MULTILINE)


def mark_buffer_mutations(model: ir.Model) -> list[str]:
    """Mark each value a dynamo export's signature records as a buffer's new value (see the module
    docstring), in place; returns the buffers' names. A mutation whose value is not in the graph (a
    BatchNormalization's statistics: the node updates them) is left alone; one of a buffer the graph
    never reads (spectral norm's ``weight_v``, computed afresh from ``weight_u`` each training
    forward: no initializer) only stops the gradient, as torch's ``no_grad``."""
    graph = model.graph
    mutations = _MUTATION.findall(graph.metadata_props.get(SIGNATURE, ""))
    if not mutations:
        return []
    made = {value.name: value for node in graph for value in node.outputs}
    statistics = set(modes.batchnorm_stats(graph))
    marked = []
    for value_name, buffer in mutations:
        value = made.get(value_name)
        if value is None or buffer in statistics:
            continue
        uses = list(value.uses())
        write = ir.node("Identity", [value])
        write.metadata_props[STOP_GRADIENT_KEY] = "true"
        if buffer in graph.initializers:
            write.metadata_props.update({BUFFER_WRITE_KEY: buffer, BUFFER_UPDATE_KEY: buffer})
            marked.append(buffer)
        new = write.outputs[0]
        new.name, new.type, new.shape = f"{value_name}/{buffer}", value.type, value.shape
        if value.producer() is None:  # a graph input written into the buffer as it is
            graph.insert_before(next(iter(graph)), write)
        else:
            graph.insert_after(value.producer(), write)
        replace_value(value, new, uses, buffer)
    return marked
