"""The fused update's layout: trainable params updated end to end, a few flat buffers at a time.

Params are grouped by dtype and by whether they get weight decay, a group at most
``CHUNK_ELEMENTS`` long (``params.float32``, ``params.float32.1``, ...), a param of
``ALONE_ELEMENTS`` or more a group of its own. train_step still takes (and
outputs) each param under its own name, as the graphs use it; the update reads a group's
gradients ``Concat``-ed into one flat vector and its optimizer state as one flat buffer per slot,
``<group>.<slot>`` (a train_step input and output of shape [numel]), and computes the group's step
``delta`` in one chain of elementwise nodes, whose count and cost follow the bytes of the params,
not their count: PyTorch's multi-tensor (``foreach``) AdamW, in standard ONNX ops. ``delta`` is
``Split`` into the params' pieces and each param's ``<param>.next = param * shrink - delta`` is
computed from the param as fed, straight into its output buffer; the params are concatenated
only for an update that reads them (L2 weight decay of SGD and Adam) and for a group's small
params (under ``SMALL_ELEMENTS``, laid out last), stepped as one and split back (``apply``), so
that the update's node count follows the number of large params, whose bytes bound it, not the
number of params.

Why: on onnxruntime's CPU provider (2 threads), AdamW on ResNet-50 as one chain of ~20 nodes per
param (161 params, 3,576 nodes) spent 343 of 445 ms of kernel time in the update; one 14-node
chain over a flat buffer of the same 25.6 M floats takes 57 ms (torch.optim.AdamW's own
single-tensor step on that buffer: 106 ms). Applying the split step to each param, instead of
concatenating the params and splitting the new flat params back (a Split, then a Reshape that
copies into the bound output), takes three full-size copies out of the step (with the Adam step's
bias correction moved onto scalars, ``optimizers.adam``): Trainer steps interleaved, 1 thread,
ResNet-18 at batch 2 0.92x the step time (0.93x at 2 threads), ResNet-50 at batch 2 0.78x.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training import optimizers
from graphc.passes.values import fresh_name

__all__ = ["Group", "apply", "concat", "plan", "split"]

# A group holds at most this many elements (a larger param gets a group of its own): the ~14
# passes of an AdamW update then run over 2 MB (float32) arrays that stay in the CPU's cache,
# not over the whole model from DRAM. Measured (onnxruntime CPU, 2 threads, interleaved Trainer
# steps): ResNet-50 at batch 2, one buffer per dtype 317 ms, 2**22-element groups 270, 2**20
# 229, 2**18 243; ResNet-18 at batch 2: 164, 151, 153, 144; at batch 32 the choice between 2**19
# and 2**21 moves ResNet-50's step by under 2 %. On a CPU of 32 MB L3 (AMD Zen 5), 2**19
# against 2**20, step-time ratios at batch 2 (64 px): RegNetY-400MF 0.927, ViT-Ti/8 0.914 /
# 0.919, EfficientNet-B0 0.93 / 0.973, GPT 0.978, MobileNetV3-small 0.985, ResNet-18 0.98 /
# 0.999, ResNet-50 0.979; at batch 32 ResNet-18 1.006, ResNet-50 1.001, EfficientNet-B0 0.996,
# ViT 1.002. 2**18 against 2**19: ViT 1.001, RegNetY 0.972, ResNet-18 1.015. AdamW's chain
# alone over ResNet-18's 11.7 M floats in groups of 2**17 .. 2**23: 21.3, 17.2, 16.4, 17.6-18.8,
# 21.9, 27.9, 32.0 ms.
#
# Tried and left out: params planned from the last to the first, a large param (2**17+ elements)
# taking the next ones (from the layer before) into its group, so that the input gradient that
# reads it runs before its group's update and its next value can go into its own buffer
# (``in_place``): ResNet-50 at batch 2 kept 10 MB of params in spare buffers instead of 80 (peak
# RSS 782 -> 747 MB), but each large param's gradient and step were then copied in and out of
# its group's flat buffer (Concat and Split), 1.02-1.05x the step time. And a group's params of
# fewer than 2**14 elements (its layout's tail) stepped as one, concatenated, applied and split
# back, not two nodes each: EfficientNet-B0 at batch 2, 274 nodes fewer, its update's kernel time
# 11.2 -> 11.0 ms, Trainer steps interleaved 1.00x / 1.00x (the per-node cost is small outside
# a profile), and those params' next values no longer written in place (159 of 321 into spare
# buffers); 2**12: 1.07x-1.19x. (Since taken, ``SMALL_ELEMENTS``: see there.) A param of more
# than CHUNK_ELEMENTS stepped in pieces of it (its gradient and state Split, each piece's chain in
# cache, the step and new state Concat-ed back): ResNet-18 at batch 32, 64 px, 1.041x the step
# time (the Splits and Concats are full passes); with the state kept in pieces too (only the
# gradient Split and the step Concat-ed), ResNet-18's three 512x512x3x3 weights' update alone,
# caches flushed before each run, 1.10x in 5 pieces, 1.13x in 9. Each param of 2**16 (or 2**14)
# elements or more in a group of its own, so that no Concat copies its gradient and no Split its
# step: ResNet-50 at batch 32, 64 px, 43 (53) groups in place of 44, Trainer steps interleaved,
# built second / first, 0.998x / 1.005x (0.991x / 1.005x); most of its large params were alone
# already. (Since taken, with GPT's and the CNNs' numbers: ``ALONE_ELEMENTS``.)
CHUNK_ELEMENTS = 1 << 19
# A group's params of fewer elements than this are stepped as one (``apply``): their pieces of the
# step and the params themselves concatenated, ``param * shrink - delta`` in two nodes, the result
# split back, where two nodes each (Mul, Sub) cost more to dispatch than to run. The update's
# nodes (AdamW, 64 px, Constants aside) 477 -> 275 for MobileNetV3-small, 744 -> 490 for
# EfficientNet-B0, 754 -> 477 for RegNetY-400MF, 979 -> 890 for ResNet-50; its share of the
# step's kernel time at batch 32 (``bench_zoo.py``, one run) MobileNetV3-small 15.2 -> 12.3 %,
# EfficientNet-B0 9.6 -> 8.8, RegNetY-400MF 11.7 -> 11.3, at batch 2 28.8 -> 25.8, 28.9 -> 26.9,
# 29.1 -> 28.2. Wall time unchanged: Trainer steps interleaved, this built second / first, batch 32
# MobileNetV3-small 1.005x / 1.009x, EfficientNet-B0 0.983x / 0.999x; batch 2 MobileNetV3-small
# 1.005x / 1.000x, ResNet-18 0.992x / 1.011x, EfficientNet-B0 0.985x / 0.997x (RegNetY-400MF
# 1.129x / 0.948x: this VM's noise that hour). Losses equal bit for bit. The Split writes the
# small params' next values into their own buffers, as the Subs did (``in_place``). ``plan`` lays
# a group's small params out last, so that their step is one piece of the step's Split, not its
# pieces concatenated again: a Concat fewer per group of large and small params, and a Split of
# fewer pieces. AdamW, batch 32, 64 px, 2 threads, the two layouts' train_steps profiled in turns
# (6 rounds, each node at its fastest run, at load 12): Concats and Splits 2.88 -> 2.44 ms for
# EfficientNet-B0, 1.76 -> 1.42 for MobileNetV3-small, of updates of 26-27 and 16-18 ms whose
# chains moved by more than that from layout to layout with the machine's load; losses and state
# equal bit for bit after 3 steps; Trainer steps in turns (8 rounds, load 9) 0.90x (rounds
# 0.42x-1.48x) and 1.04x (0.73x-1.37x): noise. Artifacts laid out before keep the re-gathering.
SMALL_ELEMENTS = 1 << 14
# A param of this many elements or more gets a group of its own: its gradient is read by the
# chain as it comes (no Concat) and its step applied as it leaves (no Split), where the chain's
# ~11 more nodes cost less than those two copies (single-threaded in onnxruntime's CPU provider).
# The AdamW update of GPT (bench_zoo, batch 2, onnxruntime CPU, 1 thread, per-node medians of 12
# runs): 13.4 -> 12.1 ms of kernel time (the Concats and Splits 2.0 -> 0.26 ms; the bare chain
# over as many floats, ``bench_zoo.chain_floor_ms``, 10.9 ms), 15 -> 26 groups, 1,457 -> 1,469
# nodes. Trainer steps interleaved in one process, 1 thread, CPU time, batch 2, 64 px, against no
# group of one: GPT 0.97x-1.00x (two runs), ViT-Ti/8 0.98x, EfficientNet-B0 0.98x,
# MobileNetV3-small 0.96x, RegNetY-400MF 0.96x, ResNet-18 0.96x, ResNet-50 1.00x / 1.03x (two
# runs; most of its large params were alone already); 2**15 and 2**17 within this machine's
# noise of it (EfficientNet-B0 0.96x / 0.94x, RegNetY 0.94x / 0.96x). Losses equal bit for bit.
ALONE_ELEMENTS = 1 << 16
# A 1-D param (a bias, a norm's scale) joins and leaves its group without a Reshape: ViT-Ti's
# train_step 204 nodes fewer (2,668 -> 2,464), Trainer steps interleaved, both orders, at batch 2
# 0.94x / 0.99x the step time, ResNet-50 (106 of its 161 params) 0.98x / 0.99x.
_DTYPE_NAMES = {ir.DataType.FLOAT: "float32", ir.DataType.DOUBLE: "float64", ir.DataType.FLOAT16: "float16"}


@dataclass
class Group:
    name: str  # its optimizer state is ``<name>.<slot>``
    dtype: ir.DataType
    params: list[str]
    shapes: list[tuple[int, ...]]
    weight_decay: bool

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(s, dtype=np.int64)) for s in self.shapes]


def plan(graph: ir.Graph, params: Sequence[str], decays: Mapping[str, bool]) -> list[Group]:
    """Groups by (dtype, weight decay), params in the order they first appear, a group's params
    under ``SMALL_ELEMENTS`` then moved after the others; a group is closed before it would pass
    ``CHUNK_ELEMENTS``; a param of ``ALONE_ELEMENTS`` or more gets a group of its own."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    open_groups: dict[tuple, Group] = {}
    groups: list[Group] = []
    for p in params:
        value = graph.initializers[p]
        key = (value.dtype, decays[p])
        shape = tuple(int(d) for d in value.shape)
        group, alone = open_groups.get(key), math.prod(shape) >= ALONE_ELEMENTS
        if alone or group is None or (group.params and sum(group.sizes) + math.prod(shape) > CHUNK_ELEMENTS):
            stem = f"params.{_DTYPE_NAMES.get(value.dtype, value.dtype.name.lower())}" + ("" if decays[p] else ".no_decay")
            group = Group(fresh_name(taken, stem, sep="."), value.dtype, [], [], decays[p])
            groups.append(group)
            if not alone:  # a group of one large param stays closed: the small ones go on filling theirs
                open_groups[key] = group
        group.params.append(p)
        group.shapes.append(shape)
    for group in groups:  # the small params last, so that ``apply`` splits their step off as one piece
        laid = sorted(zip(group.params, group.shapes), key=lambda ps: math.prod(ps[1]) < SMALL_ELEMENTS)
        group.params, group.shapes = [p for p, _ in laid], [shape for _, shape in laid]
    return groups


