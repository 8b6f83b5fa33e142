"""Median time per training step, all measured in this one run, at 2 threads:

    graphc on onnxruntime CPU, graphc on numpy, a hand-written numpy forward/backward,
    PyTorch eager (when installed), onnxsim's compile_training_loop (when it has one)

for the MLP 784-512-512-10 (batch 128, SGD) and the LeNet CNN (1x28x28, batch 64, SGD).

    .venv/bin/python scripts/bench_train.py [--rounds 10] [--per-round 5] [--numpy-per-round 1]

Every row runs the same architecture, loss (softmax cross-entropy, mean) and update rule
(plain SGD; onnxsim has no plain SGD, so it runs its "sgd_momentum"). The timed region of a step
is what a training loop pays per step: feed the batch, forward, backward, update, read the loss.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

THREADS = 2
LR = 0.01
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(THREADS))

import graphc as gc  # noqa: E402
from graphc import nn  # noqa: E402
from graphc.models.cnn import LeNet  # noqa: E402


class MLP(nn.Module):
    """784-512-512-10 with ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc3(gc.relu(self.fc2(gc.relu(self.fc1(x)))))


CASES = {
    "mlp 784-512-512-10, batch 128": dict(factory=MLP, shape=(784,), batch=128),
    "cnn LeNet 1x28x28, batch 64": dict(factory=LeNet, shape=(1, 28, 28), batch=64),
}


# Each turn of an interleaved benchmark times the framework's steady state, not the switch to it:
# untimed steps first, for SETTLE_S at least. onnxruntime's intra-op threads spin on after a
# run, and PyTorch's OpenMP threads after theirs; on 2 cores the other framework's next steps
# paid for it, and found the caches full of the other's data. PyTorch's ResNet-18 step at batch
# 32, 64 px: 146-157 ms right after graphc's, 113-116 from its second step on; graphc's 134-141,
# then 130-133. Timed from the switch with 2 steps a turn, ``bench_zoo`` took PyTorch's slow first
# steps for half its timings and gave ResNet-18 0.91x PyTorch's step time where its steady state
# is 1.16x. A pause instead lets both thread pools park, which a training loop never sees (on
# LeNet's 2-4 ms steps the next several steps of either paid for waking them).
SETTLE_S = 0.1


def timed_turn(step: Callable[[int], float], count: int) -> list[float]:
    """One stepper's turn: untimed steps for ``SETTLE_S`` at least (one at least), then the
    seconds of ``count`` timed steps (batch indices 0, 1, ...)."""
    settled, i = time.perf_counter() + SETTLE_S, count
    step(i)
    while time.perf_counter() < settled:
        i += 1
        step(i)
    seconds = []
    for i in range(count):
        t0 = time.perf_counter()
        step(i)
        seconds.append(time.perf_counter() - t0)
    return seconds


def interleaved_turns(steps: dict[str, tuple[Callable[[int], float], int]], rounds: int,
                      warmup: int) -> dict[str, list[list[float]]]:
    """Each stepper's turns, the seconds of its timed steps in each: after ``warmup`` steps each,
    the steppers take turns (``timed_turn``, ``count`` timed steps each, ``rounds`` times), so a
    busy machine slows every row alike instead of whichever ran last."""
    for step, _ in steps.values():
        for i in range(warmup):
            step(i)
    turns: dict[str, list[list[float]]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (step, count) in steps.items():
            turns[name].append(timed_turn(step, count))
    return turns


def interleaved_times(steps: dict[str, tuple[Callable[[int], float], int]], rounds: int,
                        warmup: int = 3) -> dict[str, tuple[float, float]]:
    """(median, fastest) ms per step of each stepper, its ``per_round`` steps a turn timed
    over ``rounds`` rounds (``interleaved_turns``)."""
    times = {}
    for name, turns in interleaved_turns(steps, rounds, warmup).items():
        seconds = [t for turn in turns for t in turn]
        times[name] = (statistics.median(seconds) * 1e3, min(seconds) * 1e3)
    return times


def make_batches(shape, batch, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, *shape)).astype(np.float32),
             "y": rng.integers(0, 10, batch).astype(np.int64)} for _ in range(n)]


