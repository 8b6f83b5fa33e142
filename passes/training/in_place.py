"""Which carried train_step outputs may be written into their own input's buffer.

The Trainer writes each ``X.next`` into a buffer it binds (``graphc.runtime.trainer``): by default the
other of two buffers used in turn, which keeps two copies of every param and optimizer state
slot. ``X.next`` can go into ``X``'s own buffer when nothing reads ``X`` after it is written:
``X.next`` has ``X``'s size, and every node that reads ``X``, or a view of it (Reshape, Identity,
Flatten, Squeeze, Unsqueeze alias their input) or a Transpose of it (onnxruntime's optimizer makes
a MatMul of a Transpose a FusedMatMul reading ``X`` itself, and a Transpose that moves only dims
of 1 a Reshape), is its writer ``W`` or one of ``W``'s ancestors,
so any valid execution order runs it first. ``W`` is the node that makes ``X.next``, or, where
that is a view, the node that makes the viewed value (onnxruntime may fold the view away); a
``W`` that reads ``X`` itself must be an elementwise Add/Sub/Mul/Div (reading ``X`` at the index
it writes, as onnxruntime's own in-place reuse does) or a ``Where`` whose condition is a scalar
and which reads ``X`` as a branch (loss scaling's ``keep``: the old state on a skipped step; X
has the output's size, so is read at the index written, and onnxruntime's CPU kernel reads both
branches into temporaries before it asks for its output, its CUDA kernel reads index i to write
index i; the ort-cpu session runs it as an If that copies one branch, ``graphc.backends.selects``,
a copy onto itself where X is its output's buffer), one that does not may be any node (the
Split of a flat group's small params stepped as one, ``flat.apply``). The optimizer state passes
(its only readers are its own update chain); a param passes when no backward node outside its
update's ancestry reads it (e.g. a conv weight whose input gradient feeds only params in other
flat groups fails: that ConvTranspose may run after the update).

Which graph: the Trainer asks onnxruntime for the graph it runs (``OrtExecutable.optimized_graph``,
``optimized=True``), where its rewrites have already made their readers: it drops a Cast to a
tensor's own dtype and a Mul or Div by 1 and fuses a Mul by a scalar into a FusedMatMul, so a
MatMul of ``W * 0.5`` reads ``W`` itself (``tests/test_in_place.py``); there only views are read
through, a Transpose left is a copy. Our own graph is judged where onnxruntime gives none (and
also for CUDA graphs, whose session is built later), with Transposes read through. Measured
(ort-cpu, 2 threads, AdamW, batch 32, 64 px, ``scripts/bench_zoo.py``'s models): the same outputs
in place as judged on our graph (ResNet-18 119 of 137, ResNet-50 314 of 356, ViT 167 of 179, the
GPT 94 of 107: its Transposes of weights are cancelled into reads of the weights), so the same
peak RSS; the session build within noise on a shared machine (ResNet-50 4.2-5.0 s asking for the
graph, 2.8-5.4 s not), the optimized graph 0.9 MB (its params are fed; initializers from 1 KiB
go to a side file no one reads), its analysis 0.07 s.

Measured (onnxruntime CPU, 1 thread, AdamW, 64 px): ResNet-18 at batch 32 writes 117 of its
127 carried outputs in place (ResNet-50: 302 of 332) and its peak RSS drops from 950 to 792 MB
(PyTorch eager: 731). Reading through Transposes leaves ``scripts/bench_zoo.py``'s CNNs as they
were (ResNet-18 119 of 137, EfficientNet-B0 325 of 334) and takes ViT from 178 to 167 of 179, the
GPT from 106 to 94 of 107: weights whose transposed copy a backward MatMul reads for an earlier
layer's gradient, which onnxruntime's Transpose cancelling turns into a read of the weight itself. The analysis takes 0.1 s (ResNet-50: 0.5 s): ancestry as bitsets over the
reading nodes, one pass over the graph.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

import onnx

from graphc.model.graphs import reads

__all__ = ["in_place_outputs"]

_VIEWS = frozenset({"Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze"})
# their readers may read the input itself once onnxruntime has optimized the graph (the docstring)
_READ_THROUGH = _VIEWS | {"Transpose"}
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})
_WHERE = frozenset({"Where"})
_IF = frozenset({"If"})


def _numel(value: onnx.ValueInfoProto) -> int | None:
    dims = value.type.tensor_type.shape.dim if value.type.tensor_type.HasField("shape") else None
    if dims is None or not all(d.HasField("dim_value") for d in dims):
        return None
    return math.prod(d.dim_value for d in dims)


def _is(node: onnx.NodeProto, ops: frozenset[str]) -> bool:
    return node.op_type in ops and node.domain in ("", "ai.onnx")  # com.microsoft's ops have other names


def _copies(node: onnx.NodeProto) -> bool:
    """``node`` is an If whose branches each only copy one value (the ort-cpu session's form of a
    Where of a one-element condition, ``graphc.backends.selects``)."""
    branches = [a.g for a in node.attribute if a.HasField("g")]
    return _is(node, _IF) and len(branches) == 2 and all(
        [n.op_type for n in g.node] == ["Identity"] and len(g.output) == 1 for g in branches)


def _selects(node: onnx.NodeProto, aliases: set[str], sizes: Mapping[str, int | None]) -> bool:
    """``node`` is a ``Where`` of a scalar condition, or an If that copies one of two values, that
    reads ``aliases`` (X and its views) as a branch only."""
    return ((_is(node, _WHERE) or _copies(node)) and sizes.get(node.input[0]) == 1
            and node.input[0] not in aliases)


def in_place_outputs(graph: onnx.GraphProto, feeds: Mapping[str, str], optimized: bool = False) -> set[str]:
    """The outputs among ``feeds`` (output name -> the input it replaces) that may be written
    into the input's own buffer (the module docstring says when). ``optimized``: ``graph`` is
    the one onnxruntime runs (``OrtExecutable.optimized_graph``): only views are read through,
    its Transposes are copies."""
    through = _VIEWS if optimized else _READ_THROUGH
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output}
    reads_of = [reads(node) for node in graph.node]
    readers: dict[str, list[int]] = defaultdict(list)
    for i, names in enumerate(reads_of):
        for name in names:
            readers[name].append(i)
            if producer.get(name, -1) >= i:
                return set()  # not in topological order (as ONNX asks, and onnxruntime writes): no claim
    reading: dict[str, set[int]] = {}  # carried input -> the nodes reading it or a view of it
    aliases: dict[str, set[str]] = {}  # carried input -> it and its views
    for name in feeds.values():
        reading[name], aliases[name], stack = set(), {name}, [name]
        while stack:
            for i in readers[stack.pop()]:
                reading[name].add(i)
                if _is(graph.node[i], through):
                    stack.extend(graph.node[i].output)
                    aliases[name].update(graph.node[i].output)
    # ancestry as bitsets over the reading nodes only, in one pass in topological order
    bit = {i: 1 << k for k, i in enumerate(sorted(set().union(*reading.values())))}
    above = [0] * len(graph.node)
    for i, names in enumerate(reads_of):
        mask = bit.get(i, 0)
        for name in names:
            if name in producer:
                mask |= above[producer[name]]
        above[i] = mask
    sizes = {v.name: _numel(v) for v in [*graph.input, *graph.output, *graph.value_info]}
    found = set()
    for out, name in feeds.items():
        w = producer.get(out)
        while w is not None and _is(graph.node[w], _VIEWS):  # onnxruntime may fold a view away,
            w = producer.get(graph.node[w].input[0])  # its input's writer then writes the output
        if w is None or sizes.get(out) is None or sizes.get(out) != sizes.get(name):
            continue
        if w in reading[name] and not (_is(graph.node[w], _ELEMENTWISE) or _selects(graph.node[w], aliases[name], sizes)):
            continue  # only an elementwise node reads X[i] before it writes out[i]
        mask = sum(bit[i] for i in reading[name])
        if mask & ~above[w] == 0:
            found.add(out)
    return found
