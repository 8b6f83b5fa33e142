"""The train_step replayed as CUDA graphs on ort-cuda: ``gc.Trainer(arts, "ort-cuda", cuda_graph=True)``.

A train step of a convolutional net is thousands of small kernels, and on a fast GPU launching
them one node at a time takes longer than running them (ResNet-50 at batch 32 on an H100: 4,763
kernels, 31.5 ms of GPU time in a 66 ms step). onnxruntime can capture a run as a CUDA graph and
replay it with one launch (the CUDA provider's ``enable_cuda_graph``). A replay does exactly
what the captured run did, on the same addresses, so this module arranges what that needs:

- *Every compute node on the GPU, no host/device copy nodes* (onnxruntime refuses the session
  otherwise): the step runs on a copy of the train_step whose batch inputs have the shapes of the
  first batch, its ``Size`` and ``Shape`` nodes made constants (onnxruntime folds ``Shape`` of a
  static shape itself, never ``Size``, whose int64 result it keeps on the CPU), so the shape
  arithmetic of the symbolic batch dim folds away (``capturable``).
- *Kernels that can be captured*: the CUDA provider's Concat takes at most 32 inputs while a
  graph is captured (it passes more through a host buffer): a wider Concat (the fused update's
  flattened gradients, a 7x7 im2col) becomes a tree of narrower ones, and a Split of over 32
  outputs likewise.
- *The same addresses*: each batch is copied into buffers staged on the device once, every
  output goes into a buffer bound beforehand, and each distinct set of bound addresses gets a
  graph of its own (``gpu_graph_id``): one where the Trainer writes every output in place, two
  for its ping-pong buffers, as many again after a checkpoint is loaded (new buffers).
  onnxruntime's first run of a graph id runs the step several times before it has captured it,
  so the state the step writes in place is saved first and put back after that run (``_capture``).
- *Nothing a replay would repeat wrongly*: a graph that draws random numbers itself would replay
  the same draws every step, so it is refused (Dropout's noise comes in as inputs and is fine).

A batch of other shapes (an epoch's last, smaller batch) runs on the Trainer's general session,
without a graph (the first such batch is said once, as a warning). A learning rate set between
steps (``Trainer.lr``) is written into its buffer, so the graphs stay valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import BackendError, first_few
from graphc.model.file import tensor_types
from graphc.passes.values import draws_random


def random_nodes(graph: ir.Graph) -> list[ir.Node]:
    """Nodes of ``graph`` (subgraphs included) that draw random numbers themselves (a replayed
    graph would draw the same ones each step): ``draws_random``'s, training-mode Dropout included."""
    return [n for n in ir.traversal.RecursiveGraphIterator(graph) if n.domain in ("", "ai.onnx") and draws_random(n)]


def specialize(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs named in ``shapes`` have those fixed dims; the dims'
    names elsewhere in the graph (outputs, value_info) are fixed alike, so nothing says otherwise."""
    fixed: dict[str, int] = {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in out.graph.input:
        if value.name not in shapes:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(shapes[value.name]):
            raise ValueError(f"input {value.name!r} has rank {len(dims)}, the batch's array {len(shapes[value.name])}")
        for dim, size in zip(dims, shapes[value.name]):
            if dim.HasField("dim_param"):
                fixed[dim.dim_param] = int(size)
            dim.dim_value = int(size)
    for value in list(out.graph.output) + list(out.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in fixed:
                dim.dim_value = fixed[dim.dim_param]
    return out


def capturable(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """``model`` specialized to ``shapes`` (``specialize``), its static ``Size``/``Shape`` nodes
    constants, no Concat or Split wider than ``MAX_FAN``: what onnxruntime can capture."""
    out = specialize(model, shapes)
    _fold_shapes(out)
    _narrow(out)
    return out


MAX_FAN = 32  # inputs of a Concat (outputs of a Split) onnxruntime's CUDA provider can capture


def _fold_shapes(model: onnx.ModelProto) -> None:
    """Replace each ``Size`` and ``Shape`` node whose input has a static inferred shape by a
    Constant (none where onnx cannot infer the graph's shapes)."""
    types = tensor_types(model) or {}
    static = {name: dims for name, (_, dims) in types.items() if None not in dims}
    for node in model.graph.node:
        if node.op_type not in ("Size", "Shape") or node.domain not in ("", "ai.onnx") or node.input[0] not in static:
            continue
        dims = static[node.input[0]]
        if node.op_type == "Size":
            value = np.array(int(np.prod(dims)), np.int64)
        else:
            bounds = {a.name: a.i for a in node.attribute}
            value = np.array(dims[bounds.get("start", 0):bounds.get("end", len(dims))], np.int64)
        node.op_type = "Constant"
        del node.input[:], node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(value)))