# -- graphc --------------------------------------------------------------------------------------

def graphc_step(case, backend: str):
    model = gc.capture(case["factory"](), seed=0, x=gc.spec("float32", ("N", *case["shape"])))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(LR))
    options = {"threads": THREADS} if backend.startswith("ort") else {}
    trainer = gc.Trainer(arts, backend=backend, **options)
    batches = make_batches(case["shape"], case["batch"])
    return lambda i: trainer.step(batches[i % len(batches)])


def graphc_generate_seconds(factory, inputs) -> float:
    model = gc.capture(factory(), seed=0, **inputs)
    out = model.outputs[0]
    # class logits [N, C] -> cross-entropy; anything else (e.g. per-token features) -> mse
    loss = gc.losses.cross_entropy(out.name, label="y") if out.rank == 2 else gc.losses.mse(out.name, label="y")
    t0 = time.perf_counter()
    gc.training.generate(model, loss, gc.optim.AdamW(1e-3))
    return time.perf_counter() - t0


# -- hand-written numpy ----------------------------------------------------------------------------

def _xent_grad(logits, y):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    p[np.arange(n), y] -= 1
    return float(loss), p / n


def _init_linear(rng, fan_in, fan_out):
    bound = 1 / np.sqrt(fan_in)
    return [rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
            rng.uniform(-bound, bound, fan_out).astype(np.float32)]


def _mlp_fwd_bwd(x, y, w1, b1, w2, b2, w3, b3):
    """Cross-entropy of Linear-ReLU-Linear-ReLU-Linear on ``x``: (loss, d loss/d first-layer
    pre-activation, the six parameter gradients)."""
    h1 = np.maximum(x @ w1.T + b1, 0)
    h2 = np.maximum(h1 @ w2.T + b2, 0)
    loss, d3 = _xent_grad(h2 @ w3.T + b3, y)
    d2 = (d3 @ w3) * (h2 > 0)
    d1 = (d2 @ w2) * (h1 > 0)
    return loss, d1, [d1.T @ x, d1.sum(0), d2.T @ h1, d2.sum(0), d3.T @ h2, d3.sum(0)]


def numpy_mlp_step(case):
    rng = np.random.default_rng(0)
    params = _init_linear(rng, 784, 512) + _init_linear(rng, 512, 512) + _init_linear(rng, 512, 10)
    batches = make_batches(case["shape"], case["batch"])

    def step(i):
        x, y = batches[i % len(batches)]["x"], batches[i % len(batches)]["y"]
        loss, _, grads = _mlp_fwd_bwd(x, y, *params)
        for p, g in zip(params, grads):
            p -= LR * g
        return loss

    return step


def _im2col(x, k, pad):
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = x.shape
    oh, ow = h - k + 1, w - k + 1
    s = x.strides
    cols = np.lib.stride_tricks.as_strided(x, (n, c, k, k, oh, ow), (s[0], s[1], s[2], s[3], s[2], s[3]))
    return cols.reshape(n, c * k * k, oh * ow), (oh, ow), x.shape


def _col2im(dcols, xshape, k, pad):
    n, c, h, w = xshape
    oh, ow = h - k + 1, w - k + 1
    dx = np.zeros(xshape, np.float32)
    d = dcols.reshape(n, c, k, k, oh, ow)
    for i in range(k):
        for j in range(k):
            dx[:, :, i:i + oh, j:j + ow] += d[:, :, i, j]
    return dx[:, :, pad:h - pad, pad:w - pad] if pad else dx


def _conv_fwd(x, w, b, pad):
    cols, (oh, ow), xshape = _im2col(x, w.shape[-1], pad)
    out = np.einsum("ok,nkp->nop", w.reshape(w.shape[0], -1), cols, optimize=True) + b[None, :, None]
    return out.reshape(x.shape[0], w.shape[0], oh, ow), (cols, xshape)


def _conv_bwd(dy, x_cache, w, pad):
    cols, xshape = x_cache
    n, o = dy.shape[:2]
    dy2 = dy.reshape(n, o, -1)
    dw = np.einsum("nop,nkp->ok", dy2, cols, optimize=True).reshape(w.shape)
    db = dy2.sum(axis=(0, 2))
    dcols = np.einsum("ok,nop->nkp", w.reshape(o, -1), dy2, optimize=True)
    return _col2im(dcols, xshape, w.shape[-1], pad), dw, db


