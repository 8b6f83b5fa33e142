"""Where a zoo model's train_step spends its kernel time on onnxruntime CPU (or CUDA).

    .venv/bin/python scripts/profile_step.py efficientnet_b0 [--batch 32] [--image-size 64]
        [--runs 5] [--top 15] [--nodes 0] [--torch] [--update] [--threads 2] [--device cpu|cuda]
        [--cuda-graph] [--fastest]

Exports the model as ``scripts/bench_zoo.py`` does (torch.onnx, training mode), generates AdamW
artifacts and profiles ``--runs`` steps of the train_step at ``--threads`` (2) threads (the first two, which
allocate, left out). Kernel time is charged to the forward op a node serves: a gradient node
(named ``<forward node>/grad/...``) to its forward node's op type, the written-out training
BatchNorm (``bn/...``) to BatchNormalization, the update (``optim/...``) to the optimizer. It
prints the share per (forward op, phase) and the slowest op types inside each phase, so a
lowering can be chosen where the time is, then the time per kernel op type and what the matrix
products and convolutions take together. ``--torch`` also profiles PyTorch eager's step of the
same module (``torch.profiler``, self time per aten op) and what its matrix products, convolutions
and fused attention take: a floor for graphc's step where those dominate. ``--update`` splits
the optimizer update's kernel time by what its nodes do (``update_classes``, each node at its
fastest run): the full-size elementwise chain (with its cost per element and pass, groups of up
to ``flat.CHUNK_ELEMENTS`` together, each larger group size apart), the views, Concats and Splits
of the flat groups, the per-step scalars; beside them the same update profiled as a graph of its
own (``update_model``, same groups: gradients written long before it runs, not just produced),
and the chain floor (``bench_zoo.chain_floor_ms``). Needs torch.

``--fastest``: each node is charged its fastest run, not the mean of ``--runs``, and with
``--torch`` each aten op its fastest of ``--runs`` steps profiled one by one: on a shared machine
a preempted thread stretches a node (a [32, 64, 32, 32] Sub read 1.1 to 28 ms over five runs of
ResNet-18's step at load 11 on 2 cores), never shortens it, so the per-op tables of both sides
stay comparable from one run to the next.

``--device cuda`` generates the artifacts for CUDA (``generate(..., device="cuda")``) and trains
them on ort-cuda under ``torch.profiler`` (CUPTI sees every kernel of the process, onnxruntime's
too; onnxruntime's own profile would time launches, not kernels): per step the wall time, the
GPU's busy time and kernel count, and the slowest kernels by name, then the same for PyTorch
eager's step on the GPU. A step much longer than its GPU time is bound by kernel launches.
``--cuda-graph`` profiles graphc's steps replayed as CUDA graphs (``Trainer(cuda_graph=True)``;
the two warm-up steps capture them).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import bench_zoo as zoo  # noqa: E402 - the architectures, export and batches of the benchmark

import graphc as gc
from graphc.passes.training import flat


PRODUCTS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul", "Einsum", "FusedConv", "FusedGemm"})
# PyTorch's (CPU) matrix products, convolutions and fused attention, forward and backward
TORCH_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
                  "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def label(node, weights: dict[str, list[int]]) -> str:
    """The node's op type; for a Conv its kind too (depthwise, grouped, 1x1, kxk) and stride.
    ``weights``: the graph's initializer and input shapes by name."""
    if node.op_type != "Conv":
        return node.op_type
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    w = weights.get(node.input[1])
    group, kernel = attrs.get("group", 1), attrs.get("kernel_shape") or (w[2:] if w else "?")
    kind = "x".join(map(str, kernel))
    if w is not None and group > 1:
        kind = f"dw{kind}" if w[1] == 1 else f"g{kind}"
    stride = max(attrs.get("strides", [1]))
    return f"Conv {kind}" + (f" s{stride}" if stride > 1 else "")