def _narrow(model: onnx.ModelProto) -> None:
    """Make each Concat of over ``MAX_FAN`` inputs, and each Split of over ``MAX_FAN`` outputs
    with constant sizes, a tree of the same op, none wider than that."""
    graph = model.graph
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    constants.update({n.output[0]: onnx.numpy_helper.to_array(a.t) for n in graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Concat" and len(node.input) > MAX_FAN:
            nodes += _concat_tree(list(node.input), node.output[0], node.name, axis)
        elif node.op_type == "Split" and len(node.output) > MAX_FAN and len(node.input) > 1 \
                and node.input[1] in constants:
            sizes = [int(v) for v in constants[node.input[1]]]
            nodes += _split_tree(node.input[0], sizes, list(node.output), node.name, axis, graph)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _groups(items: Sequence) -> list[list]:
    """``items`` in at most ``MAX_FAN`` consecutive groups of equal width (the last may be short)."""
    width = -(-len(items) // MAX_FAN)
    return [list(items[i:i + width]) for i in range(0, len(items), width)]


def _concat_tree(inputs: list[str], output: str, name: str, axis: int) -> list[onnx.NodeProto]:
    if len(inputs) <= MAX_FAN:
        return [onnx.helper.make_node("Concat", inputs, [output], name=name, axis=axis)]
    nodes, parts = [], []
    for k, group in enumerate(_groups(inputs)):
        parts.append(f"{name}/{k}")
        nodes += _concat_tree(group, parts[-1], parts[-1], axis)
    return nodes + [onnx.helper.make_node("Concat", parts, [output], name=name, axis=axis)]


def _split_tree(source: str, sizes: list[int], outputs: list[str], name: str, axis: int,
                graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    if len(outputs) == 1:
        return [onnx.helper.make_node("Identity", [source], outputs, name=name)]
    if len(outputs) > MAX_FAN:
        groups = list(zip(_groups(sizes), _groups(outputs)))
        parts = [f"{name}/{k}" for k in range(len(groups))]
        nodes = _split_tree(source, [sum(g) for g, _ in groups], parts, name, axis, graph)
        for part, (group_sizes, group_outputs) in zip(parts, groups):
            nodes += _split_tree(part, group_sizes, group_outputs, part, axis, graph)
        return nodes
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), f"{name}/sizes"))
    return [onnx.helper.make_node("Split", [source, f"{name}/sizes"], outputs, name=name, axis=axis)]


class GraphedStep:
    """The train_step on ort-cuda, captured and replayed as CUDA graphs for one batch signature.

    ``backend``: the ort-cuda backend; ``model``: the train_step as the Trainer runs it (params as
    inputs); ``source``: its graph as the artifacts hold it (read for random ops, without
    serializing the weights); ``batch_names``: the inputs fed per step (data, labels, noise);
    ``options``: the session options the Trainer's general session got.
    """

    def __init__(self, backend: Any, model: onnx.ModelProto, source: ir.Graph, batch_names: Sequence[str],
                 options: Mapping[str, Any]):
        if backend.device != "cuda":
            raise ValueError(f"cuda_graph needs the CUDA provider (backend 'ort-cuda'), not {backend.name!r}")
        drawn = [f"{n.name or '?'} ({n.op_type})" for n in random_nodes(source)]
        if drawn:
            raise BackendError(f"cuda_graph: the train_step draws random numbers itself ({first_few(drawn, 5)}); "
                               "a replayed CUDA graph would draw the same numbers every step. Train without "
                               "cuda_graph, or feed the randomness as inputs (graphc's Dropout does)")
        self._backend, self._model, self._options = backend, model, dict(options)
        self._batch_names = list(batch_names)
        self.signature: tuple | None = None  # (name, dtype, shape) of each batch input
        self._exe: Any = None
        self._staged: dict[str, Any] = {}  # batch input -> its buffer on the device
        self._results: dict[str, Any] = {}  # host output -> the device buffer it is written to
        self._graph_ids: dict[tuple[int, ...], int] = {}  # bound addresses -> their graph
        self._warned = False  # about a batch of other shapes

    @staticmethod
    def signature_of(feeds: Mapping[str, Any], names: Sequence[str]) -> tuple:
        return tuple((n, np.asarray(feeds[n]).dtype.str, np.shape(feeds[n])) for n in names)

    def accepts(self, feeds: Mapping[str, Any]) -> bool:
        """Can this batch run as a graph: the first batch's signature, or the first batch itself.
        The first batch of other shapes is said once (a warning): it and its like run without one."""
        if self.signature is None or self.signature_of(feeds, self._batch_names) == self.signature:
            return True
        if not self._warned:
            import warnings

            self._warned = True
            got, first = (", ".join(f"{n} {tuple(shape)}" for n, _, shape in signature)
                          for signature in (self.signature_of(feeds, self._batch_names), self.signature))
            warnings.warn(f"cuda_graph: a batch of other shapes or dtypes ({got}) than the first ({first}) runs "
                          "without a CUDA graph, as will every such batch; DataLoader(..., drop_last=True) keeps "
                          "an epoch's last batch full", stacklevel=3)
        return False

    @property
    def graphs(self) -> int:
        """How many distinct graphs (sets of bound addresses) the runs have asked for."""
        return len(self._graph_ids)

    def _prepare(self, feeds: Mapping[str, Any]) -> None:
        self.signature = self.signature_of(feeds, self._batch_names)
        shapes = {n: np.shape(feeds[n]) for n in self._batch_names}
        model = capturable(self._model, shapes)
        try:
            self._exe = self._backend.prepare(model, **self._options, cuda_graph=True)
        except BackendError as exc:
            raise BackendError(f"cuda_graph: {exc}{self._on_cpu(model)}") from None
        self._staged = {n: self._exe.to_device(np.ascontiguousarray(feeds[n])) for n in self._batch_names}

    def _on_cpu(self, model: onnx.ModelProto) -> str:
        """Which nodes onnxruntime runs on the CPU (without a graph), for the error."""
        try:
            placement = self._backend.prepare(model, **self._options).placement
        except BackendError:
            return ""
        cpu = sorted(name for name, provider in placement.items() if provider == "CPUExecutionProvider")
        return f" (nodes onnxruntime runs on the CPU: {first_few(cpu, 8, more=', and {} more')})" if cpu else ""

    def _capture(self, bound: Mapping[str, Any], names: list[str], targets: Mapping[str, Any], graph_id: int) -> None:
        """Have onnxruntime capture ``graph_id``. Its first run of a graph id runs the model again
        and again ("Start another run for necessary memory allocation or graph capture") until it
        has captured it: a train step that writes its state in place would be applied several
        times. So the inputs the step writes into are saved to the host first and put back after."""
        written = {id(v) for v in targets.values()}
        saved = {name: np.array(value.numpy(), copy=True) for name, value in bound.items() if id(value) in written}
        self._exe.run_bound(bound, (), names, into=targets, graph_id=graph_id)
        for name, array in saved.items():
            bound[name].update_inplace(array)

    def run(self, feeds: Mapping[str, Any], host_outputs: Sequence[str], device_outputs: Sequence[str],
            into: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """One step: ``feeds`` holds the batch (host arrays) and the carried handles; ``into`` a
        buffer for every device output. Returns what ``run_bound`` does."""
        missing = [n for n in device_outputs if into.get(n) is None]
        if missing:
            raise ValueError(f"cuda_graph: no buffer given for the device output(s) {missing}")
        if self._exe is None:
            self._prepare(feeds)
        else:
            for name in self._batch_names:
                self._staged[name].update_inplace(np.ascontiguousarray(feeds[name]))
        bound = {n: self._staged.get(n, v) for n, v in feeds.items()}
        names = [*host_outputs, *device_outputs]
        new = [n for n in host_outputs if n not in self._results]
        if new:  # an ordinary run (no graph) that gives the new host outputs their device buffers
            _, out = self._exe.run_bound(bound, (), names, into={**into, **self._results}, graph_id=-1)
            self._results.update({n: out[n] for n in new})
        else:
            targets = {**into, **self._results}
            key = tuple(v.data_ptr() for v in bound.values()) + tuple(targets[n].data_ptr() for n in names)
            graph_id = self._graph_ids.get(key)
            if graph_id is None:
                graph_id = self._graph_ids[key] = len(self._graph_ids) + 1
                self._capture(bound, names, targets, graph_id)
            _, out = self._exe.run_bound(bound, (), names, into=targets, graph_id=graph_id)
        return {n: out.pop(n).numpy() for n in host_outputs}, out
