"""`graphc inspect` on what training writes: an artifact directory (`graphc grad -o DIR`) and a
checkpoint (`graphc train --checkpoint DIR`, or its ``.safetensors`` file). Only the manifest and
the checkpoint's header are read, never the tensors."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphc.errors import InputError


def training_kind(path: Path) -> str | None:
    """``"artifacts"``, ``"checkpoint"`` or None (a model file, or nothing graphc wrote)."""
    from graphc.compile.training import MANIFEST_FILE
    from graphc.runtime.checkpoint import FILE_NAME

    if path.is_dir():
        return "artifacts" if (path / MANIFEST_FILE).is_file() else "checkpoint" if (path / FILE_NAME).exists() else None
    return "checkpoint" if path.suffix == ".safetensors" else None


def checked_kind(path: Path) -> str | None:
    """``training_kind`` of what `graphc inspect` or `graphc view` was given; a folder graphc did not
    write, or a ``.json`` file (an artifact manifest, say), is refused with a line saying what to pass."""
    from graphc.compile.training import MANIFEST_FILE

    kind = training_kind(path)
    if kind is None and path.is_dir():
        raise InputError(f"{path}: a folder that is neither training artifacts (no {MANIFEST_FILE}) nor a "
                         "checkpoint (no checkpoint.safetensors)")
    if kind is None and path.suffix.lower() == ".json" and path.is_file():
        if path.name == MANIFEST_FILE and training_kind(path.parent) == "artifacts":
            raise InputError(f"{path}: the manifest of the training artifacts {path.parent}, not a model; "
                             f"pass the folder {path.parent}")
        raise InputError(f"{path}: a JSON file, not an ONNX model")
    return kind


def train_step_file(path: Path, kind: str) -> Path:
    """The train_step graph of training artifacts (``kind`` "artifacts") or of the artifacts a
    checkpoint (``kind`` "checkpoint") belongs to."""
    from graphc.compile.training import read_manifest
    from graphc.runtime.checkpoint import read_meta
    from graphc.runtime.checkpoint_folder import find_artifacts

    artifacts = path if kind == "artifacts" else find_artifacts(path)
    if artifacts is None:
        raise InputError(f"{path}: a checkpoint whose training graphs are not found (header records "
                         f"{read_meta(path).artifacts or 'none'!r}); pass one of their .onnx files")
    return artifacts / read_manifest(artifacts).graphs["train_step"].file


def describe_artifacts(path: Path, console: Console) -> None:
    """The loss, the optimizer, the batch inputs, the params and the graphs of an artifact directory."""
    from graphc.compile.training import STATE_FILE, read_manifest

    m = read_manifest(path)
    step = m.graphs["train_step"]
    loss = dict(m.loss)
    kind, output, label = loss.pop("kind"), loss.pop("output", None), loss.pop("label", None)
    optimizer = dict(m.optimizer)
    said = [f"[bold]training artifacts[/] {escape(str(path))}  ({m.format}, opset {m.opset})",
            escape(f"loss: {kind} on {output!r}" + (f" (label input {label!r})" if label else "")
                   + _settings(loss.pop("options", {}) | loss)),
            f"optimizer: {optimizer.pop('kind')}{_settings(optimizer)}",
            f"BatchNorm {m.batchnorm}; backward lowered for {m.device}" + ("; recomputes forward values"
                                                                           if m.recompute else ""),
            escape("metrics: " + (", ".join(m.metrics) or "the loss kind's defaults"))]
    for line in said:
        console.print(line, highlight=False, soft_wrap=True)
    batch = Table(title="batch inputs", title_justify="left")
    for column in ("name", "role", "dtype", "shape"):
        batch.add_column(column)
    for entry in step.inputs:
        if entry.role in ("data", "label"):
            batch.add_row(escape(entry.name), entry.role, entry.dtype, escape(shape_text(entry.shape)))
    console.print(batch)
    params = {e.name: e for e in step.inputs if e.role == "param"}
    trainable = sum(math.prod(params[n].shape) for n in m.trainable if n in params)
    console.print(f"params: {len(m.trainable)} trainable ({trainable:,} elements), {len(m.frozen)} frozen, "
                  f"{len(m.constants)} exporter constants; initial state {STATE_FILE} "
                  f"{(path / STATE_FILE).stat().st_size:,} bytes", highlight=False, soft_wrap=True)
    console.print("graphs: " + ", ".join(f"{key} ({entry.file})" for key, entry in m.graphs.items()),
                  highlight=False, soft_wrap=True)


def describe_checkpoint(path: Path, console: Console) -> None:
    """Where a checkpoint's run stands (steps, epochs, data, backend, seed), what it holds, and
    the training graphs it belongs to."""
    from graphc.runtime.checkpoint import read_meta, read_tensor_table, resolve
    from graphc.runtime.checkpoint_folder import find_artifacts
    from graphc.runtime.progress import plural

    meta = read_meta(path)
    table = read_tensor_table(path)
    target = resolve(path)
    into = f", {meta.batch_in_epoch} batch(es) into epoch {meta.epoch + 1}" if meta.batch_in_epoch else ""
    console.print(f"[bold]checkpoint[/] {escape(str(target))}  ({meta.format}, {target.stat().st_size:,} bytes)",
                  highlight=False, soft_wrap=True)
    console.print(f"run: step {meta.step}, {plural(meta.epoch, 'epoch')} done{into}; backend {meta.backend or '?'}, "
                  f"seed {'?' if meta.seed is None else meta.seed}", highlight=False, soft_wrap=True)
    if meta.loader is not None:
        loader = meta.loader
        console.print(f"data: {loader.num_samples:,} samples in batches of {loader.batch_size} "
                      f"({'shuffled' if loader.shuffle else 'in order'}, seed {loader.seed}"
                      f"{', last partial batch dropped' if loader.drop_last else ''})", highlight=False, soft_wrap=True)
    by_role: dict[str, int] = {}
    for name, (_, shape) in table.items():
        role = meta.roles.get(name, "other")
        by_role[role] = by_role.get(role, 0) + math.prod(shape)
    console.print(f"tensors: {len(table)} ("
                  + ", ".join(f"{role} {plural(n, 'element')}" for role, n in sorted(by_role.items())) + ")",
                  highlight=False, soft_wrap=True)
    artifacts = find_artifacts(path)
    if artifacts is None:
        console.print(escape(f"training graphs: not found (header records {meta.artifacts or 'none'!r})"),
                      highlight=False, soft_wrap=True)
        return
    console.print(f"training graphs: {escape(str(artifacts))}", highlight=False, soft_wrap=True)
    describe_artifacts(artifacts, console)


def _settings(values: dict) -> str:
    """`` name=value`` for each setting given (None and empty lists left out)."""
    return "".join(f" {k}={_value(v)}" for k, v in values.items() if v not in (None, [], {}))


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(tuple(v)) if isinstance(v, list) else str(v)


def shape_text(shape: list | None) -> str:
    """``[N, 64]``; an unknown dim or rank as ``?``."""
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