def concat(b: Emitter, group: Group, values: Mapping[str, ir.Value], flat_already: Collection[str] = ()) -> ir.Value:
    """The group's ``values`` (its params, or their gradients, or their steps' pieces: those named
    in ``flat_already`` 1-D) end to end, in layout order."""
    parts = [values[p] if len(shape) == 1 or p in flat_already else b.op("Reshape", values[p], b.ints([-1]))
             for p, shape in zip(group.params, group.shapes)]
    flat = b.op("Concat", *parts, axis=0) if len(parts) > 1 else parts[0]
    # typed as ``values`` (a half-precision group's float32 step stays float32: ``optimizers._in_float32``)
    flat.dtype, flat.shape = _dtype(parts[0], group), ir.Shape([sum(group.sizes)])
    return flat


def split(b: Emitter, group: Group, flat: ir.Value, keep_flat: Collection[str] = ()) -> dict[str, ir.Value]:
    """The inverse of ``concat``: each param's piece of ``flat`` in its own shape (those named in
    ``keep_flat`` as 1-D pieces). (onnxruntime's CUDA Split of unequal pieces copies its sizes and
    an int64 table as long as the group from the host every run; a Slice per piece instead is no
    way around it: onnxruntime's GatherSliceToSplitFusion, on its CPU and CUDA providers, makes
    those Slices this Split again.)"""
    parts = b.split(flat, group.sizes, axis=0, count=len(group.params)) if len(group.params) > 1 else (flat,)
    out = {}
    for p, part, shape in zip(group.params, parts, group.shapes):
        flat_piece = len(shape) == 1 or p in keep_flat
        out[p] = part if flat_piece else b.op("Reshape", part, b.ints(shape))
        out[p].dtype, out[p].shape = _dtype(flat, group), ir.Shape([math.prod(shape)] if flat_piece else shape)
    return out