def _pool_fwd(x):
    n, c, h, w = x.shape
    r = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = r.max(axis=(3, 5))
    mask = r == out[:, :, :, None, :, None]
    return out, mask


def _pool_bwd(dy, mask):
    d = mask * dy[:, :, :, None, :, None]
    n, c, h2, _, w2, _ = d.shape
    return d.reshape(n, c, h2 * 2, w2 * 2)


def numpy_cnn_step(case):
    rng = np.random.default_rng(0)

    def conv_init(o, i, k):
        bound = 1 / np.sqrt(i * k * k)
        return [rng.uniform(-bound, bound, (o, i, k, k)).astype(np.float32),
                rng.uniform(-bound, bound, o).astype(np.float32)]

    params = conv_init(6, 1, 5) + conv_init(16, 6, 5) + _init_linear(rng, 400, 120) + \
        _init_linear(rng, 120, 84) + _init_linear(rng, 84, 10)
    batches = make_batches(case["shape"], case["batch"])

    def step(i):
        x, y = batches[i % len(batches)]["x"], batches[i % len(batches)]["y"]
        cw1, cb1, cw2, cb2, w1 = params[:5]
        c1, cache1 = _conv_fwd(x, cw1, cb1, 2)
        r1 = np.maximum(c1, 0)
        p1, m1 = _pool_fwd(r1)
        c2, cache2 = _conv_fwd(p1, cw2, cb2, 0)
        r2 = np.maximum(c2, 0)
        p2, m2 = _pool_fwd(r2)
        loss, dh1, head_grads = _mlp_fwd_bwd(p2.reshape(len(x), -1), y, *params[4:])
        df = (dh1 @ w1).reshape(p2.shape)
        dc2 = _pool_bwd(df, m2) * (c2 > 0)
        dp1, dcw2, dcb2 = _conv_bwd(dc2, cache2, cw2, 0)
        dc1 = _pool_bwd(dp1, m1) * (c1 > 0)
        _, dcw1, dcb1 = _conv_bwd(dc1, cache1, cw1, 2)
        grads = [dcw1, dcb1, dcw2, dcb2, *head_grads]
        for p, g in zip(params, grads):
            p -= LR * g
        return loss

    return step


# -- PyTorch eager ----------------------------------------------------------------------------------

def torch_step(case):
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    if case["factory"] is MLP:
        net = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                  torch.nn.ReLU(), torch.nn.Linear(512, 10))
    else:
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
            torch.nn.Linear(400, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU(),
            torch.nn.Linear(84, 10))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    batches = make_batches(case["shape"], case["batch"])

    def step(i):
        b = batches[i % len(batches)]
        x, y = torch.from_numpy(b["x"]), torch.from_numpy(b["y"])
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


# -- onnxsim ----------------------------------------------------------------------------------------

def onnxsim_step(case):
    import onnxruntime
    import onnxsim
    import onnxsim.backend as osb

    class _TwoThreads:  # onnxsim builds its sessions with default options; pin them to 2 threads
        def __getattr__(self, name):
            return getattr(onnxruntime, name)

        def SessionOptions(self):  # noqa: N802 - mirrors onnxruntime's name
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = THREADS
            return options

    osb.rt = _TwoThreads()
    batch = case["batch"]

    class WithLoss(nn.Module):  # onnxsim wants the loss inside the model, and static shapes
        def __init__(self):
            super().__init__()
            self.net = case["factory"]()

        def forward(self, x, y):
            # Cross-entropy on one-hot labels from ops onnxsim can differentiate (its rule table
            # has no Cast or LogSoftmax, which graphc's integer-label cross_entropy uses).
            return -(y * gc.log(gc.softmax(self.net(x), axis=1))).sum(axis=1).mean()

    model = gc.capture(WithLoss(), seed=0, x=gc.spec("float32", (batch, *case["shape"])),
                       y=gc.spec("float32", (batch, 10)))
    params = list(model.params)
    loop = onnxsim.compile_training_loop(_constants_as_initializers(model.proto), model.outputs[0].name, params, optimizer="sgd_momentum")
    batches = [{"x": b["x"], "y": np.eye(10, dtype=np.float32)[b["y"]]} for b in make_batches(case["shape"], batch)]
    return lambda i: loop(batches[i % len(batches)], lr=LR)


