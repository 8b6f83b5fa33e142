"""Probe the features added since graphc last ran on a GPU, on ort-cuda against ort-cpu.

    python scripts/gpu_probe.py [--cpu] [--json probe.json]

One line per check, ``PASS``, ``FAIL`` or ``SKIP``, with its numbers: training in float32 and under
``generate(autocast=...)`` (float16 with ``loss_scale``, bfloat16), a skipped loss-scaled step keeping
every bit (-0.0, inf, NaN), onnxruntime's own ``Where`` kernel on -0.0 (``backends/selects.py``
rewrites it on ort-cpu only), ``Session.run(cancel=)`` stopping a Loop, ``gc.convert_float``
models, and the Trainer's kept IOBindings (the same bindings every step, memory held growing by
nothing per step: GPU memory from NVML or torch, else the process's RSS). Errors are the largest
difference relative to the reference's largest magnitude (losses, outputs), or the relative
2-norm of the difference, the largest over the float params and optimizer states (training). The target is ort-cuda with float32 in
full precision (``use_tf32=0``) and its reference ort-cpu; ``--cpu`` runs the same checks on
ort-cpu against the numpy backend, for a machine without a GPU. Exits 1 on a FAIL, 2 when the
target is unavailable (each check a SKIP with the reason), else 0. Used by ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphc as gc
from graphc import nn
from graphc.backends import onnxruntime as ort_backend
from graphc.backends.cancel import CancelToken
from graphc.errors import RunCancelled

STEPS = 5
# largest error (relative to the reference's largest magnitude) each check passes with
TOLERANCE = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 5e-2}
CONVERT_TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2}  # docs/api.md measured 0.9e-3 and 6.2e-3
CANCEL_WITHIN_S = 1.0
GROWTH_BYTES = {"gpu": 0, "rss": 256 * 1024}  # memory held may grow per step (RSS: Python's own noise)


class Net(nn.Module):
    """Conv -> ReLU -> MaxPool -> Linear -> ReLU -> Linear: cuDNN convolutions and GEMMs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.pool(gc.relu(self.conv(x))).reshape(x.shape[0], -1)
        return {"logits": self.fc2(gc.relu(self.fc1(h)))}


def batch(seed: int, n: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
            "y": rng.integers(0, 4, n).astype(np.int64)}


def captured() -> gc.Model:
    return gc.capture(Net(), seed=0, x=gc.spec("float32", ("N", 3, 8, 8)))


