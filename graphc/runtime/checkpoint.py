"""Training checkpoints: one safetensors file, written atomically, verified on load.

A checkpoint is either a file ``NAME.safetensors`` or a directory holding
``checkpoint.safetensors`` (and, when the Trainer wrote it, ``artifacts/``: the training graphs
the tensors belong to, so ``graphc export CHECKPOINT`` needs nothing else). The file holds every
tensor the training loop carries from step to step (params, optimizer state, step count,
BatchNorm statistics) and, in the safetensors header, a JSON ``CheckpointMeta``: the loop
position (step, epoch, batch within the epoch), the running sums of the epoch under way (so the
resumed epoch's printed loss covers the batches before the interrupt too), the loader settings
(its order is a function of seed and epoch) and the Trainer's RNG states, so a resumed run
replays exactly the losses of the uninterrupted one. A SHA-256 digest of the tensor data and
of the header's other fields makes a corrupted file (a flipped step count as much as a flipped
weight) fail loudly instead of training on garbage. No pickle.

Writes go to a temporary file in the same folder, are fsync'ed, then ``os.replace``d over the
previous checkpoint (and the folder fsync'ed): a crash at any moment leaves either the old or
the new checkpoint, never a torn one (``graphc.fileio``; temps of killed writers are removed by
the next save or load). ``artifacts/`` is written and kept by ``checkpoint_folder``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import (BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt, PositiveInt, PrivateAttr,
                      SerializationInfo, ValidationError, field_serializer, field_validator, model_validator)

from graphc.errors import GraphcError
from graphc.fileio import OutsideFolder, atomic_write, confined, remove_stale_temps
from graphc.model.structure import GraphStructure
from graphc.tensorfile import DTYPES, RepeatedKey, read_header, read_tensors, unique_keys

__all__ = ["ARTIFACTS_DIR", "ARTIFACTS_MANIFEST", "CheckpointError", "CheckpointMeta", "EpochProgress", "FILE_NAME",
           "LoaderState", "batch_weighted", "check_writable", "hypers_as_declared", "load", "mismatch", "own_entry",
           "read_meta", "read_meta_and_table", "read_tensor_table", "resolve", "save", "save_failed", "writable_header"]

FILE_NAME = "checkpoint.safetensors"
ARTIFACTS_DIR = "artifacts"
ARTIFACTS_MANIFEST = "manifest.json"  # what makes a folder one of training artifacts (``compile.training``)
FORMAT = "graphc-checkpoint/5"
# Formats 1 to 4 are still read. Format 1's digest covers the tensors only (not the header);
# 1 and 2 keep ``progress.loss_sum`` as the plain sum of the steps' losses, 3 and 4 a summed
# loss's weighted by batch size as a mean loss's (``batch_weighted``); 1 and 2 lack format 3's
# fields; up to 3 a non-finite train-metric sum may be written as null
# (pydantic's default then; from format 4 on "NaN", "Infinity", "-Infinity"), read as NaN.
_TENSOR_ONLY_DIGEST_FORMAT = "graphc-checkpoint/1"
_UNWEIGHTED_FORMATS = (_TENSOR_ONLY_DIGEST_FORMAT, "graphc-checkpoint/2")
_ROW_WEIGHTED_FORMATS = ("graphc-checkpoint/3", "graphc-checkpoint/4")
FORMATS = (*_UNWEIGHTED_FORMATS, *_ROW_WEIGHTED_FORMATS, FORMAT)
_NULL_SUM_FORMATS = FORMATS[:3]
_META_KEY = "graphc"

PathLike = Union[str, os.PathLike]


class CheckpointError(GraphcError, ValueError):
    """A checkpoint is missing, corrupted, or does not belong to these training graphs."""


# A header field this graphc does not know is refused (pydantic would drop it unread, and the
# digest, computed over the fields read, would not notice): a hand-made or corrupted header.
_STRICT = ConfigDict(extra="forbid")


class LoaderState(BaseModel):
    """The DataLoader settings a run used; a resumed run replays its batches from them."""

    model_config = _STRICT

    seed: NonNegativeInt
    batch_size: PositiveInt
    shuffle: bool
    drop_last: bool
    num_samples: NonNegativeInt
    data: str = ""  # the arrays' ``DataLoader.fingerprint``; "" in checkpoints from before it was kept

    def batches(self) -> int:
        """Batches per epoch (as ``DataLoader.__len__``)."""
        return self.num_samples // self.batch_size if self.drop_last else -(-self.num_samples // self.batch_size)


class EpochProgress(BaseModel):
    """Running sums over the batches of the epoch under way (``Trainer.fit`` prints their mean).
    A train metric's sum is NaN or infinite where the metric was on a batch (undefined there, say)
    and is written as the JSON strings "NaN", "Infinity", "-Infinity" (pydantic's default, null,
    would not read back); the loss sum and the time are finite (``fit`` stops at a NaN loss)."""

    model_config = ConfigDict(ser_json_inf_nan="strings", extra="forbid")

    steps: NonNegativeInt = 0       # batches whose loss ``loss_sum`` holds
    loss_sum: float = 0.0           # their losses times ``averaging.epoch_weight``, added in order (float64)
    samples: NonNegativeInt = 0
    seconds: NonNegativeFloat = 0.0  # train time so far
    metric_sums: dict[str, float] = {}  # train metric -> its batch values times their examples, added in order
    metric_examples: NonNegativeInt = 0  # those examples (``averaging.examples``: labels not ignored, else rows)
    skipped_steps: Optional[NonNegativeInt] = None  # with loss scaling: of its steps, those skipped (inf/NaN gradients)

    def mean_loss(self, empty: Optional[float] = None) -> Optional[float]:
        """The epoch's loss so far, per sample (``loss_sum / samples``); ``empty`` before any."""
        return self.loss_sum / self.samples if self.samples else empty

    @field_serializer("metric_sums", when_used="json")
    def _sums_as_written(self, sums: dict[str, float], info: SerializationInfo) -> dict[str, Optional[float]]:
        """With the context ``nulls`` (a checkpoint from before format 4 that held them), a
        non-finite sum as null, as its digest hashed it."""
        if (info.context or {}).get("nulls"):
            return {name: value if math.isfinite(value) else None for name, value in sums.items()}
        return sums

    @field_validator("loss_sum", "seconds")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class ScheduleState(BaseModel):
    """The lr scheduler's state as ``Trainer.schedule_state`` writes it (``CheckpointMeta.schedule``)."""

    model_config = _STRICT

    kind: str                          # the scheduler's class name
    interval: Literal["epoch", "step"]  # when fit steps it
    recipe: Any = None                 # ``graphc train --schedule``'s settings, else None
    group: dict[str, Any]              # the lr group's entries
    state: dict[str, Any]              # its ``state_dict()``