def _constants_as_initializers(proto):
    """onnxsim's backward builder has no rule for Constant or Flatten: make Constants
    initializers and Flatten(axis=1) a Reshape to [0, -1] (the same computation)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    keep = []
    for node in out.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            out.graph.initializer.append(tensor)
        elif node.op_type == "Flatten" and all(a.i == 1 for a in node.attribute if a.name == "axis"):
            shape_name = f"{node.name or node.output[0]}/shape"
            out.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0, -1], np.int64), shape_name))
            keep.append(onnx.helper.make_node("Reshape", [node.input[0], shape_name], list(node.output),
                                              name=node.name))
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


# -- driver -----------------------------------------------------------------------------------------

def threadpool_limit():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=THREADS)


def build(make, case):
    """(step function, None) or (None, why it is missing)."""
    if make is None:
        return None, "not available"
    try:
        return make(case), ""
    except ImportError as exc:
        return None, f"not available ({exc.name or exc})"
    except Exception as exc:  # noqa: BLE001 - a failing competitor is reported, not fatal
        return None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="turns each row takes")
    parser.add_argument("--per-round", type=int, default=5, help="timed steps per turn (fast rows)")
    parser.add_argument("--numpy-per-round", type=int, default=1, help="timed steps per turn (numpy-backend rows)")
    args = parser.parse_args()
    limiter = threadpool_limit()
    has_onnxsim_loop = False
    try:
        import onnxsim

        has_onnxsim_loop = hasattr(onnxsim, "compile_training_loop")
    except ImportError:
        pass
    rows = [
        ("graphc ort-cpu", lambda c: graphc_step(c, "ort-cpu"), args.per_round),
        ("graphc numpy", lambda c: graphc_step(c, "numpy"), args.numpy_per_round),
        ("hand-written numpy", lambda c: (numpy_mlp_step if c["factory"] is MLP else numpy_cnn_step)(c),
         args.numpy_per_round),
        ("pytorch eager", torch_step, args.per_round),
        ("onnxsim compile_training_loop", onnxsim_step if has_onnxsim_loop else None, args.per_round),
    ]
    print(f"ms per training step (median and fastest), {THREADS} threads "
          f"(numpy threads {'limited by threadpoolctl' if limiter else 'from *_NUM_THREADS'}); "
          f"rows take turns, {args.rounds} rounds")
    for case_name, case in CASES.items():
        print(f"\n{case_name}")
        built = {name: (build(make, case), per_round) for name, make, per_round in rows}
        ready = {name: (step, per_round) for name, ((step, _), per_round) in built.items() if step is not None}
        medians = interleaved_times(ready, args.rounds)
        print(f"  {'':32s} {'median':>12s} {'fastest':>12s}")
        for name, ((step, why), _) in built.items():
            if step is None:
                print(f"  {name:32s} {why}")
            else:
                print(f"  {name:32s} {medians[name][0]:9.3f} ms {medians[name][1]:9.3f} ms", flush=True)
        if "pytorch eager" in medians and "graphc ort-cpu" in medians:
            (ref, ref_min), (ours, ours_min) = medians["pytorch eager"], medians["graphc ort-cpu"]
            print(f"  pytorch eager / graphc ort-cpu: {ref / ours:.2f}x by median "
                  f"({'graphc as fast or faster' if ours <= ref else 'graphc slower'}), "
                  f"{ref_min / ours_min:.2f}x by fastest step")

    from graphc.models import EXAMPLES

    print("\ngc.training.generate time (AdamW)")
    for label in ("resnet", "transformer"):
        factory, inputs = EXAMPLES[label]
        try:
            print(f"  {label:12s} {graphc_generate_seconds(factory, inputs()):.2f} s")
        except Exception as exc:  # noqa: BLE001
            print(f"  {label:12s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")

if __name__ == "__main__":
    main()