def norm_err(got: np.ndarray, want: np.ndarray) -> float:
    """The relative 2-norm of the difference: one flipped ReLU in float16 is not the whole tensor."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


class Probe:
    """The checks on ``target`` against ``reference`` (backend names) and their results."""

    def __init__(self, target: str, reference: str):
        self.target, self.reference = target, reference
        self.device = "cuda" if target == "ort-cuda" else "cpu"
        self.results: list[dict] = []

    def options(self, backend: str) -> dict:
        return {"providers_options": {"use_tf32": "0"}} if backend == "ort-cuda" else {}

    def record(self, name: str, ok: bool | None, numbers: dict, note: str = "") -> None:
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.results.append({"check": name, "status": status, **numbers, "note": note})
        shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in numbers.items())
        print(f"{status} {name}: {shown}{'; ' + note if note else ''}", flush=True)

    def run(self, name: str, check: Callable[[], tuple[bool, dict, str]]) -> None:
        start = time.perf_counter()
        try:
            ok, numbers, note = check()
        except Exception as exc:  # noqa: BLE001 - a check's failure is its result, with why
            ok, numbers, note = False, {}, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        self.record(name, ok, {**numbers, "s": round(time.perf_counter() - start, 2)}, note)

    # -- training --------------------------------------------------------------------------------
    def trainer(self, arts: gc.TrainingArtifacts, backend: str) -> gc.Trainer:
        return gc.Trainer(arts, backend=backend, **self.options(backend))

    def train(self, autocast: str | None) -> tuple[bool, dict, str]:
        """STEPS SGD steps (with momentum: the first step's buffers are its gradients) of the same
        artifacts on both backends: the losses, and the state after the first step (after more, a
        float16 rounding that flips one ReLU of a 16-row batch moves a gradient by its whole size;
        AdamW's steps of a sign's size would make whole steps of rounding too)."""
        scaler = gc.amp.GradScaler() if autocast == "float16" else None
        arts = gc.training.generate(captured(), gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.05, momentum=0.9),
                                    device=self.device, autocast=autocast, loss_scale=scaler)
        runs = []
        for backend in (self.target, self.reference):
            trainer = self.trainer(arts, backend)
            losses = [trainer.step(batch(0))]
            first = trainer.state_dict()
            losses += [trainer.step(batch(seed)) for seed in range(1, STEPS)]
            runs.append((np.array(losses), first))
        (losses, state), (ref_losses, ref_state) = runs
        loss_err = rel_err(losses, ref_losses)
        errs = {k: norm_err(state[k], ref_state[k]) for k in ref_state if ref_state[k].dtype.kind == "f"}
        worst = max(errs, key=errs.get)
        tol = TOLERANCE[autocast or "float32"]
        return max(loss_err, errs[worst]) <= tol, {"loss_err": loss_err, "state_err": errs[worst], "tol": tol}, \
            f"worst: {worst}"

    def skipped_step(self) -> tuple[bool, dict, str]:
        """float16 autocast, loss scaled: an overflowing batch's step is skipped and leaves every
        param and optimizer state bit for bit, -0.0, inf and NaN planted in them included."""
        arts = gc.training.generate(captured(), gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(1e-2),
                                    device=self.device, autocast="float16", loss_scale=gc.amp.GradScaler())
        rng = np.random.default_rng(0)
        specials = np.array([-0.0, -np.inf, np.nan, 0.0], np.float32)
        for name, value in list(arts.state.items()):
            if value.ndim and value.dtype == np.float32:
                value = rng.standard_normal(value.shape).astype(np.float32)
                value.flat[::2] = np.resize(specials, value.flat[::2].size)
                arts.state[name] = value
        trainer = self.trainer(arts, self.target)
        before = trainer.state_dict()
        overflow = batch(0)
        overflow["x"][0, 0, 0, 0] = np.inf
        trainer.step(overflow)
        after = trainer.state_dict()
        skip = {"loss_scale", "loss_scale.growth_tracker", "loss_scale.skipped_steps"}
        changed = [k for k, v in before.items() if k not in skip and v.tobytes() != after[k].tobytes()]
        negzero = sum(int(np.sum(np.signbit(v) & (v == 0))) for k, v in after.items()
                      if k not in skip and v.dtype.kind == "f")
        ok = trainer.skipped_steps == 1 and not changed
        return ok, {"skipped": trainer.skipped_steps, "entries_changed": len(changed), "negzero_kept": negzero,
                    "scale": float(trainer.loss_scale)}, f"changed: {', '.join(changed[:4])}" if changed else ""

    def kept_bindings(self) -> tuple[bool, dict, str]:
        """After warm-up, the same kept IOBindings run every step and the memory held stays put."""
        arts = gc.training.generate(captured(), gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(1e-2),
                                    device=self.device)
        trainer = self.trainer(arts, self.target)
        meter, where = memory_meter(self.device)
        for seed in range(5):
            trainer.step(batch(seed))
        bound = [b for b, _ in trainer._train._bindings.kept.values()]
        steps, held = 40, meter()
        for seed in range(steps):
            trainer.step(batch(seed))
        growth = (meter() - held) / steps
        now = [b for b, _ in trainer._train._bindings.kept.values()]
        same = len(now) == len(bound) > 0 and all(any(a is b for b in bound) for a in now)
        return same and growth <= GROWTH_BYTES[where], {"bindings": len(now), "same_bindings": same,
                                                        f"{where}_bytes_per_step": growth}, ""

    # -- sessions --------------------------------------------------------------------------------
    def where_negzero(self) -> tuple[bool, dict, str]:
        """Where(cond[1] true, X, Y) with -0.0 in X: onnxruntime's own kernel on the target's
        provider, and graphc's Session (which rewrites it on ort-cpu only)."""
        model = where_model()
        x = np.array([-0.0, 1.0, -0.0, -2.0], np.float32)
        feeds = {"c": np.array([True]), "x": x, "y": np.full(4, 7.0, np.float32)}
        provider = "CUDAExecutionProvider" if self.device == "cuda" else "CPUExecutionProvider"
        ort = ort_backend._ort()
        raw = ort.InferenceSession(model.SerializeToString(), providers=[provider])
        raw_out = raw.run(None, feeds)[0]
        ours = gc.Session(model, backend=self.target, **self.options(self.target)).run(feeds)["z"]
        raw_keeps, ours_keeps = (bool(np.array_equal(np.signbit(o), np.signbit(x))) for o in (raw_out, ours))
        note = (f"{provider}'s Where {'keeps' if raw_keeps else 'loses'} -0.0: "
                f"selects.py's rewrite is {'needless' if raw_keeps else 'needed'} on {self.target}")
        return ours_keeps, {"kernel_keeps_negzero": raw_keeps, "session_keeps_negzero": ours_keeps}, note

    def cancel(self) -> tuple[bool, dict, str]:
        """A Loop of 1e12 trips, cancelled from another thread after 0.2 s, stops within CANCEL_WITHIN_S."""
        session = gc.Session(loop_model(), backend=self.target, **self.options(self.target))
        token = CancelToken()
        timer = threading.Timer(0.2, token.cancel)
        timer.start()
        start = time.perf_counter()
        try:
            session.run({"x": np.zeros(1, np.float32)}, cancel=token)
        except RunCancelled:
            stopped = time.perf_counter() - start - 0.2
            return stopped <= CANCEL_WITHIN_S, {"stopped_after_cancel_s": stopped}, ""
        finally:
            timer.cancel()
        return False, {}, "the Loop ran to its end: not cancelled"

    def convert(self, dtype: str) -> tuple[bool, dict, str]:
        """gc.convert_float(dtype) of the CNN on both backends against the float32 model's output."""
        model = captured()
        x = batch(1)["x"]
        want = gc.Session(model, backend=self.reference).run({"x": x})["logits"]
        half = gc.convert_float(model, dtype=dtype, keep_io_types=True)
        errs = {f"{name}_err": rel_err(gc.Session(half, backend=b, **self.options(b)).run({"x": x})["logits"], want)
                for name, b in (("target", self.target), ("reference", self.reference))}
        tol = CONVERT_TOLERANCE[dtype]
        return errs["target_err"] <= tol, {**errs, "tol": tol}, ""

    def all(self) -> None:
        self.run("train_float32", lambda: self.train(None))
        self.run("autocast_float16_loss_scaled", lambda: self.train("float16"))
        self.run("autocast_bfloat16", lambda: self.train("bfloat16"))
        self.run("loss_scale_skipped_step_bits", self.skipped_step)
        self.run("where_negzero", self.where_negzero)
        self.run("cancel_loop", self.cancel)
        self.run("convert_float16", lambda: self.convert("float16"))
        self.run("convert_bfloat16", lambda: self.convert("bfloat16"))
        self.run("kept_bindings", self.kept_bindings)


def where_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Where", ["c", "x", "y"], ["z"])], "where",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [1]), helper.make_tensor_value_info("x", f, [4]),
         helper.make_tensor_value_info("y", f, [4])], [helper.make_tensor_value_info("z", f, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def loop_model() -> onnx.ModelProto:
    """y = x + trips, by a Loop of 1e12 trips adding 1 each."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "one"], ["s_out"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("s", f, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("s_out", f, [1])],
        [helper.make_tensor("one", f, [1], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", f, [1])], [helper.make_tensor_value_info("y", f, [1])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [10 ** 12]),
         helper.make_tensor("go", TensorProto.BOOL, [], [True])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def memory_meter(device: str) -> tuple[Callable[[], int], str]:
    """A reader of the memory held, and what it reads: GPU 0's used bytes (NVML, else torch), else RSS."""
    if device == "cuda":
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), "gpu"
        except Exception:  # noqa: BLE001 - no NVML: torch's view of the same device
            import torch
            return lambda: int(torch.cuda.mem_get_info(0)[1] - torch.cuda.mem_get_info(0)[0]), "gpu"
    page = 4096
    return lambda: int(Path("/proc/self/statm").read_text().split()[1]) * page, "rss"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="ort-cpu against numpy (no GPU needed)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    probe = Probe("ort-cpu", "numpy") if args.cpu else Probe("ort-cuda", "ort-cpu")
    ort = ort_backend._ort()
    print(f"graphc {gc.__version__}, onnxruntime {ort.__version__} {ort.get_available_providers()}, "
          f"target {probe.target}, reference {probe.reference}", flush=True)
    usable, why = (True, "") if args.cpu else ort_backend.probe_cuda(0)
    if usable:
        probe.all()
    else:
        probe.record("ort-cuda", None, {}, why)
    if args.json:
        args.json.write_text(json.dumps({"target": probe.target, "reference": probe.reference,
                                         "results": probe.results}, indent=1))
    return 2 if not usable else 1 if any(r["status"] == "FAIL" for r in probe.results) else 0


if __name__ == "__main__":
    sys.exit(main())
