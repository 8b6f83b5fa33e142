"""`graphc inspect` on what training writes: an artifact directory (`graphc grad -o DIR`) and a
checkpoint (`graphc train --checkpoint DIR`, or its ``.safetensors`` file). Only the manifest and
the checkpoint's header are read, never the tensors."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphc.cli.averaging import described
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


def artifacts_facts(path: Path) -> dict:
    """What `graphc inspect ARTIFACT_DIR` says, as data (`--json` prints it): the loss, the
    optimizer, the batch inputs, the params and the graphs, read from the manifest."""
    from graphc.compile.training import STATE_FILE, read_manifest

    m = read_manifest(path)
    step = m.graphs["train_step"]
    loss = dict(m.loss)
    kind, output, label = loss.pop("kind"), loss.pop("output", None), loss.pop("label", None)
    optimizer = dict(m.optimizer)
    params = {e.name: e for e in step.inputs if e.role == "param"}
    return {"kind": "artifacts", "path": str(path), "format": m.format, "opset": m.opset,
            "loss": {"kind": kind, "output": output, "label": label, "settings": loss.pop("options", {}) | loss},
            "optimizer": {"kind": optimizer.pop("kind"), "settings": optimizer},
            "batchnorm": m.batchnorm, "device": m.device, "recompute": m.recompute, "metrics": list(m.metrics),
            "loss_scale": m.loss_scale, "autocast": m.autocast,
            "averaging": None if m.averaging is None else {k: v for k, v in m.averaging.items() if k != "names"}
            | {"copies": len(m.averaging["names"])},
            "batch_inputs": [{"name": e.name, "role": e.role, "dtype": e.dtype, "shape": e.shape}
                             for e in step.inputs if e.role in ("data", "label")],
            "params": {"trainable": list(m.trainable), "frozen": list(m.frozen), "constants": list(m.constants),
                       "trainable_elements": sum(math.prod(params[n].shape) for n in m.trainable if n in params)},
            "initial_state": {"file": STATE_FILE, "bytes": (path / STATE_FILE).stat().st_size},
            "graphs": {key: entry.file for key, entry in m.graphs.items()}}


def scaling_text(spec: dict) -> str:
    """``loss scale dynamic from 65536``: the manifest's loss scaling as `graphc inspect` and grad's
    summary line say it."""
    return f"loss scale {spec['kind']} from {spec['init_scale']:g}"


def describe_artifacts(f: dict, console: Console) -> None:
    """``artifacts_facts`` as `graphc inspect` prints them."""
    loss, optimizer, params = f["loss"], f["optimizer"], f["params"]
    said = [f"[bold]training artifacts[/] {escape(f['path'])}  ({f['format']}, opset {f['opset']})",
            escape(f"loss: {loss['kind']} on {loss['output']!r}" + (f" (label input {loss['label']!r})"
                                                                     if loss["label"] else "")
                   + _settings(loss["settings"])),
            f"optimizer: {optimizer['kind']}{_settings(optimizer['settings'])}",
            f"BatchNorm {f['batchnorm']}; backward lowered for {f['device']}" + ("; recomputes forward values"
                                                                                 if f["recompute"] else ""),
            escape("metrics: " + (", ".join(f["metrics"]) or "the loss kind's defaults"))]
    if f["loss_scale"] is not None or f["autocast"] is not None:
        scale = f["loss_scale"]
        said.append("precision: " + "; ".join(
            ([] if scale is None else [scaling_text(scale)])
            + ([] if f["autocast"] is None else [f"autocast {f['autocast']}"])))
    if f["averaging"] is not None:
        said.append(f"weight averaging: {described(f['averaging'])}; an averaged copy of {f['averaging']['copies']} "
                    "params and buffers (graphc export --averaged writes it)")
    for line in said:
        console.print(line, highlight=False, soft_wrap=True)
    batch = Table(title="batch inputs", title_justify="left")
    for column in ("name", "role", "dtype", "shape"):
        batch.add_column(column)
    for entry in f["batch_inputs"]:
        batch.add_row(escape(entry["name"]), entry["role"], entry["dtype"], escape(shape_text(entry["shape"])))
    console.print(batch)
    console.print(f"params: {len(params['trainable'])} trainable ({params['trainable_elements']:,} elements), "
                  f"{len(params['frozen'])} frozen, {len(params['constants'])} exporter constants; initial state "
                  f"{f['initial_state']['file']} {f['initial_state']['bytes']:,} bytes", highlight=False, soft_wrap=True)
    console.print("graphs: " + ", ".join(f"{key} ({file})" for key, file in f["graphs"].items()),
                  highlight=False, soft_wrap=True)


def checkpoint_facts(path: Path) -> dict:
    """What `graphc inspect CHECKPOINT` says, as data (`--json` prints it): where the run stands
    (steps, epochs, data, backend, seed), what the file holds (elements by role), and the
    ``artifacts_facts`` of the training graphs it belongs to (None where they are not found)."""
    from graphc.runtime.checkpoint import read_meta, read_tensor_table, resolve
    from graphc.runtime.checkpoint_folder import find_artifacts

    meta = read_meta(path)
    table = read_tensor_table(path)
    target = resolve(path)
    by_role: dict[str, int] = {}
    for name, (_, shape) in table.items():
        role = meta.roles.get(name, "other")
        by_role[role] = by_role.get(role, 0) + math.prod(shape)
    loader = meta.loader
    artifacts = find_artifacts(path)
    return {"kind": "checkpoint", "path": str(target), "format": meta.format, "bytes": target.stat().st_size,
            "step": meta.step, "epochs_done": meta.epoch, "batches_into_epoch": meta.batch_in_epoch,
            "backend": meta.backend or None, "seed": meta.seed,
            "data": None if loader is None else {"samples": loader.num_samples, "batch_size": loader.batch_size,
                                                 "shuffle": loader.shuffle, "seed": loader.seed,
                                                 "drop_last": loader.drop_last},
            "tensors": {"count": len(table), "elements_by_role": dict(sorted(by_role.items()))},
            "artifacts_recorded": meta.artifacts or None,
            "artifacts": None if artifacts is None else artifacts_facts(artifacts)}


def describe_checkpoint(f: dict, console: Console) -> None:
    """``checkpoint_facts`` as `graphc inspect` prints them."""
    from graphc.runtime.progress import plural

    into = (f", {f['batches_into_epoch']} batch(es) into epoch {f['epochs_done'] + 1}"
            if f["batches_into_epoch"] else "")
    console.print(f"[bold]checkpoint[/] {escape(f['path'])}  ({f['format']}, {f['bytes']:,} bytes)",
                  highlight=False, soft_wrap=True)
    console.print(f"run: step {f['step']}, {plural(f['epochs_done'], 'epoch')} done{into}; backend {f['backend'] or '?'}, "
                  f"seed {'?' if f['seed'] is None else f['seed']}", highlight=False, soft_wrap=True)
    if (data := f["data"]) is not None:
        console.print(f"data: {data['samples']:,} samples in batches of {data['batch_size']} "
                      f"({'shuffled' if data['shuffle'] else 'in order'}, seed {data['seed']}"
                      f"{', last partial batch dropped' if data['drop_last'] else ''})", highlight=False, soft_wrap=True)
    console.print(f"tensors: {f['tensors']['count']} ("
                  + ", ".join(f"{role} {plural(n, 'element')}" for role, n in f["tensors"]["elements_by_role"].items())
                  + ")", highlight=False, soft_wrap=True)
    if f["artifacts"] is None:
        console.print(escape(f"training graphs: not found (header records {f['artifacts_recorded'] or 'none'!r})"),
                      highlight=False, soft_wrap=True)
        return
    console.print(f"training graphs: {escape(f['artifacts']['path'])}", highlight=False, soft_wrap=True)
    describe_artifacts(f["artifacts"], console)


def _settings(values: dict) -> str:
    """`` name=value`` for each setting given (None and empty lists left out)."""
    return "".join(f" {k}={_value(v)}" for k, v in values.items() if v not in (None, [], {}))


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(tuple(v)) if isinstance(v, list) else str(v)


def shape_text(shape: list | None) -> str:
    """``[N, 64]``; an unknown dim or rank as ``?``."""
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