def charge(events: list[dict], forward_ops: dict[str, str]) -> dict[tuple[str, str], collections.Counter]:
    """(forward op, phase) -> Counter of the kernel op types' microseconds."""
    table: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        name, op = e["name"].removesuffix("_kernel_time"), e["args"]["op_name"]
        if name.startswith("optim/"):
            key = ("optimizer", "update")
        elif name.startswith("bn/"):
            key = ("BatchNormalization", "forward")
        elif "/grad/" in name:  # a forward node lowered after autodiff (BatchNorm) is named by its op
            forward = name.split("/grad/")[0]
            key = (forward_ops.get(forward, forward.rsplit("/", 1)[-1]), "backward")
        elif name.startswith("loss/"):
            key = ("loss", "both")
        else:
            key = (forward_ops.get(name, op), "forward")
        table[key][op] += e["dur"]
    return table


def fastest_runs(events: list[dict], runs: int) -> list[dict]:
    """One event per node of ``runs`` runs' kernel ``events``: its duration in the run where its
    occurrences (a node in a loop runs several times a run) took least."""
    by_node: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_node[e["name"]].append(e)
    fastest = []
    for seen in by_node.values():
        seen.sort(key=lambda e: e["ts"])
        each = len(seen) // runs or 1  # occurrences a run
        durs = [sum(e["dur"] for e in seen[i:i + each]) for i in range(0, len(seen), each)]
        fastest.append(seen[0] | {"dur": min(durs)})
    return fastest


def update_classes(events: list[dict]) -> dict[str, list[float]]:
    """The ``optim/...`` kernel events (of any number of runs) by class, each node counted at its
    fastest run (on a loaded machine a preempted thread stretches a node, not the other way):
    "chain" (an elementwise node over a group of up to ``flat.CHUNK_ELEMENTS`` elements),
    "chain N" (over a larger group of N), "scalar" (a result of one element: bias corrections,
    the step counter), else "flat <op>" / "other <op>" (the flat groups' views, Concats and
    Splits); each class's [ms of a run, nodes, element-passes of a run] (elements counted in
    4-byte words: float32's)."""
    fastest: dict[str, list] = {}
    for e in events:
        name = e["name"].removesuffix("_kernel_time")
        if name.startswith("optim/"):
            elements = int(e["args"].get("output_size", 0)) // 4
            seen = fastest.setdefault(name, [e["dur"], e["args"]["op_name"], elements])
            seen[0] = min(seen[0], e["dur"])
    table: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0])
    for name, (dur, op, elements) in fastest.items():
        if elements <= 2:
            kind = "scalar"
        elif op in ("Add", "Sub", "Mul", "Div", "Sqrt"):
            kind = "chain" if elements <= flat.CHUNK_ELEMENTS else f"chain {elements}"
        else:
            kind = f"{'flat' if 'optim/flat/' in name else 'other'} {op}"
        row = table[kind]
        row[0] += dur / 1e3
        row[1] += 1
        row[2] += elements
    return dict(table)


def print_update(events: list[dict], alone: list[dict], floor: list[dict]) -> None:
    """Print ``update_classes`` of the train_step's ``events`` beside those of the update alone
    and the chain floor's (``bench_zoo.chain_floor_ms``'s graph)."""
    step, by_itself, bare = update_classes(events), update_classes(alone), update_classes(floor)
    passes = sum(r[2] for k, r in bare.items() if k.startswith("chain"))
    floor_chain = sum(r[0] for k, r in bare.items() if k.startswith("chain"))
    print(f"update: {sum(r[0] for r in step.values()):.2f} ms of kernel time in the step, "
          f"{sum(r[0] for r in by_itself.values()):.2f} ms alone (same groups), each node at its fastest run; "
          f"the chain floor {sum(r[0] for r in bare.values()):.2f} ms, {1e6 * floor_chain / passes:.3f} ns per "
          f"element and pass (groups of up to {flat.CHUNK_ELEMENTS})")
    for kind, row in sorted(step.items(), key=lambda kv: -kv[1][0]):
        other = by_itself.get(kind, [0.0] * 3)
        rate = (f", {1e6 * row[0] / row[2]:.3f} ns per element and pass (alone {1e6 * other[0] / other[2]:.3f})"
                if kind.startswith("chain") and row[2] and other[2] else "")
        print(f"  {kind:<16} {row[1]:5.0f} nodes {row[0]:8.2f} ms (alone {other[0]:.2f}){rate}")


