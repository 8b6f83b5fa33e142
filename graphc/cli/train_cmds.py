"""`graphc train`, `graphc export` and `graphc demo` (`graphc grad` is in grad_cmds)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape

from graphc.cli.app import (JSON_OPTION, OUT_ALIAS, allow_uncalibrated_option, app, check_dtype_options,
                            check_writable_at, chosen_onnx_output, chosen_output, console, err_console, given, keep_io_types_option,
                            naming_opset, one_line_warnings, output_option, print_json)
from graphc.cli.backend_options import backend_options
from graphc.cli.interrupted import wrote
from graphc.cli.schedules import SCHEDULE_OPTIONS, momentum_note, recipe, use_schedule
from graphc.cli.train_data import load_data
from graphc.errors import did_you_mean
from graphc.runtime.history import record_row
from graphc.runtime.labels import check_data, class_labels
from graphc.runtime.metrics import names as metric_names


def _where(trainer) -> str:
    """Where a resumed run stands, in the epochs the "training on ..., epochs 21-25" line counts."""
    if trainer.batch_in_epoch:
        done = trainer.batch_in_epoch
        return f"in epoch {trainer.epoch + 1}, after {done} batch{'' if done == 1 else 'es'}"
    return f"after epoch {trainer.epoch}" if trainer.epoch else "before epoch 1"


def _fixed_batch(specs) -> Optional[int]:
    """The batch size a model with a fixed first dim takes (None: any)."""
    first = {spec.shape[0] for spec in specs if spec.shape and isinstance(spec.shape[0], int)}
    return first.pop() if len(first) == 1 else None


def _drops(fixed: Optional[int], arrays: Optional[dict[str, np.ndarray]], what: str) -> bool:
    """Whether a loader over ``arrays`` drops its last partial batch: only for a model of
    ``fixed`` batch size, which cannot take it, and said (the CLI has no drop_last option)."""
    rows = len(next(iter(arrays.values()))) if arrays else 0
    if fixed is None or not rows % fixed:
        return False
    console.print(escape(f"the model takes batches of exactly {fixed}: the last {rows % fixed} of the {rows} samples "
                         f"of {what} are left out"), highlight=False, soft_wrap=True)
    return True


def check_checkpoint(path: Path, resume: bool, artifacts: Path, changed_optimizer: bool = False,
                     fresh_optimizer: bool = False, accumulate: int = 1, changed_model: bool = False) -> None:
    """Before training: a checkpoint of the training graphs in ``artifacts`` can be written at
    ``path`` (none of another model's is there); with ``resume`` one is there to continue (of
    the graphs' model unless ``changed_model``: ``refuse_other_model``, optimizer unless
    ``changed_optimizer``, trainable set and ``accumulate``: ``resume_rules``; with
    ``fresh_optimizer`` its params are taken, ``params_only``, and the run replaces it), without
    it none is there to be overwritten by a fresh run."""
    from graphc.runtime import params_only
    from graphc.runtime.checkpoint import CheckpointError, read_meta_and_table, resolve, writable_header
    from graphc.runtime.checkpoint_folder import check_owner, find_artifacts, refuse_other_model, structure_of
    from graphc.compile.training import MANIFEST_FILE, read_manifest

    target, header = resolve(path), None  # the checkpoint's header (read_meta_and_table), read once
    if resume:
        if not target.exists():
            raise CheckpointError(f"--resume: no checkpoint at {target} to resume from; leave out --resume to "
                                  "start a new run there")
        header = read_meta_and_table(target)  # a directory or a bad header is named here, not after the model is loaded
    # the training graphs: ARTIFACTS, or those beside (or recorded by) a checkpoint given as ARTIFACTS
    source = artifacts if (artifacts / MANIFEST_FILE).is_file() else None
    if source is None and resolve(artifacts).is_file():
        source = find_artifacts(artifacts)
    if source is not None:
        manifest = read_manifest(source)
        if fresh_optimizer:  # its params, from the header as the load will check them; the run replaces the rest
            params_only.check(path, *header, manifest)
        elif resume:  # what differs as a change of settings, before check_owner takes it for another model's
            _check_resume(path, *header, manifest, changed_optimizer, accumulate)
    header = writable_header(path, header)[1]  # only a graphc checkpoint is there to be replaced
    if source is not None:  # another model's checkpoint is named here
        check_owner(path, manifest.carried(), target.resolve() if fresh_optimizer else None, header)
        if resume and not changed_model and header[0].structure is not None:  # the same tensors, another model
            refuse_other_model(path, header[0].structure, structure_of(source), f"at {source}",
                               "Give --changed-model to load its tensors into these graphs though their model "
                               "computes otherwise (a model changed on purpose, as for fine-tuning)")
    if not resume and header is not None:
        meta = header[0]
        raise CheckpointError(f"--checkpoint {path} already holds a checkpoint (step {meta.step}, epoch "
                              f"{meta.epoch}); pass --resume to continue it, or choose another path to start afresh")


def _check_resume(path: Path, meta, tensors: dict, manifest, changed_optimizer: bool, accumulate: int) -> None:
    """``resume_rules``' refusals of a checkpoint (``meta``, ``tensors``) trained with another
    optimizer, trainable set or ``--accumulate`` than the graphs of ``manifest`` and this run,
    their advice as this command's."""
    from graphc.runtime import resume_rules
    from graphc.runtime.checkpoint import CheckpointError

    try:  # the lr is warned of by load_checkpoint, later
        resume_rules.check_resume(path, meta, tensors, manifest, manifest.carried(), changed_optimizer, warn_lr=False,
                                  accumulate=accumulate)
    except resume_rules.AccumulateChanged as exc:
        raise _in_cli_words(exc) from None
    except resume_rules.OptimizerChanged as exc:
        raise CheckpointError(exc.words("--changed-optimizer", "--fresh-optimizer")) from None
    except resume_rules.StateChanged as exc:
        raise CheckpointError(exc.words("--fresh-optimizer")) from None


