"""Training checkpoints: one safetensors file, written atomically, verified on load.

A checkpoint is either a file ``NAME.safetensors`` or a directory holding
``checkpoint.safetensors`` (and, when the Trainer wrote it, ``artifacts/``: the training graphs
the tensors belong to, so ``graphc export CHECKPOINT`` needs nothing else). The file holds every
tensor the training loop carries from step to step (params, optimizer state, step count,
BatchNorm statistics) and, in the safetensors header, a JSON ``CheckpointMeta``: the loop
position (step, epoch, batch within the epoch), the loader settings and the Trainer's RNG state,
so a resumed run replays exactly the losses of the uninterrupted one. A SHA-256 digest of the
tensor data makes a corrupted file fail loudly instead of training on garbage. No pickle.

Writes go to a temporary file in the same folder, are fsync'ed, then ``os.replace``d over the
previous checkpoint (and the folder fsync'ed): a crash at any moment leaves either the old or
the new checkpoint, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
from pydantic import BaseModel, ValidationError

from graphc.errors import GraphcError
from graphc.fileio import atomic_write

__all__ = ["CheckpointError", "CheckpointMeta", "FILE_NAME", "artifacts_dir", "find_artifacts", "load", "resolve", "save"]

FILE_NAME = "checkpoint.safetensors"
ARTIFACTS_DIR = "artifacts"
FORMAT = "graphc-checkpoint/1"
_META_KEY = "graphc"

PathLike = Union[str, os.PathLike]


class CheckpointError(GraphcError, ValueError):
    """A checkpoint is missing, corrupted, or does not belong to these training graphs."""


class LoaderState(BaseModel):
    seed: int
    batch_size: int
    shuffle: bool
    drop_last: bool
    num_samples: int


class CheckpointMeta(BaseModel):
    """What the header of a checkpoint records besides the tensors."""

    format: str = FORMAT
    step: int = 0                     # train steps taken
    epoch: int = 0                    # epoch the next batch belongs to
    batch_in_epoch: int = 0           # batches of that epoch already consumed
    loader: Optional[LoaderState] = None
    rng: dict[str, Any] = {}          # numpy bit-generator state of the Trainer's RNG
    roles: dict[str, str] = {}        # tensor name -> manifest role (param, state)
    backend: str = ""
    artifacts: str = ""               # where the training graphs were loaded from, if anywhere
    interface: str = ""               # digest of the train_step interface the tensors fit
    digest: str = ""                  # sha256 over the tensor data (filled in by save)


def resolve(path: PathLike) -> Path:
    """The checkpoint file for ``path`` (a ``.safetensors`` file or a checkpoint directory)."""
    path = Path(path)
    if path.suffix == ".safetensors" or path.is_file():
        return path
    return path / FILE_NAME


def _digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.asarray(tensors[name], order="C")
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(path: PathLike, tensors: dict[str, np.ndarray], meta: CheckpointMeta) -> Path:
    """Write ``tensors`` and ``meta`` to the checkpoint at ``path`` atomically; returns the file."""
    from safetensors.numpy import save as st_save

    target = resolve(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.asarray(a, order="C") for name, a in tensors.items()}
    meta = meta.model_copy(update={"digest": _digest(arrays)})
    blob = st_save(arrays, metadata={_META_KEY: meta.model_dump_json()})
    return atomic_write(target, blob)


def load(path: PathLike) -> tuple[dict[str, np.ndarray], CheckpointMeta]:
    """Read and verify a checkpoint; ``CheckpointError`` says what is wrong with a bad one."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    target = resolve(path)
    if not target.is_file():
        raise CheckpointError(f"{path}: no checkpoint here (expected {target})")
    data = target.read_bytes()
    try:
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        meta = CheckpointMeta.model_validate_json(header["__metadata__"][_META_KEY])
        tensors = st_load(data)
    except (SafetensorError, ValueError, KeyError, TypeError, ValidationError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{target}: not a readable graphc checkpoint (corrupted or truncated: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if meta.format != FORMAT:
        raise CheckpointError(f"{target}: unknown checkpoint format {meta.format!r} (this graphc reads {FORMAT})")
    if _digest(tensors) != meta.digest:
        raise CheckpointError(f"{target}: checkpoint is corrupted (tensor data does not match its "
                              "recorded SHA-256 digest)")
    return tensors, meta


def artifacts_dir(path: PathLike) -> Optional[Path]:
    """The training graphs stored beside a checkpoint, if it is a directory holding them."""
    folder = resolve(path).parent
    candidate = folder / ARTIFACTS_DIR
    return candidate if (candidate / "manifest.json").is_file() else None


def find_artifacts(path: PathLike) -> Optional[Path]:
    """Where a checkpoint's training graphs are: beside it, else where its header says."""
    beside = artifacts_dir(path)
    if beside is not None:
        return beside
    recorded = load(path)[1].artifacts
    return Path(recorded) if recorded and (Path(recorded) / "manifest.json").is_file() else None
