"""`graphc grad`, `graphc train`, `graphc export` and `graphc demo`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape

from graphc.cli.app import app, console, err_console
from graphc.cli.arrays import load_npz, npz_names

OPTIMIZERS = ("sgd", "adam", "adamw")


def parse_loss(text: str):
    """``KIND:OUTPUT[:LABEL]`` -> a loss spec, e.g. ``cross_entropy:logits:y``."""
    from graphc import losses

    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"bad --loss {text!r}; expected KIND:OUTPUT[:LABEL], e.g. cross_entropy:logits:y")
    kind, output = parts[0], parts[1]
    if kind not in losses.KINDS:
        raise ValueError(f"unknown loss kind {kind!r}; choose one of {', '.join(losses.KINDS)}")
    return getattr(losses, kind)(output, label=parts[2] if len(parts) == 3 else None)


def make_optimizer(kind: str, lr: float, momentum: float, weight_decay: float):
    from graphc import optim

    if kind == "sgd":
        return optim.SGD(lr, momentum=momentum, weight_decay=weight_decay)
    if kind == "adam":
        return optim.Adam(lr, weight_decay=weight_decay)
    if kind == "adamw":
        return optim.AdamW(lr, weight_decay=weight_decay)
    raise ValueError(f"unknown --optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")


@app.command("grad")
def grad_cmd(
    model: Path = typer.Argument(..., help="The ONNX model to train."),
    loss: str = typer.Option(..., "--loss", help="KIND:OUTPUT[:LABEL], e.g. cross_entropy:logits:y"),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd, adam or adamw."),
    lr: float = typer.Option(0.01, "--lr", help="Learning rate."),
    momentum: float = typer.Option(0.0, "--momentum", help="SGD momentum."),
    weight_decay: float = typer.Option(0.0, "--weight-decay"),
    freeze: list[str] = typer.Option([], "--freeze", help="A param (name or glob pattern) to keep fixed (repeatable)."),
    param: list[str] = typer.Option([], "--param", help="An initializer (name or glob pattern) to train though it is "
                                    "an exporter constant (repeatable)."),
    batchnorm: str = typer.Option("train", "--batchnorm", help="train (batch statistics) or frozen (running "
                                  "statistics, not updated: fine-tuning as model.eval())."),
    recompute: bool = typer.Option(False, "--recompute", help="Recompute cheap forward values in the "
                                   "backward (activation checkpointing): less memory, a little more time."),
    out: Path = typer.Option(..., "-o", "--out", help="Artifact directory to write."),
) -> None:
    """Generate training artifacts (train_step, gradients, eval, inference graphs) for MODEL."""
    import graphc as gc

    spec = parse_loss(loss)
    opt = make_optimizer(optimizer, lr, momentum, weight_decay)
    arts = gc.training.generate(gc.load(model), spec, opt, frozen=freeze, recompute=recompute, params=param,
                                batchnorm=batchnorm)
    arts.save(out)
    m = arts.manifest
    console.print(f"wrote training artifacts to {out}: {len(m.trainable)} trainable, "
                  f"{len(m.frozen)} frozen params, {len(m.constants)} exporter constants; loss {spec.kind} on "
                  f"{spec.output!r} (label input {spec.label!r}); optimizer {optimizer} lr={lr}; BatchNorm {batchnorm}",
                  highlight=False, soft_wrap=True)
    console.print(f"trainable: {_listing(m.trainable)}", highlight=False, soft_wrap=True)
    if m.constants:
        console.print("exporter constants (not trained; --param NAME trains one): "
                      + _listing([f"{n} ({why})" for n, why in m.constants.items()]), highlight=False, soft_wrap=True)


def _listing(items: list[str], shown: int = 12) -> str:
    return ", ".join(items[:shown]) + (f", ... ({len(items) - shown} more; manifest.json lists all)"
                                       if len(items) > shown else "")


def load_data(path: Path, names: list[str]) -> tuple[dict[str, np.ndarray], Optional[dict[str, np.ndarray]]]:
    """Train (and optional eval) arrays from an .npz: each input NAME as ``NAME`` or
    ``NAME_train``; ``NAME_test`` arrays, when all present, are the evaluation set."""
    files = set(npz_names(path, "--data"))
    keys = {}
    for name in names:
        keys[name] = name if name in files else f"{name}_train"
        if keys[name] not in files:
            raise ValueError(f"--data {path}: no array {name!r} (or {name}_train) for the model input "
                             f"{name!r}; arrays in the file: {', '.join(sorted(files))}")
    with_test = all(f"{name}_test" in files for name in names)
    arrays = load_npz(path, "--data", [*keys.values(), *(f"{n}_test" for n in names if with_test)])
    train = {name: arrays[key] for name, key in keys.items()}
    return train, ({name: arrays[f"{name}_test"] for name in names} if with_test else None)


def check_checkpoint(path: Path, resume: bool) -> None:
    """Before training: a checkpoint can be written at ``path``; with ``resume`` one is there to
    continue, without it none is there to be overwritten by a fresh run."""
    from graphc.checkpoint import CheckpointError, check_writable, read_meta, resolve

    target = resolve(path)
    if resume:
        if not target.exists():
            raise CheckpointError(f"--resume: no checkpoint at {target} to resume from; leave out --resume to "
                                  "start a new run there")
        read_meta(target)  # a directory or a bad header is named here, not after the model is loaded
    elif check_writable(path).is_file():
        meta = read_meta(target)
        raise CheckpointError(f"--checkpoint {path} already holds a checkpoint (step {meta.step}, epoch "
                              f"{meta.epoch}); pass --resume to continue it, or choose another path to start afresh")


@app.command("train")
def train_cmd(
    artifacts: Path = typer.Argument(..., help="Artifact directory written by `graphc grad`."),
    data: Path = typer.Option(..., "--data", help=".npz with an array per data/label input."),
    epochs: int = typer.Option(..., "--epochs", min=1),
    batch_size: int = typer.Option(..., "--batch-size", min=1),
    backend: str = typer.Option("auto", "--backend", help="numpy, ort-cpu, ort-cuda or auto."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Checkpoint directory (saved each epoch)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --checkpoint (an error when "
                                "there is none; without --resume an existing checkpoint is an error too)."),
    seed: int = typer.Option(0, "--seed", help="Shuffling seed."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a loss-curve PNG here."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Train the artifacts on DATA; exit 1 when training fails (e.g. the loss becomes NaN)."""
    import graphc as gc
    from graphc.checkpoint import resolve
    from graphc.history import check_plot
    from graphc.trainer import TrainingFailed

    if resume and checkpoint is None:
        raise ValueError("--resume needs --checkpoint DIR")
    if plot is not None:
        check_plot(plot)
    if checkpoint is not None:
        check_checkpoint(checkpoint, resume)
    trainer = gc.Trainer(artifacts, backend=backend, seed=seed)
    if resume:
        trainer.load_checkpoint(checkpoint)
        console.print(f"resumed from {checkpoint}: step {trainer.step_count}, epoch {trainer.epoch}", highlight=False, soft_wrap=True)
    train, test = load_data(data, [s.name for s in trainer.batch_specs])
    loader = gc.data.DataLoader(train, batch_size=batch_size, seed=seed)
    eval_loader = gc.data.DataLoader(test, batch_size=max(batch_size, 256), shuffle=False) if test else None
    console.print(f"training on {trainer.backend}: {loader.num_samples} samples, batch {batch_size}, "
                  f"{epochs} epochs", highlight=False, soft_wrap=True)
    try:
        history = trainer.fit(loader, epochs, eval_loader=eval_loader, progress=progress, plot=plot,
                              checkpoint=checkpoint)
    except KeyboardInterrupt:
        if checkpoint is not None:
            trainer.save_checkpoint(checkpoint)  # mid-epoch: --resume continues with the next batch
            err_console.print(f"interrupted at step {trainer.step_count}; saved {checkpoint} "
                              "(continue with --resume)", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except TrainingFailed as exc:
        if checkpoint is not None and resolve(checkpoint).is_file():
            exc = TrainingFailed(f"{exc} (last good checkpoint: {checkpoint})")
        err_console.print(f"[bold red]training failed:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    last = history.epochs[-1] if history.epochs else None
    if last is not None:
        console.print(f"done: loss {last.loss:.4f}"
                      + "".join(f", eval {k} {v:.4f}" for k, v in last.eval.items())
                      + f", {history.throughput:,.0f} samples/s", highlight=False, soft_wrap=True)
    if checkpoint is not None:
        console.print(f"checkpoint: {checkpoint}", highlight=False, soft_wrap=True)
    else:
        console.print("no --checkpoint given: the trained params were not saved", highlight=False, soft_wrap=True)


@app.command("export")
def export_cmd(
    source: Path = typer.Argument(..., help="Artifact directory or checkpoint."),
    out: Path = typer.Option(..., "-o", "--out", help="Inference .onnx to write."),
    opset: Optional[int] = typer.Option(None, "--opset", help="Convert to this opset."),
    allow_untrained: bool = typer.Option(False, "--allow-untrained", help="Export an artifact directory's "
                                         "initial weights even where a checkpoint trained from it exists."),
) -> None:
    """Write one self-contained, optimized inference .onnx with the trained params.

    An artifact directory holds the initial weights: exporting it is refused (exit 2) when a
    checkpoint trained from it lies beside it or in the current directory, and warned about
    otherwise, unless --allow-untrained."""
    from graphc.export import UntrainedWeightsWarning, export_inference

    with warnings.catch_warnings(record=True) as caught:  # each printed as one line
        warnings.simplefilter("always", UntrainedWeightsWarning)
        path = export_inference(source, out, opset=opset, allow_untrained=allow_untrained)
    for warning in caught:
        err_console.print(f"[bold yellow]warning:[/] {escape(str(warning.message))}", highlight=False, soft_wrap=True)
    console.print(f"wrote {path}", highlight=False, soft_wrap=True)


@app.command("demo")
def demo_cmd(
    out: Path = typer.Option(Path("demo_out"), "--out", help="Where to write artifacts and models."),
    backend: str = typer.Option("auto", "--backend"),
    epochs: int = typer.Option(30, "--epochs", min=1),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Capture, train and export the two-layer net on handwritten digits, end to end."""
    from graphc.demo import run_demo

    result = run_demo(out, backend=backend, epochs=epochs, progress=progress, console=console)
    if not result.ok:
        raise typer.Exit(1)
