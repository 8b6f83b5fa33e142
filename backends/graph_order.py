"""The graph onnxruntime optimized, put back in the order of the graph it was given.

onnxruntime numbers the nodes its fusions create after every node it was given, in the order its
passes meet them, and a pass walks the graph depth first from the outputs: the fused copies of
a checkpoint region (``Gemm`` + ``Tanh`` as one ``FusedGemm``) come first. Run in priority order
(the lowest-numbered ready node next), they ran at the start of the forward, and the values they
were to recompute lived through the backward anyway (``OrtExecutable`` with ``graph_order``).
``sort`` orders the optimized graph so that, loaded again, its numbering is the given graph's.

Only priority order follows the numbering: onnxruntime's default order walks the graph depth
first from its leaves, each node after the inputs it reads (its ``GraphViewer``), whatever the
numbering. Ordinary train_steps (no regions) keep the default order, not sorted: measured on
``scripts/bench_zoo.py``'s models at batch 32, 64 px, Trainer sessions (2 threads, no memory
pattern), peak RSS of a fresh process training 5 steps, 1-3 processes each (repeats within 1 MB):
onnxruntime's numbering and order ResNet-18 483 MB, EfficientNet-B0 592, GPT 905; sorted, default
order 485, 586, 906; sorted, priority order (graph order exactly) 502, 602, 946; onnxruntime's
numbering in priority order 719, 664, 928. Step time, 1 thread, the four Trainers interleaved 8
rounds on 2 cores loaded 12-19: sorted 1.08x and 0.95x (ResNet-18, EfficientNet-B0), graph order
1.04x and 0.90x, its rounds' ratios 0.46x-2.2x: no difference this machine shows. The sorting
session costs the Trainer's build 0.4 s (ResNet-18) to 4.7 s (GPT: 3.0 -> 7.7 s). It is a full session:
onnxruntime writes the graph it optimized only from one (kernels made, weights prepacked; prepacking off
saved nothing measurable); a region MLP's (16 x Linear(256) + Tanh) Trainer build, median of 4, 1.29 s
without regions, 1.69 s with (the first session 0.45-0.68 s, sorting and saving 0.1-0.15, the sorted one
0.15-0.26). One session instead, measured on 2 shared cores, 1 thread, builds and steps interleaved, peak RSS
of a fresh process against the two sessions' (205-213 MB at batch 4096; 465 without regions): at level "basic"
(no fusion makes a node, so onnxruntime's numbering is the graph's) that MLP's gc.grad session builds in 0.74x
the time (medians of 8), steps in 1.03x (medians of 10), peaks 5 MB higher, holding 14 MB more once built (179
MB against 165); a region conv stack's (8 x Conv(32, 3x3) + BatchNorm + ReLU, batch 16, 32 px) steps take 1.30x
(8 rounds 1.15-1.49x), its build 0.55x (medians of 3). At "all" without GemmActivationFusion (the fusion whose
nodes ran the copies first) +5 MB as at "basic"; at "all" in onnxruntime's numbering +130 MB; at "all" with
each copy's first node made to wait for the backward value before it (its input reshaped to its own shape plus
a zero summed from an empty slice of that value; a prototype) the copies ran in the backward (a step's rise 45
MB against 40) but, as every single session, it held 15 MB more once built, also loaded from a file: +20 MB. So
two sessions.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx import helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

from graphc.model.graphs import reads


# What a session of a model holding checkpoint region copies (``RECOMPUTED_KEY``) gets by default, per device:
# (memory pattern, graph order). CPU: graph order, no memory pattern. scripts/bench_checkpoint.py's MLP's gc.grad
# model with regions, peak RSS above the pre-run one, median of 3 processes (numpy +39 MB; without regions +553 MB
# with the defaults, which it keeps): onnxruntime's order +536 MB (before), without the pattern +256; graph order
# +96, without the pattern +28 (1 process each: also without the arena +108, at level "basic" +28; onnxruntime's
# order at "basic" without the pattern +44, without the arena +460). Median s/step 4.65, 4.23, 4.29, 5.17: runs of
# one option spread 2.8-6.5 s on 2 shared cores, within the noise. CUDA: no memory pattern (as the Trainer's
# train_step on every device), onnxruntime's order: the graph its CUDA session writes holds the Memcpy nodes it
# placed, and reloading that graph sorted is unverified on a GPU, so graph order is refused there.
REGION_DEFAULTS = {"cpu": (False, True), "cuda": (False, False)}
_ORDERED_DEVICES = ("cpu",)


def session_order(device: str, copies: bool, mem_pattern: bool | None = None,
                  graph_order: bool | None = None) -> tuple[bool, bool]:
    """(memory pattern on, run in graph order) for a session on ``device`` ("cpu", "cuda") of a model
    holding region copies (``copies``) or not: ``REGION_DEFAULTS`` for one that does, onnxruntime's
    (pattern on, its own order) for one that does not, where ``mem_pattern`` or ``graph_order`` does not
    say; ``graph_order=True`` off the CPU is refused (``ValueError``)."""
    if graph_order and device not in _ORDERED_DEVICES:
        raise ValueError(f"graph_order runs on the CPU provider (backend 'ort-cpu'), not on {device!r}: reloading "
                         "the graph onnxruntime optimized there in graphc's order is unverified")
    pattern, ordered = REGION_DEFAULTS[device] if copies else (True, False)
    return (pattern if mem_pattern is None else bool(mem_pattern),
            ordered if graph_order is None else bool(graph_order))


def optimized_in_order(ort: Any, data: bytes | str, options: Any, providers: list, disabled: Sequence[str],
                       model: onnx.ModelProto, optimized: Path) -> tuple[Path, onnx.GraphProto]:
    """Optimize ``data`` in a first session (which writes ``optimized``, not profiled), put that
    graph's nodes in ``model``'s order (``sort``) next to it, and set ``options`` to load it
    as it is: the path to open (its large initializers in ``optimized``'s external data) and
    the sorted graph."""
    profiling, options.enable_profiling = options.enable_profiling, False
    ort.InferenceSession(data, options, providers=providers, disabled_optimizers=list(disabled) or None)
    written = onnx.load(str(optimized), load_external_data=False)
    _inline_integers(written.graph, optimized.parent)
    sort(written.graph, {node.name: i for i, node in enumerate(model.graph.node)})
    ordered = optimized.with_name("ordered.onnx")
    onnx.save(written, str(ordered))
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath, options.enable_profiling = "", profiling
    return ordered, written.graph


def _inline_integers(graph: onnx.GraphProto, directory: Path) -> None:
    """Read back into ``graph`` the integer initializers onnxruntime wrote to the external file:
    they are sizes, shapes and indices its shape inference reads when it loads the graph, and
    cannot read there (a flat buffer's ``Split`` into 128 params or more: 1 KiB of int64 sizes)."""
    for tensor in graph.initializer:
        if uses_external_data(tensor) and helper.tensor_dtype_to_np_dtype(tensor.data_type).kind in "iub":
            load_external_data_for_tensor(tensor, str(directory))


def sort(graph: onnx.GraphProto, ranks: Mapping[str, int]) -> None:
    """Order ``graph.node`` topologically, the ready node of the lowest rank next: a node named
    in ``ranks`` (node name -> position in the graph onnxruntime was given) has its rank there; a
    node onnxruntime made takes the lowest rank of its readers (it runs just before the first
    of them), or, read by none, the highest of its producers'. Ties keep onnxruntime's order."""
    nodes = list(graph.node)
    read = [reads(n) for n in nodes]
    producer = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    inputs = [sorted({producer[name] for name in r if name in producer} - {i}) for i, r in enumerate(read)]
    readers: list[list[int]] = [[] for _ in nodes]
    for i, sources in enumerate(inputs):
        for j in sources:
            readers[j].append(i)
    order = _kahn(inputs, readers, list(range(len(nodes))))
    if len(order) != len(nodes):  # a cycle (onnxruntime wrote none so far): left as it is
        return
    rank: list[float | None] = [ranks.get(n.name) for n in nodes]
    for i in reversed(order):  # made nodes: just before their first reader
        if rank[i] is None and readers[i]:
            known = [rank[j] for j in readers[i] if rank[j] is not None]
            rank[i] = min(known) if known else None
    for i in order:  # read by none: after their last producer
        if rank[i] is None:
            rank[i] = max((rank[j] for j in inputs[i]), default=-1)
    graph.ClearField("node")
    graph.node.extend(nodes[i] for i in _kahn(inputs, readers, [(rank[i], i) for i in range(len(nodes))]))


def _kahn(inputs: list[list[int]], readers: list[list[int]], keys: list) -> list[int]:
    """A topological order of the nodes, the ready node of the lowest ``keys[i]`` next."""
    waiting = [len(sources) for sources in inputs]
    ready = [(keys[i], i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (keys[j], j))
    return order
