"""`graphc demo`: the whole flow on handwritten digits, in well under a minute.

capture the two-layer net (models/two_layer_net.py, 64 -> 256 -> 10) -> generate training
artifacts -> train on the best available backend -> test accuracy -> export inference.onnx ->
parity check of that file on numpy vs onnxruntime -> say where everything was written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphc.cli.interrupted import wrote
from graphc.models.data import load_digits
from graphc.runtime.progress import plural

__all__ = ["DemoResult", "load_digits", "run_demo"]

TARGET_ACCURACY = 0.95
HIDDEN = 256
BATCH_SIZE = 64
LR = 0.1
MOMENTUM = 0.9
PARITY_RTOL, PARITY_ATOL = 1e-4, 1e-4


@dataclass
class DemoResult:
    accuracy: float
    parity_ok: bool
    backend: str
    seconds: float
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.accuracy >= TARGET_ACCURACY and self.parity_ok


def _capture(seed: int):
    import graphc as gc
    from graphc.models.two_layer_net import TwoLayerNet

    net = TwoLayerNet(in_features=64, hidden=HIDDEN, classes=10)
    return gc.capture(net, name="two_layer_net_digits", seed=seed, x=gc.spec("float32", ("N", 64)))


def run_demo(out: Union[str, os.PathLike] = "demo_out", backend: str = "auto", epochs: int = 30,
             progress: bool = True, seed: int = 0, console: Optional[Console] = None) -> DemoResult:
    """Run the demo, writing into ``out``; returns accuracy, parity and the paths written."""
    import graphc as gc

    console = console or Console()
    out = Path(out)  # made by the first save: an interrupt before it leaves no empty folder
    start = time.perf_counter()
    digits = load_digits()

    console.rule("[bold]graphc demo: a two-layer net on handwritten digits")
    model = _capture(seed)
    paths = {"captured model": wrote(model.save(out / "two_layer_net.onnx"))}
    output = model.outputs[0].name
    console.print(escape(f"1. captured {model!r}"), highlight=False, soft_wrap=True)

    t0 = time.perf_counter()
    arts = gc.training.generate(model, gc.losses.cross_entropy(output, label="y"),
                                gc.optim.SGD(LR, momentum=MOMENTUM))
    paths["training artifacts"] = wrote(arts.save(out / "artifacts"))
    console.print(f"2. generated training artifacts ({len(arts.manifest.trainable)} trainable params, "
                  f"SGD lr={LR} momentum={MOMENTUM}) in {time.perf_counter() - t0:.2f} s", highlight=False, soft_wrap=True)

    trainer = gc.Trainer(arts, backend=backend, seed=seed)
    console.print(f"3. training on [bold]{trainer.backend}[/] for {plural(epochs, 'epoch')}, batch {BATCH_SIZE}", soft_wrap=True)
    train = gc.data.DataLoader({"x": digits["x_train"], "y": digits["y_train"]}, BATCH_SIZE, seed=seed)
    test = gc.data.DataLoader({"x": digits["x_test"], "y": digits["y_test"]}, 512, shuffle=False)
    plot = out / "loss_curve.png" if _has_matplotlib() else None
    history = trainer.fit(train, epochs, progress=progress, plot=plot)
    paths["checkpoint"] = wrote(trainer.save_checkpoint(out / "checkpoint").parent)
    if plot is not None:
        paths["loss curve"] = wrote(plot)
    metrics = trainer.evaluate_loader(test)
    accuracy = metrics["accuracy"]
    verdict = "[green]ok" if accuracy >= TARGET_ACCURACY else "[red]below target"
    console.print(f"4. test accuracy [bold]{accuracy:.2%}[/] on {len(digits['y_test'])} held-out images "
                  f"(target >= {TARGET_ACCURACY:.0%}: {verdict}[/]); test loss {metrics['loss']:.4f}; "
                  f"{history.throughput:,.0f} train samples/s", soft_wrap=True)

    paths["inference model"] = wrote(trainer.export_inference(out / "inference.onnx"))
    exported = gc.load(paths["inference model"])
    console.print(escape(f"5. exported {paths['inference model']} ({len(exported.graph)} nodes, "
                         f"opset {exported.opset}, inputs {', '.join(str(s) for s in exported.inputs)})"), highlight=False, soft_wrap=True)

    # float32 sums in a different order differ by ~1e-6 of the partial sums; trained logits reach
    # ~20, so near-zero logits get an absolute tolerance of that scale rather than the default 1e-5.
    report = gc.parity.compare(exported, {"x": digits["x_test"]}, backends=("numpy", "ort-cpu"),
                               rtol=PARITY_RTOL, atol=PARITY_ATOL)
    console.print(escape(f"6. {report}"), highlight=False, soft_wrap=True)

    seconds = time.perf_counter() - start
    table = Table(title=escape(f"written to {out.resolve()}"))
    table.add_column("what")
    table.add_column("where")
    for what, where in paths.items():
        table.add_row(what, escape(str(where)))
    console.print(table)
    ok = accuracy >= TARGET_ACCURACY and report.ok
    console.print(f"{'[bold green]demo passed' if ok else '[bold red]demo failed'}[/] in {seconds:.1f} s; "
                  f"everything is in {escape(str(out.resolve()))}", soft_wrap=True)
    return DemoResult(accuracy=accuracy, parity_ok=report.ok, backend=trainer.backend, seconds=seconds, paths=paths)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