def _dtype(value: ir.Value, group: Group) -> ir.DataType:
    return value.dtype if value.dtype is not None else group.dtype


def apply(b: Emitter, group: Group, params: Mapping[str, ir.Value], delta: ir.Value,
          shrink: ir.Value | None) -> dict[str, ir.Value]:
    """Each param's next value from the group's step ``delta``: ``param * shrink - delta`` on its
    piece (``optimizers.apply``), a large param on its own, straight into its output buffer, the
    params under ``SMALL_ELEMENTS`` (two or more) as one flat tail, split back."""
    small = {p: shape for p, shape, size in zip(group.params, group.shapes, group.sizes) if size < SMALL_ELEMENTS}
    small = small if len(small) > 1 else {}
    if len(small) == len(group.params):  # all of them the tail: ``delta`` is its step as it is
        return split(b, group, optimizers.apply(b, concat(b, group, params), delta, shrink))
    tail = Group(group.name, group.dtype, list(small), list(small.values()), group.weight_decay)
    if small and group.params[-len(small):] == tail.params:  # laid out last (``plan``): their step is one piece
        large = len(group.params) - len(small)
        pieces = split(b, Group(group.name, group.dtype, [*group.params[:large], group.name],
                                [*group.shapes[:large], (sum(tail.sizes),)], group.weight_decay), delta)
        step = pieces.pop(group.name)  # (a group's name is no param's: ``plan`` takes fresh names)
    else:  # artifacts laid out before: the small params' pieces gathered again
        pieces = split(b, group, delta, keep_flat=small)
        step = concat(b, tail, pieces, flat_already=small) if small else None
    out = {p: optimizers.apply(b, params[p], pieces[p], shrink) for p in group.params if p not in small}
    if small:
        out.update(split(b, tail, optimizers.apply(b, concat(b, tail, params), step, shrink)))
    return out