def _in_cli_words(exc):
    """``resume_rules.AccumulateChanged`` as a ``CheckpointError`` naming this command's options."""
    from graphc.runtime.checkpoint import CheckpointError

    return CheckpointError(exc.words("--accumulate ", "--resume --fresh-optimizer"))


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    artifacts: Path = typer.Argument(..., metavar="ARTIFACT_DIR", help="Artifact directory written by `graphc grad`."),
    data: Path = typer.Option(..., "--data", metavar="FILE.npz",
                              help="Training arrays: for each data and label input NAME an array NAME or NAME_train. "
                              "Unless --eval-data is given, each epoch is evaluated on its NAME_val arrays, or "
                              "else its NAME_test arrays, when every input has one (the run says which). Each "
                              "array has its input's dtype (np.savez keeps numpy's float64: cast float32 data "
                              "with .astype(np.float32)); a bfloat16 input reads float32."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", metavar="FILE.npz",
                                             help="Evaluation arrays: NAME, NAME_val or NAME_test for each input."),
    epochs: int = typer.Option(..., "--epochs", min=1, help="Train until this many epochs are done (a resumed "
                               "run counts the checkpoint's)."),
    batch_size: int = typer.Option(..., "--batch-size", min=1, help="Samples per training step (per micro-batch "
                                   "with --accumulate)."),
    accumulate: int = typer.Option(1, "--accumulate", min=1, metavar="K",
                                   help="Micro-batches of --batch-size per optimizer step (gradient accumulation: "
                                   "an effective batch of K x --batch-size; an epoch's last step takes what is left; "
                                   "a --schedule per step counts these steps). "
                                   "A resume must pass the checkpoint's K (another is refused, naming it; "
                                   "`--resume --fresh-optimizer` takes its params into a new run)."),
    backend: str = typer.Option("auto", "--backend", "-b", help="numpy, ort-cpu, ort-cuda or auto."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", metavar="DIR",
                                              help="Checkpoint directory (saved each epoch, and on Ctrl-C or SIGTERM)."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1, metavar="N",
                                                   help="Also save the checkpoint every N steps (a killed run "
                                                   "resumes from the last one)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --checkpoint (an error when "
                                "there is none; without --resume an existing checkpoint is an error too)."),
    changed_optimizer: bool = typer.Option(False, "--changed-optimizer", help="With --resume: train on with the "
                                           "optimizer kind and constants (weight decay, betas, eps, momentum, ...) "
                                           "ARTIFACT_DIR was generated with where the checkpoint's differ, its state "
                                           "carried over (Adam <-> AdamW; as setting torch's param_groups after "
                                           "load_state_dict); without it such a resume is refused."),
    fresh_optimizer: bool = typer.Option(False, "--fresh-optimizer", help="With --resume: take only the checkpoint's "
                                         "params and buffers (BatchNorm statistics) and start a new run of ARTIFACT_DIR "
                                         "from them: step 0, the optimizer's state fresh, any optimizer and any "
                                         "frozen set that trains the checkpoint's trained params (torch's "
                                         "load_state_dict and a new optimizer); the run's checkpoints replace it."),
    changed_model: bool = typer.Option(False, "--changed-model", help="With --resume: load the checkpoint's tensors "
                                       "into ARTIFACT_DIR's graphs though their inference graph is not the one it "
                                       "was saved with (another op, same tensor names: a model changed on purpose, as "
                                       "for fine-tuning); without it such a resume is refused, naming the first "
                                       "difference."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the shuffling and of Dropout's noise."),
    metrics: list[str] = typer.Option([], "--metric", metavar="NAME",
                                      help="A metric (repeatable), reported for training and evaluation, instead of "
                                      "the loss kind's defaults; "
                                      f"registered: {', '.join(metric_names())}."),
    tensorboard: Optional[Path] = typer.Option(None, "--tensorboard", metavar="DIR",
                                               help="Write TensorBoard event files here: losses, metrics, learning "
                                               "rate and the model graph (pip install 'graphc[tensorboard]')."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                        help="Write a loss-curve image here (pip install 'graphc[plot]')."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar within each epoch "
                                  "(--no-progress keeps the epoch lines)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print neither the bar nor the epoch lines, only the "
                               "run's start and end (not with --progress)."),
    log: Optional[Path] = typer.Option(None, "--log", metavar="FILE.jsonl|FILE.csv",
                                       help="Append one record per epoch (train loss and metrics, eval loss and "
                                       "metrics, lr, throughput) to this JSON-lines or CSV file; a --resume run keeps the "
                                       "checkpoint's epochs, a new run starts it afresh."),
    workers: int = typer.Option(1, "--workers", min=1, help="Data-parallel workers on Ray (graphc[ray])."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="ADDRESS", help="A running Ray cluster "
                                              "(default with --workers > 1: a new local one)."),
    placement: str = typer.Option("default", "--placement", metavar="default|spread",
                                  help="With --workers > 1: which nodes of the Ray cluster the workers run on: "
                                  "default (Ray's: the driver's node filled first) or spread (Ray's SPREAD: one "
                                  "worker per node in turn)."),
    shard_optimizer: bool = typer.Option(False, "--shard-optimizer", help="With --workers > 1: each worker steps and "
                                         "keeps the optimizer state of its share of the params alone (ZeRO-1)."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="With --backend ort-cuda: replay each step "
                                    "as a CUDA graph (one launch instead of one per node)."),
    schedule: str = typer.Option("none", "--schedule", metavar="NAME",
                                 help="Learning-rate schedule (gc.optim.lr_scheduler), from the optimizer's lr: "
                                 "none, step (StepLR: --step-size, --gamma), exponential (--gamma), cosine "
                                 "(CosineAnnealingLR to --min-lr over the run), onecycle (OneCycleLR up to the lr "
                                 "and down, per step), cyclic (CyclicLR between --min-lr and the lr, --step-size "
                                 "steps up and down; exp_range with --gamma) or plateau (ReduceLROnPlateau on the eval loss: --gamma, "
                                 "--patience, --min-lr). onecycle and cyclic cycle the momentum against the lr where "
                                 "the artifacts take it (graphc grad --scheduled momentum). Recorded in the "
                                 "checkpoint: --resume continues it; cosine and onecycle span the run's --epochs, "
                                 "and a resume asking for more is refused before any step."),
    schedule_interval: Optional[str] = typer.Option(None, "--schedule-interval", metavar="epoch|step",
                                                    help="Step the schedule after each epoch (default) or each "
                                                    "train step (onecycle, cyclic: always)."),
    step_size: Optional[int] = typer.Option(None, "--step-size", min=1, metavar="N",
                                            help="--schedule step: decay the lr every N scheduler steps; cyclic: "
                                            "train steps from --min-lr up to the lr (and as many down)."),
    gamma: Optional[float] = typer.Option(None, "--gamma", min=0.0, help="The lr's decay factor (step: default "
                                          "0.1, exponential: required, plateau: default 0.1; cyclic: exp_range's, the "
                                          "cycle's height times gamma to the step; cosine and onecycle take none)."),
    min_lr: Optional[float] = typer.Option(None, "--min-lr", min=0.0, help="cosine's final lr and plateau's floor "
                                           "(default 0 for both), cyclic's lowest (required)."),
    warmup: int = typer.Option(0, "--warmup", min=0, metavar="N",
                               help="Ramp the lr up linearly over the first N scheduler steps (epochs, or train "
                               "steps with --schedule-interval step), then run --schedule (step, exponential, cosine)."),
    patience: int = typer.Option(10, "--patience", min=0, help="--schedule plateau: epochs without improvement "
                                 "before the lr drops."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Train artifacts on the arrays of an .npz file.

    Exits 1 when training fails (e.g. the loss becomes NaN). --json: as --quiet, with the run's
    lines on stderr, then its summary (backend, steps, each epoch's record as --log writes it,
    samples/s, paths written) as one JSON document on stdout.

    Example (data.npz holds x and y, one row per sample):

    \b
    graphc train arts --data data.npz --epochs 5 --batch-size 32 --checkpoint ck
    """
    import graphc as gc
    from graphc.runtime import resume_rules
    from graphc.runtime.checkpoint import resolve
    from graphc.runtime.checkpoint_folder import check_training_source
    from graphc.runtime.history import check_plot, log_format
    from graphc.runtime.progress import plural
    from graphc.runtime.trainer import TrainingFailed, TrainingInterrupted

    if resume and checkpoint is None:
        raise ValueError("--resume needs --checkpoint DIR")
    for option, on in (("--changed-optimizer", changed_optimizer), ("--fresh-optimizer", fresh_optimizer),
                       ("--changed-model", changed_model)):
        if on and not resume:
            raise ValueError(f"{option} applies to a --resume run: give --resume --checkpoint DIR too")
    if changed_optimizer and fresh_optimizer:
        raise ValueError("--changed-optimizer carries the checkpoint's optimizer state over, --fresh-optimizer starts "
                         "it afresh: give one of them")
    for option, on in (("--quiet", quiet), ("--json", as_json)):
        if on and given(ctx, "progress") and progress:
            raise ValueError(f"{option} prints no progress bar: give {option} or --progress, not both")
    quiet = quiet or as_json
    out = err_console if as_json else console  # stdout holds the one JSON document
    if checkpoint_every is not None and checkpoint is None:
        raise ValueError("--checkpoint-every needs --checkpoint DIR")
    _check_worker_options(ctx, placement, workers, shard_optimizer)
    for option, path, file in (("--plot", plot, "loss.png"), ("--log", log, "epochs.jsonl"),
                               ("--tensorboard", tensorboard, None), ("--checkpoint", checkpoint, None)):
        if path is not None:
            check_writable_at(path, option, file, folder=option == "--tensorboard")
    if plot is not None:
        check_plot(plot)
    if log is not None:
        log_format(log)
    check_training_source(artifacts)
    if checkpoint is not None:
        check_checkpoint(checkpoint, resume, artifacts, changed_optimizer, fresh_optimizer, accumulate, changed_model)
    try:  # ARTIFACTS may be a checkpoint, resumed here
        trainer = gc.Trainer(artifacts, backend=backend, seed=seed, metrics=metrics or None, tensorboard=tensorboard,
                             workers=workers, ray_address=ray_address, accumulate=accumulate,
                             **backend_options(ctx, backend),
                             **({"placement": placement, "shard_optimizer": shard_optimizer} if workers > 1 else {}))
    except resume_rules.AccumulateChanged as exc:
        raise _in_cli_words(exc) from None
    if resume:
        with _lr_note(trainer):
            trainer.load_checkpoint(checkpoint, changed_optimizer=changed_optimizer, fresh_optimizer=fresh_optimizer,
                                    changed_model=changed_model)
    resumed = None if fresh_optimizer else checkpoint if resume else trainer.resumed_from  # ARTIFACTS may be one
    if fresh_optimizer:
        out.print(escape(f"params from {checkpoint}; a new run with a fresh optimizer (step 0)"), highlight=False,
                      soft_wrap=True)
    if resumed is not None:
        out.print(escape(f"resumed from {resumed} {_where(trainer)} (step {trainer.step_count})"),
                      highlight=False, soft_wrap=True)
    train, test, test_source = load_data(data, trainer.batch_specs, eval_data, class_labels(trainer.manifest),
                                         trainer.complex_inputs)
    check_data(trainer.manifest, train, f"--data {data}")  # before fit's checks, which name no file
    if test:
        check_data(trainer.manifest, test, test_source)
    fixed = _fixed_batch(trainer.batch_specs)
    if fixed is not None and batch_size != fixed:
        raise ValueError(f"--batch-size {batch_size}: the model takes batches of exactly {fixed} (its inputs' "
                         f"first dim); pass --batch-size {fixed}")
    loader = gc.data.DataLoader(train, batch_size=batch_size, seed=seed, drop_last=_drops(fixed, train, "--data"))
    problem = trainer.loader_mismatch(loader)
    if problem is not None:
        where = "--resume" if resume else f"resuming {resumed} (given as ARTIFACTS)"
        raise ValueError(f"{where}: {problem}; pass the same --data, --batch-size and --seed to continue the run "
                         "exactly, or start a new one in another --checkpoint folder")
    eval_loader = gc.data.DataLoader(test, batch_size=fixed or max(batch_size, 256), shuffle=False,
                                     drop_last=_drops(fixed, test, test_source)) if test else None
    steps = trainer.steps_for(len(loader))  # optimizer steps an epoch: one per --accumulate batches
    use_schedule(trainer, resumed, recipe(schedule, schedule_interval, epochs, steps, step_size=step_size,
                                          gamma=gamma, min_lr=min_lr, warmup=warmup, patience=patience),
                 [n for n in SCHEDULE_OPTIONS if given(ctx, n)], epochs, steps)
    note = momentum_note(trainer)
    if note is not None:
        out.print(escape(note), highlight=False, soft_wrap=True)
    if resumed is not None and trainer.epoch >= epochs:
        out.print(f"nothing to train: the run has done {plural(trainer.epoch, 'epoch')} of --epochs {epochs}; "
                      "raise --epochs to train on", highlight=False, soft_wrap=True)
        if as_json:
            print_json(_summary(trainer, None, checkpoint=checkpoint, log=log, plot=plot, tensorboard=tensorboard))
        return
    todo = "" if not trainer.epoch else (f", epoch {epochs}" if trainer.epoch + 1 == epochs
                                         else f", epochs {trainer.epoch + 1}-{epochs}")
    out.print(f"training on {trainer.backend}: {plural(loader.num_samples, 'sample')}, batch {batch_size}, "
                  f"{plural(epochs, 'epoch')}{todo}", highlight=False, soft_wrap=True)
    out.print(escape(f"evaluating on {test_source}") if test else "no evaluation arrays (NAME_val or NAME_test in "
                  "--data, or --eval-data): training loss only", highlight=False, soft_wrap=True)
    try:
        with _sigterm_as_ctrl_c():
            history = trainer.fit(loader, epochs, eval_loader=eval_loader, progress=progress, plot=plot,
                                  checkpoint=checkpoint, checkpoint_every=checkpoint_every, quiet=quiet, log=log)
    except TrainingInterrupted as exc:  # fit saved the checkpoint once the step under way was done
        saved = f"saved {checkpoint} (continue with --resume)" if exc.saved is not None else exc.reason
        err_console.print(escape(f"interrupted at step {exc.step}; {saved}"), highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # no --checkpoint: fit saved nothing
        kept = "".join(f"; {option} {path} kept" for option, path in (("--log", log), ("--tensorboard", tensorboard))
                       if path is not None and path.exists())
        lost = "no --checkpoint given: the trained params were not saved" if checkpoint is None else \
            f"nothing saved to {checkpoint}"
        err_console.print(escape(f"interrupted at step {trainer.step_count}; {lost}{kept}"), highlight=False,
                          soft_wrap=True)
        raise typer.Exit(130) from None
    except TrainingFailed as exc:
        if checkpoint is not None and resolve(checkpoint).is_file():
            exc = TrainingFailed(f"{exc} (last good checkpoint: {checkpoint})")
        err_console.print(f"[bold red]training failed:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if log is not None:
        out.print(escape(f"epoch log: {log}"), highlight=False, soft_wrap=True)
    if plot is not None:
        out.print(escape(f"loss curve: {plot}"), highlight=False, soft_wrap=True)
    if tensorboard is not None:
        out.print(escape(f"TensorBoard logs: {tensorboard} (tensorboard --logdir {tensorboard})"), highlight=False,
                      soft_wrap=True)
    last = history.epochs[-1] if history.epochs else None
    if last is not None:
        out.print(f"done: loss {last.loss:.4f}"
                      + "".join(f", eval {k} {v:.4f}" for k, v in last.eval.items())
                      + f", {history.throughput:,.0f} samples/s", highlight=False, soft_wrap=True)
    if checkpoint is not None:
        out.print(escape(f"checkpoint: {checkpoint}"), highlight=False, soft_wrap=True)
    else:
        out.print("no --checkpoint given: the trained params were not saved", highlight=False, soft_wrap=True)
    if as_json:
        print_json(_summary(trainer, history, checkpoint=checkpoint, log=log, plot=plot, tensorboard=tensorboard))


def _summary(trainer, history, **paths: Optional[Path]) -> dict:
    """`graphc train --json`'s document: the run's backend and steps, this run's epoch records
    (none where nothing was left to train), its samples/s and the paths it wrote (null: not asked for)."""
    return {"backend": trainer.backend, "steps": trainer.step_count, "epochs_done": trainer.epoch,
            "epochs": [] if history is None else [record_row(e) for e in history.epochs],
            "samples_per_s": None if history is None else history.throughput,
            **{name: None if path is None else str(path) for name, path in paths.items()}}


def _check_worker_options(ctx: typer.Context, placement: str, workers: int, shard_optimizer: bool) -> None:
    """``--placement`` names one of ``placement.PLACEMENTS``; it and ``--shard-optimizer`` come with
    ``--workers N`` (N > 1)."""
    from graphc.runtime.distributed.placement import PLACEMENTS

    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENTS)}"
                         f"{did_you_mean(placement, PLACEMENTS)}")
    if given(ctx, "placement") and workers == 1:
        raise ValueError(f"--placement {placement} says which Ray nodes the --workers run on: give --workers N "
                         "(N > 1) too, or leave out --placement")
    if shard_optimizer and workers == 1:
        raise ValueError("--shard-optimizer splits the optimizer update between the --workers: give --workers N "
                         "(N > 1) too, or leave out --shard-optimizer")


def _lr_note(trainer):
    """``one_line_warnings`` with ``resume_rules.LrChanged`` in this command's words: it takes no lr."""
    from graphc.runtime.resume_rules import LrChanged

    def words(message: Warning) -> Warning | str:
        if not isinstance(message, LrChanged):
            return message
        return message.words("graphc train has no lr option: to train at the graphs' lr, resume in Python "
                             f"(trainer.load_checkpoint(...); trainer.lr = {trainer.manifest.optimizer.get('lr')!r}; "
                             "trainer.fit(...)), or start a new run")

    return one_line_warnings(LrChanged, rewrite=words)


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (a scheduler or container stopping the run) taken as Ctrl-C: the step under way
    ends and the checkpoint is saved, where the default would kill the run mid-epoch. Not where
    SIGINT is ignored (a run started with ``&`` from a script): the SIGINT raised would be dropped
    and SIGTERM with it, so SIGTERM keeps its default and ends the run."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    source: Path = typer.Argument(..., metavar="ARTIFACT_DIR|CHECKPOINT", help="Artifact directory or checkpoint."),
    output: Optional[Path] = output_option("The inference .onnx file to write (required).", "FILE.onnx"),
    out: Optional[Path] = OUT_ALIAS,
    opset: Optional[int] = typer.Option(None, "--opset", help="The ai.onnx opset to write, converting to it (default: the model's)."),
    allow_untrained: bool = typer.Option(False, "--allow-untrained", help="Export an artifact directory's "
                                         "initial weights even where a checkpoint trained from it exists."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="float16|bfloat16", help="float16 or bfloat16: convert the model "
                                        "(gc.convert_float; default: keep float32)."),
    keep_io_types: bool = keep_io_types_option(False, ", for clients that send float32."),
    allow_uncalibrated: bool = allow_uncalibrated_option("Write"),
    averaged: bool = typer.Option(False, "--averaged", help="Write the averaged weights (SWA/EMA: artifacts "
                                  "from graphc grad --averaged, or generate's averaged=) in place of the trained "
                                  "ones."),
) -> None:
    """Write trained params as one optimized inference .onnx.

    An artifact directory holds the initial weights: exporting it is refused (exit 2) when a
    checkpoint trained from it lies beside it or in the current directory, and warned about
    otherwise, unless --allow-untrained. A fake quantization whose observer never saw data is
    refused (exit 2) unless --allow-uncalibrated. --averaged writes the SWA/EMA copy of the weights
    (as Trainer.export_inference(averaged=True)); artifacts that keep none are refused (exit 2).

    Example (ck: a checkpoint of graphc train --checkpoint ck):

    \b
    graphc export ck -o trained.onnx
    """
    from graphc.compile.export import UntrainedWeightsWarning, export_inference
    from graphc.passes.precision import RangeWarning

    output = chosen_onnx_output(output, out, inputs={"ARTIFACT_DIR|CHECKPOINT": source})
    check_dtype_options(ctx, dtype)
    with one_line_warnings(UntrainedWeightsWarning, RangeWarning), naming_opset(opset):
        path = wrote(export_inference(source, output, opset=opset, allow_untrained=allow_untrained, dtype=dtype,
                                keep_io_types=keep_io_types, allow_uncalibrated=allow_uncalibrated,
                                averaged=averaged))
    console.print(escape(f"wrote {path}"), highlight=False, soft_wrap=True)


@app.command("demo")
def demo_cmd(
    output: Optional[Path] = output_option("Where to write artifacts and models (default: demo_out).", "DIR"),
    out: Optional[Path] = OUT_ALIAS,
    backend: str = typer.Option("auto", "--backend", "-b", help="numpy, ort-cpu, ort-cuda or auto."),
    epochs: int = typer.Option(30, "--epochs", min=1, help="Training epochs."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the initialisation, the shuffling and Dropout."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar within each epoch "
                                  "(--no-progress keeps the epoch lines)."),
) -> None:
    """Run the end-to-end demo on handwritten digits.

    Captures, trains and exports the two-layer net, then checks parity."""
    from graphc.cli.demo import run_demo
    from graphc.dsl.sources import on_behalf_of

    with on_behalf_of("graphc demo"):  # the nodes' source, not typer's line that called this
        result = run_demo(chosen_output(output, out, Path("demo_out"), folder=True), backend=backend, epochs=epochs,
                          progress=progress, seed=seed, console=console)
    if not result.ok:
        raise typer.Exit(1)