def profiled(step, runs: int, device: str = "cpu"):
    """(torch.profiler's record, wall ms per step) of ``runs`` calls of ``step(i)`` after two:
    the CPU's ops, or on ``"cuda"`` the GPU's kernels (CUPTI), the device synchronized around,
    after four there (a graphed Trainer's first steps are plain runs and graph captures, which
    run the step several times: counted in, a graphed ResNet-50 step showed 62 pageable copies
    and thousands of kernels that its replays do not have)."""
    from torch.profiler import ProfilerActivity, profile

    sync = zoo.torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for i in range(4 if device == "cuda" else 2):
        step(i)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(runs):
            step(i)
        sync()
        wall = (time.perf_counter() - t0) / runs * 1e3
    return prof, wall


def profile_torch(model, batch: dict, runs: int, top: int, fastest: bool = False) -> None:
    """PyTorch eager's training step of ``model`` (as bench_zoo times it), profiled over ``runs``
    steps after two: self time per aten op, and the matrix products' total. ``fastest``: each
    step profiled alone, each op's time its fastest step's (``--fastest``)."""
    zoo.torch.set_num_threads(zoo.THREADS)
    step = zoo.torch_stepper(model, [batch])
    if fastest:
        walls, ops = [], {}
        for i in range(runs):
            prof, wall = profiled(lambda j: step(i + j), 1)
            walls.append(wall)
            for e in prof.key_averages():
                ops[e.key] = min(ops.get(e.key, float("inf")), e.self_cpu_time_total / 1e3)
        wall = min(walls)
    else:
        prof, wall = profiled(step, runs)
        ops = {e.key: e.self_cpu_time_total / runs / 1e3 for e in prof.key_averages()}
    products = sum(ops.get(k, 0.0) for k in TORCH_PRODUCTS)
    print(f"PyTorch eager: {wall:.1f} ms per step{' (fastest)' if fastest else ''} (profiling on), "
          f"{sum(ops.values()):.1f} ms of self time; "
          f"matrix products, convolutions and attention {products:.1f} ms ({100 * products / wall:.0f}% "
          f"of the step)")
    for name, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {name:<60} {ms:8.1f} ms")