def batch_weighted(meta: "CheckpointMeta", summed: bool = False) -> EpochProgress:
    """``meta.progress`` as fit keeps it from format 5 on, for a loss ``summed`` or not
    (``averaging.epoch_weight``): formats 1 and 2's plain sum of the steps' losses becomes, for a
    mean loss, their mean times the samples, and their metric sums, weighted by rows, cover
    the samples; formats 3 and 4's summed loss, weighted by batch size, becomes the plain sum
    (both exact where the batches were equal, as all but an epoch's last are)."""
    sums = meta.progress.model_copy()
    if not sums.steps:
        return sums
    if meta.format in _UNWEIGHTED_FORMATS:
        sums.metric_examples = sums.samples
        if not summed:
            sums.loss_sum = sums.loss_sum / sums.steps * sums.samples
    elif summed and meta.format in _ROW_WEIGHTED_FORMATS:
        sums.loss_sum = sums.loss_sum / sums.samples * sums.steps
    return sums


class CheckpointMeta(BaseModel):
    """What the header of a checkpoint records besides the tensors."""

    model_config = _STRICT

    format: str = FORMAT
    step: NonNegativeInt = 0          # train steps taken
    epoch: NonNegativeInt = 0         # epoch the next batch belongs to
    batch_in_epoch: NonNegativeInt = 0  # batches of that epoch already consumed
    loader: Optional[LoaderState] = None
    progress: EpochProgress = EpochProgress()  # sums over the first batch_in_epoch batches
    rng: dict[str, Any] = {}          # numpy PCG64 bit-generator state of the Trainer's RNG
    seed: Optional[NonNegativeInt] = None  # the Trainer's seed= (data-parallel workers seed noise with it)
    graph_rng: dict[str, dict[str, Any]] = {}  # graph -> the numpy backend's generator for its random ops
    roles: dict[str, str] = {}        # tensor name -> manifest role (param, state)
    backend: str = ""
    artifacts: str = ""               # where the training graphs were loaded from, if anywhere
    interface: str = ""               # digest of the train_step interface the tensors fit
    schedule: str = ""                # the lr scheduler's state as JSON text (Trainer.schedule_state), if one ran
    optimizer: dict[str, Any] = {}    # the optimizer spec the run trained with (``resume_rules``); {} before it was kept
    graphs: str = ""                  # ``Manifest.digest()`` of the graphs the tensors belong to; "" before it was kept
    accumulate: Optional[PositiveInt] = None  # micro-batches per optimizer step (``resume_rules``); None: 1, not kept
    structure: Optional[GraphStructure] = None  # the inference graph's (``model.structure``); None: not kept
    digest: str = ""                  # sha256 over the tensor data and the fields above (filled in by save)
    _nulls: bool = PrivateAttr(False)  # read from a header that wrote a non-finite metric sum as null

    @field_validator("rng")
    @classmethod
    def _rng_is_a_pcg64_state(cls, rng: dict[str, Any]) -> dict[str, Any]:
        if rng:
            try:
                np.random.PCG64().state = rng  # the Trainer's generator (default_rng) takes it
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"not a numpy PCG64 generator state ({exc})") from None
        return rng

    @field_validator("schedule")
    @classmethod
    def _schedule_is_a_schedulers_state(cls, text: str) -> str:
        if text:
            try:
                ScheduleState.model_validate_json(text)
            except ValidationError as exc:  # else a resume would fail deep in it, or never step it
                raise ValueError(f"not a saved lr scheduler state ({_first_error(exc)})") from None
        return text

    @field_validator("graph_rng")
    @classmethod
    def _graph_rngs_are_pcg64_states(cls, states: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for state in states.values():
            cls._rng_is_a_pcg64_state(state)
        return states

    @model_validator(mode="after")
    def _position_fits_the_loader(self) -> "CheckpointMeta":
        if self.loader is not None and self.batch_in_epoch > self.loader.batches():
            raise ValueError(f"batch_in_epoch {self.batch_in_epoch} is past the end of an epoch of "
                             f"{self.loader.batches()} batches")
        if self.progress.steps > self.batch_in_epoch:
            raise ValueError(f"progress.steps {self.progress.steps} is more than the {self.batch_in_epoch} batches "
                             "of the epoch consumed")
        return self


# a checkpoint's header as read: its CheckpointMeta and name -> (dtype name, shape) of every tensor
Header = tuple[CheckpointMeta, dict[str, tuple[str, list[int]]]]


def resolve(path: PathLike) -> Path:
    """The checkpoint file for ``path`` (a ``.safetensors`` file or a checkpoint directory)."""
    path = Path(path)
    if path.suffix == ".safetensors" or path.is_file():
        return path
    return path / FILE_NAME


def _digest(tensors: dict[str, np.ndarray], meta: CheckpointMeta) -> str:
    """SHA-256 of every tensor (name, dtype, shape, bytes) and, from format 2 on, of the header
    fields other than the digest itself."""
    h = hashlib.sha256()
    if meta.format != _TENSOR_ONLY_DIGEST_FORMAT:
        exclude: dict = {"digest": True}
        if meta.seed is None:  # a header from before the seed was saved hashed without it
            exclude["seed"] = True
        if not meta.schedule:  # nor one from before lr schedulers, or of a run without one
            exclude["schedule"] = True
        if not meta.optimizer:  # nor one from before the optimizer spec was kept
            exclude["optimizer"] = True
        if not meta.graphs:  # nor one from before the graphs' digest was kept
            exclude["graphs"] = True
        if meta.accumulate is None:  # nor one from before the micro-batches per step were kept
            exclude["accumulate"] = True
        if meta.structure is None:  # nor one from before the inference graph's structure was kept
            exclude["structure"] = True
        elif meta.structure.opset is None:  # nor one from before its opset was kept
            exclude["structure"] = {"opset"}
        if meta.progress.skipped_steps is None:  # nor one from before loss scaling's count, or of a run without
            exclude["progress"] = {"skipped_steps"}
        if meta.format in _UNWEIGHTED_FORMATS:  # the header as formats 1 and 2 hashed it, without format 3's fields
            exclude["progress"] = {"metric_examples", "skipped_steps"}
            if meta.loader is not None:
                exclude["loader"] = {"data"}
        nulls = meta._nulls and meta.format in _NULL_SUM_FORMATS  # as read, not as written again
        h.update(meta.model_dump_json(exclude=exclude, context={"nulls": nulls}).encode())
    for name in sorted(tensors):
        a = np.asarray(tensors[name], order="C")
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(path: PathLike, tensors: dict[str, np.ndarray], meta: CheckpointMeta) -> Path:
    """Write ``tensors`` and ``meta`` to the checkpoint at ``path`` atomically; returns the file."""
    from safetensors.numpy import save as st_save

    target = check_writable(path)
    arrays = {name: np.asarray(a, order="C") for name, a in tensors.items()}
    meta = meta.model_copy(update={"format": FORMAT, "digest": ""})
    meta = meta.model_copy(update={"digest": _digest(arrays, meta)})
    blob = st_save(arrays, metadata={_META_KEY: meta.model_dump_json()})
    return atomic_write(target, blob)


def save_failed(exc: OSError, target: Path, step: int) -> OSError:
    """``exc``, raised saving the checkpoint of ``step`` to ``target``, as an ``OSError`` of its
    errno that names the file, the step not saved, and what ``target`` holds now (the save is
    atomic: the checkpoint there before, untouched, or none; or that it could not be read)."""
    try:
        kept = f"the checkpoint there, of step {read_meta(target).step}, is as it was and resumes"
    except CheckpointError:
        kept = "no checkpoint was written there"
    except OSError as unread:  # the disk that failed the save may fail this read too: the save's error stays
        kept = f"what is there could not be read back ({unread.strerror or unread})"
    where = f" writing {exc.filename}" if exc.filename is not None and Path(exc.filename) != target else ""
    return OSError(exc.errno, f"cannot save the checkpoint of step {step} to {target} ({exc.strerror or exc}{where}); "
                              f"{kept}")


def check_writable(path: PathLike) -> Path:
    """The checkpoint file for ``path`` if a checkpoint may be written there: nothing is there
    yet, or a graphc checkpoint (which is replaced). ``CheckpointError`` for anything else (a
    directory, another kind of file), so nothing that is not a checkpoint is overwritten, and for
    a file in a folder of training artifacts: ``gc.Trainer(folder)`` reads the artifacts there and
    would start from them, not resume (and a checkpoint folder's ``artifacts/`` would nest in it)."""
    return writable_header(path)[0]


def writable_header(path: PathLike, header: Optional[Header] = None) -> tuple[Path, Optional[Header]]:
    """``check_writable``'s file for ``path`` and the ``read_meta_and_table`` of the checkpoint there (None
    where there is none), its header read once; ``header``, where the caller has read it, is not read again."""
    target = resolve(path)
    if (target.parent / ARTIFACTS_MANIFEST).is_file():
        raise CheckpointError(f"{path}: a checkpoint is not written into a folder of training artifacts "
                              f"({target.parent} holds {ARTIFACTS_MANIFEST}), where gc.Trainer(folder) would start "
                              f"from the artifacts and not resume; choose another folder, such as "
                              f"{target.parent / 'checkpoint'}")
    if header is None and (target.exists() or target.is_symlink()):
        _existing_file(target, path)
        try:
            header = read_meta_and_table(target)
        except CheckpointError as exc:
            reason = str(exc).removeprefix(f"{target}: ")
            raise CheckpointError(f"{target} exists and is not a graphc checkpoint ({reason}); refusing to "
                                  "overwrite it with one") from None
    return target, header


def load(path: PathLike) -> tuple[dict[str, np.ndarray], CheckpointMeta]:
    """Read and verify a checkpoint; ``CheckpointError`` says what is wrong with a bad one."""
    target = _existing_file(resolve(path), path)
    remove_stale_temps(target)
    meta, header, start = _read_header(target)
    try:
        tensors = read_tensors(target, header, start)  # each into its own array: no second copy
    except ValueError as exc:
        raise CheckpointError(f"{target}: not a readable graphc checkpoint (corrupted or truncated: {exc})") from None
    if _digest(tensors, meta) != meta.digest:
        raise CheckpointError(f"{target}: checkpoint is corrupted (its tensor data or header does not match its "
                              "recorded SHA-256 digest)")
    return tensors, meta


def read_meta(path: PathLike) -> CheckpointMeta:
    """The header of the checkpoint at ``path``, validated, without reading its tensors."""
    return _read_header(_existing_file(resolve(path), path))[0]


def _read_header(target: Path) -> tuple[CheckpointMeta, dict, int]:
    """The validated ``CheckpointMeta``, the whole safetensors header of ``target`` and the offset
    its data starts at, in one read."""
    try:
        header, start = read_header(target)
    except RepeatedKey as exc:
        raise CheckpointError(f"{target}: not a readable graphc checkpoint ({exc}: a corrupted or hand-made "
                              "file)") from None
    except ValueError:
        raise CheckpointError(f"{target}: not a readable graphc checkpoint (not a safetensors file, or "
                              "truncated within its header)") from None
    return _parse_meta(target, header), header, start


# safetensors' dtype codes -> graphc dtype names (numpy's, and bfloat16, which numpy lacks)
_DTYPES = {code: np.dtype(dtype).name for code, dtype in DTYPES.items()} | {"BF16": "bfloat16"}


def read_tensor_table(path: PathLike) -> dict[str, tuple[str, list[int]]]:
    """Name -> (dtype name, shape) of every tensor in the checkpoint at ``path``, from its header."""
    return _tensor_table(_read_header(_existing_file(resolve(path), path))[1])


def read_meta_and_table(path: PathLike) -> Header:
    """``read_meta(path)`` and ``read_tensor_table(path)`` from one read of its header."""
    meta, header, _ = _read_header(_existing_file(resolve(path), path))
    return meta, _tensor_table(header)


def _tensor_table(header: dict) -> dict[str, tuple[str, list[int]]]:
    return {name: (_DTYPES.get(info.get("dtype"), str(info.get("dtype"))), info["shape"])
            for name, info in header.items() if isinstance(info, dict) and isinstance(info.get("shape"), list)}


# the float dtypes a hyper-parameter (lr) may be saved in: float32, or float64 where the graphs
# train a float64 param (before that, float32 there too); either resumes, as the graphs declare it
HYPER_DTYPES = ("float32", "float64")


def mismatch(expected: Mapping[str, Any], have: Mapping[str, tuple[str, list]],
             roles: Mapping[str, str] = {}) -> Optional[str]:
    """Why tensors ``have`` (name -> (dtype name, shape); ``roles`` name -> role where known) do
    not fit the carried manifest entries ``expected`` (name -> ``TensorEntry``): the first missing
    or differently typed one (a hyper-parameter of either ``HYPER_DTYPES`` fits), else the first
    one they lack; None if they fit."""
    for name, entry in expected.items():
        if name not in have:
            return f"has no {entry.role} {name!r}"
        dtype, shape = have[name]
        fixed = entry.shape is not None and all(isinstance(d, int) for d in entry.shape)
        retyped = entry.role == "hyper" and {dtype, entry.dtype} <= set(HYPER_DTYPES)
        if (dtype != entry.dtype and not retyped) or (fixed and list(shape) != list(entry.shape)):
            return (f"holds {entry.role} {name!r} as {dtype}{list(shape)}, the training graphs "
                    f"expect {entry.dtype}{entry.shape}")
    return next((f"has {roles.get(name, 'tensor')} {name!r}, which these training graphs lack"
                 for name in have if name not in expected), None)


def hypers_as_declared(tensors: Mapping[str, np.ndarray], expected: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The hyper-parameters of ``tensors`` that ``mismatch`` let through in the other of
    ``HYPER_DTYPES``, cast to the dtype their manifest entry in ``expected`` declares."""
    return {name: np.asarray(tensors[name]).astype(entry.dtype) for name, entry in expected.items()
            if entry.role == "hyper" and name in tensors and np.asarray(tensors[name]).dtype.name != entry.dtype}


def _existing_file(target: Path, given: PathLike) -> Path:
    if target.parent == Path(given):  # found by name in the folder given: one of its own files
        own_entry(target.parent, target.name)
    if target.is_file():
        return target
    if target.exists():
        raise CheckpointError(f"{target} is a {'directory' if target.is_dir() else 'special file'}, not a "
                              "checkpoint file; move it away or choose another checkpoint path")
    raise CheckpointError(f"{given}: no checkpoint here (expected {target})")


def _parse_meta(target: Path, header: dict) -> CheckpointMeta:
    """The ``CheckpointMeta`` in the safetensors ``header`` of ``target``."""
    extra = header.get("__metadata__")
    text = extra.get(_META_KEY) if isinstance(extra, dict) else None
    if not isinstance(text, str):
        raise CheckpointError(f"{target}: a safetensors file without graphc checkpoint metadata, not a "
                              "checkpoint (an artifact directory's state.safetensors, or another tool's weights?)")
    try:
        raw = json.loads(text, object_pairs_hook=unique_keys)
    except RepeatedKey as exc:
        raise CheckpointError(f"{target}: invalid checkpoint metadata ({exc})") from None
    except ValueError as exc:
        raise CheckpointError(f"{target}: invalid checkpoint metadata (not JSON: {exc})") from None
    found = raw.get("format") if isinstance(raw, dict) else None
    if found not in FORMATS:
        raise CheckpointError(f"{target}: unknown checkpoint format {found!r} (this graphc reads "
                              f"{', '.join(FORMATS)})")
    progress = raw.get("progress")
    sums = progress.get("metric_sums") if found in _NULL_SUM_FORMATS and isinstance(progress, dict) else None
    nulls = isinstance(sums, dict) and None in sums.values()
    if nulls:  # a NaN or infinite sum as pydantic wrote it then: NaN (an infinity's sign is lost)
        raw["progress"]["metric_sums"] = {name: math.nan if value is None else value for name, value in sums.items()}
    try:
        meta = CheckpointMeta.model_validate(raw)
    except ValidationError as exc:
        raise CheckpointError(f"{target}: invalid checkpoint metadata ({_first_error(exc)})") from None
    meta._nulls = nulls
    return meta


def _first_error(exc: ValidationError) -> str:
    """``field: message (got value)`` for the first error, and how many more there are."""
    first = exc.errors()[0]
    message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    if first["type"] == "extra_forbidden":
        message = "not a field of a graphc checkpoint header (a hand-made or corrupted one?)"
    where = ".".join(map(str, first["loc"]))
    got = repr(first["input"]) if where else ""
    text = f"{where}: {message}" + (f" (got {got})" if got and len(got) <= 60 else "") if where else message
    return text + (f"; {exc.error_count() - 1} more error(s)" if exc.error_count() > 1 else "")


def own_entry(folder: Path, name: str) -> Path:
    """``folder / name`` if it lies in ``folder`` (``fileio.confined``), else ``CheckpointError``."""
    try:
        return confined(folder, name, "checkpoint folder")
    except OutsideFolder as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