def profile_cuda_kernels(step, runs: int, top: int, who: str) -> None:
    """Print ``who``'s wall and GPU time per step over ``runs`` calls of ``step(i)`` (after two),
    its kernels per step and the ``top`` kernels by GPU time, from a CUPTI trace."""
    prof, wall = profiled(step, runs, "cuda")
    kernels = [(e.self_device_time_total / runs / 1e3, e.count / runs, e.key) for e in prof.key_averages()
               if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    kernels.sort(reverse=True)
    print(f"{who}: {wall:.1f} ms per step (profiling on), GPU busy {sum(k[0] for k in kernels):.1f} ms, "
          f"{sum(k[1] for k in kernels):.0f} kernels per step")
    for ms, count, name in kernels[:top]:
        print(f"  {ms:7.2f} ms {count:6.0f}x  {name[:110]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", choices=sorted(zoo.ZOO))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--nodes", type=int, default=0, help="also list the N slowest nodes")
    p.add_argument("--torch", action="store_true", help="also profile PyTorch eager's step by aten op")
    p.add_argument("--fastest", action="store_true",
                   help="charge each node (each aten op) its fastest run, not the mean: for a shared machine")
    p.add_argument("--update", action="store_true", help="also split the optimizer update's time by node class")
    p.add_argument("--threads", type=int, default=zoo.THREADS, help="onnxruntime's threads on the CPU")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: GPU kernel times of graphc on ort-cuda and of PyTorch eager on the GPU")
    p.add_argument("--cuda-graph", action="store_true", help="with --device cuda: graphc replays CUDA graphs")
    args = p.parse_args()
    if args.cuda_graph and args.device != "cuda":
        p.error("--cuda-graph needs --device cuda")
    zoo.THREADS = args.threads  # the profiled sessions' (``profiled_runs``)
    torch_runs = args.runs  # (``--fastest`` charges one run's time: args.runs becomes 1)
    zoo.torch.manual_seed(0)
    arch = zoo.ZOO[args.model]
    batch = zoo.make_batch(arch, args.batch, args.image_size)
    with tempfile.TemporaryDirectory(prefix="profile-step-") as tmp:
        tmp = Path(tmp)
        zoo.export_onnx(arch.build(args.image_size), batch, tmp / "model.onnx")
        arts = gc.training.generate(gc.load(tmp / "model.onnx"), gc.losses.cross_entropy("logits", label="y"),
                                    gc.optim.AdamW(zoo.LR), device=args.device)
        if args.device == "cuda":
            trainer = gc.Trainer(arts, **zoo.backend_options(args.device, args.cuda_graph))
            profile_cuda_kernels(lambda i: trainer.step(batch), args.runs, args.top, f"graphc (ort-cuda) {args.model}")
            zoo.torch.manual_seed(0)
            step = zoo.torch_stepper(arch.build(args.image_size), [batch], device="cuda")
            profile_cuda_kernels(step, args.runs, args.top, "PyTorch eager (cuda)")
            return
        graph = arts.train_step.proto.graph
        weights = {t.name: list(t.dims) for t in graph.initializer} | {
            i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
        forward_ops = {n.name: label(n, weights) for n in graph.node}
        events, walls = zoo.profile_kernels(arts, batch, tmp, args.runs + 2)
        print(f"wall per run: {statistics.median(walls) * 1e3:.1f} ms (profiling on)")
        if args.update:
            print_update(events, zoo.update_kernels(arts, tmp, args.runs + 2),
                         zoo.chain_floor_kernels(arts, tmp, args.runs + 2))
        if args.fastest:
            events, args.runs = fastest_runs(events, args.runs), 1
        table = charge(events, forward_ops)
    total = sum(sum(c.values()) for c in table.values())
    print(f"{args.model} batch {args.batch}, {args.image_size} px: {total / args.runs / 1e3:.1f} ms of kernel "
          f"time per step{' (each node at its fastest run)' if args.fastest else ''}")
    rows = sorted(table.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]
    for (op, phase), ops in rows:
        spent = sum(ops.values())
        inner = ", ".join(f"{k} {v / args.runs / 1e3:.1f}" for k, v in ops.most_common(5))
        print(f"{op:<22} {phase:<9} {spent / args.runs / 1e3:8.1f} ms {100 * spent / total:5.1f}%   {inner}")
    by_kernel = collections.Counter()
    for ops in table.values():
        by_kernel.update(ops)
    products = sum(v for k, v in by_kernel.items() if k in PRODUCTS)
    print(f"kernels: {', '.join(f'{k} {v / args.runs / 1e3:.1f}' for k, v in by_kernel.most_common(8))} ms; "
          f"matrix products and convolutions ({', '.join(sorted(PRODUCTS))}) {products / args.runs / 1e3:.1f} ms")
    per_node = collections.Counter()
    for e in events:
        per_node[(e["args"]["op_name"], e["name"].removesuffix("_kernel_time"))] += e["dur"]
    for (op, name), spent in per_node.most_common(args.nodes):
        print(f"{spent / args.runs / 1e3:8.2f} ms  {op:<18} {name}")
    if args.torch:
        zoo.torch.manual_seed(0)
        profile_torch(arch.build(args.image_size), batch, torch_runs, args.top, args.fastest)


if __name__ == "__main__":
    main()
