"""A checkpoint folder's training graphs: ``artifacts/`` beside ``checkpoint.safetensors``, always
the graphs its tensors belong to (the checkpoint records their ``Manifest.digest()``).

A save from graphs other than those there (a ``changed_optimizer`` resume on regenerated
artifacts) replaces them with the checkpoint as one step: the new graphs are written whole into a
temp folder beside (``fileio.scratch_dir``), the checkpoint file is then replaced (the commit),
then the temp folder is renamed to ``artifacts/`` and the old graphs removed. A failure before
the commit removes the temp folder: the old pair stays. A process killed after it leaves the
committed graphs in its temp folder, which the next look at the folder (``artifacts_dir``) puts in
place, as it removes a killed writer's uncommitted ones: never a checkpoint beside other graphs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from graphc.errors import InputError
from graphc.fileio import fsync_dir, missing, remove_stale_temps, stale_temps, sync_tree, temp_path
from graphc.model.structure import GraphStructure, difference, of
from graphc.runtime.checkpoint import (ARTIFACTS_DIR, ARTIFACTS_MANIFEST, FILE_NAME, CheckpointError, Header, PathLike,
                                       load, mismatch, own_entry, read_meta, resolve, writable_header)

if TYPE_CHECKING:
    from graphc.compile.training import Manifest

__all__ = ["artifacts_dir", "check_owner", "check_training_source", "find_artifacts", "graphs_beside",
           "refuse_other_model", "structure_of", "trained_from"]


def artifacts_dir(path: PathLike) -> Optional[Path]:
    """The training graphs stored beside a checkpoint, if it is a directory holding them (a
    killed save's committed graphs put in place first: ``_settle``)."""
    folder = resolve(path).parent
    candidate = own_entry(folder, ARTIFACTS_DIR)
    _settle(candidate)
    return candidate if (candidate / ARTIFACTS_MANIFEST).is_file() else None


def _settle(final: Path) -> None:
    """Finish what a killed save left beside ``final`` (a checkpoint folder's ``artifacts/``):
    graphs in its temp folder that the checkpoint there records go in place, the rest of its
    temps (uncommitted graphs) are removed, and the old graphs a killed save moved aside (also
    where it was killed after putting the new ones in place). Best effort: a folder that cannot
    be written is left as it is."""
    staged = stale_temps(final)
    if staged:
        checkpoint = final.parent / FILE_NAME
        try:
            recorded = read_meta(checkpoint).graphs if checkpoint.is_file() else ""
        except CheckpointError:
            recorded = ""
        committed = next((s for s in staged if recorded and _digest_of(s) == recorded), None)
        try:
            if committed is not None:
                _put_in_place(committed, final)
            remove_stale_temps(final)
        except OSError:
            pass
    remove_stale_temps(_aside(final))


def _digest_of(folder: Path) -> str:
    from graphc.compile.training import read_manifest

    try:
        return read_manifest(folder).digest()
    except (OSError, ValueError):
        return ""


def _aside(final: Path) -> Path:
    """The name whose temps hold graphs moved aside from ``final`` while new ones take its place."""
    return final.with_name(f"{final.name}.old")


def _put_in_place(staged: Path, final: Path) -> None:
    """Rename the graphs in ``staged`` to ``final``, the graphs there moved aside and removed."""
    old = temp_path(_aside(final))
    if final.exists() or final.is_symlink():
        os.rename(final, old)
    os.rename(staged, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def graphs_beside(target: Path, artifacts: Any, beside: Optional[Manifest],
                  structure: GraphStructure) -> Iterator[str]:
    """Around the write of the checkpoint file ``target`` (the body), make its folder's
    ``artifacts/`` hold ``artifacts`` (training graphs, their inference graph's ``model.structure``
    ``structure``); yields their ``Manifest.digest()`` for the checkpoint to record. Graphs already
    there (``beside``: their manifest, as ``check_owner`` read it) of that digest are kept where the
    checkpoint there records that structure too (the digest does not tell another model of the same
    tensor names: ``changed_model``); others are replaced with the checkpoint as one step (the
    module's docstring). A file checkpoint (not ``checkpoint.safetensors``) keeps no graphs."""
    digest = artifacts.manifest.digest()
    final = own_entry(target.parent, ARTIFACTS_DIR) if target.name == FILE_NAME else None
    kept = beside is not None and beside.digest() == digest and target.is_file()
    if final is None or (kept and read_meta(target).structure == structure):
        yield digest
        return
    if (final.exists() or final.is_symlink()) and not (final / ARTIFACTS_MANIFEST).is_file():
        raise CheckpointError(f"{final} exists and holds no training artifacts (no manifest.json); move it "
                              "away or choose another checkpoint folder")
    remove_stale_temps(final)
    staged = temp_path(final)
    try:
        artifacts.save(staged)
        sync_tree(staged)
        yield digest
    except BaseException:  # not committed: the old pair stays
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _put_in_place(staged, final)  # committed: a failure here leaves them for ``_settle``


def check_owner(path: PathLike, expected: Mapping[str, Any], replacing: Optional[Path] = None,
                header: Optional[Header] = None,
                structure: Optional[GraphStructure] = None) -> tuple[Path, Optional[Manifest]]:
    """``check_writable(path)``, and ``CheckpointError`` when what is there (the checkpoint, or
    the training graphs beside it) belongs to other training graphs than those carrying
    ``expected`` (``Manifest.carried()``), naming the first tensor that differs, or, where
    ``structure`` is given (theirs: ``model.structure``), to another model of the same tensors,
    naming the first difference, unless it is the checkpoint file ``replacing`` (resolved: the one a
    params-only or ``changed_model`` load read). A checkpoint
    that holds Adam's moments as earlier graphc named them (``adam_moments.sum_name``) fits, as
    ``Trainer.load_checkpoint`` resumes it; the graphs of such a format beside one do not: the
    folder would hold a checkpoint they cannot read. ``header``: the checkpoint's
    ``read_meta_and_table`` where the caller has read it. Returns the checkpoint file's path and
    the manifest of the graphs beside it (None where there are none: for ``graphs_beside``)."""
    from graphc.compile.training import read_manifest
    from graphc.passes.training.adam_moments import sum_name

    target, header = writable_header(path, header)
    found = []
    mine = replacing is not None and target.resolve() == replacing
    if header is not None:
        meta, table = header
        found.append((target, {sum_name(n, expected): v for n, v in table.items()},
                      {sum_name(n, expected): r for n, r in meta.roles.items()}))
    beside = artifacts_dir(target) if target.name == FILE_NAME else None
    manifest = read_manifest(beside) if beside is not None else None
    if beside is not None:
        carried = manifest.carried()
        found.append((beside / ARTIFACTS_MANIFEST, {n: (e.dtype, e.shape or []) for n, e in carried.items()},
                      {n: e.role for n, e in carried.items()}))
    for where, tensors, roles in [] if mine else found:
        problem = mismatch(expected, tensors, roles)
        if problem is not None and any(sum_name(n, expected) != n for n in tensors):
            raise CheckpointError(f"{path} holds training graphs of an earlier format ({where.parent}), which keep "
                                  "Adam's moments as averages: refusing to write these graphs' checkpoint beside them; "
                                  f"resume with those graphs (artifacts {where.parent}) or choose another checkpoint path")
        if problem is not None:
            raise CheckpointError(f"{path} belongs to other training graphs (another model?): {where} {problem}; "
                                  "refusing to overwrite it, choose another checkpoint path")
    saved = header[0].structure if header is not None and not mine else None
    problem = None if saved is None or structure is None else difference(saved, structure)
    if problem is not None:
        raise CheckpointError(f"{path} belongs to another model of the same tensors: {problem}; refusing to "
                              "overwrite it, choose another checkpoint path (or load it with changed_model=True "
                              "first, to train it on in these graphs)")
    return target, manifest


def check_training_source(path: Path) -> None:
    """Refuse, as what to train, a path that is neither artifacts nor a checkpoint, saying so up
    front: nothing there, or an ONNX model (read as a checkpoint, it failed as "not a readable
    graphc checkpoint")."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: {missing(path, 'artifact directory or checkpoint')}")
    if path.is_file() and path.suffix.lower() == ".onnx":
        raise InputError(f"{path} is an ONNX model, not training artifacts or a checkpoint: generate its training "
                         "graphs first (gc.training.generate(model, loss, optimizer).save(DIR), or graphc grad "
                         f"{path} --loss KIND:OUTPUT -o DIR) and train DIR")


def find_artifacts(path: PathLike) -> Optional[Path]:
    """Where a checkpoint's training graphs are: beside it, else where its header says.
    ``refuse_other_model`` where their inference graph is not the one the checkpoint was saved
    with."""
    meta = read_meta(path)
    found = artifacts_dir(path)
    if found is None and meta.artifacts and (Path(meta.artifacts) / ARTIFACTS_MANIFEST).is_file():
        found = Path(meta.artifacts)
    if found is not None and meta.structure is not None:
        refuse_other_model(path, meta.structure, structure_of(found), f"at {found}",
                           "Put its own graphs back there, or load its tensors into the graphs you mean explicitly "
                           "(gc.Trainer(ARTIFACTS).load_checkpoint(CHECKPOINT), with changed_model=True where their "
                           "model was changed on purpose)")
    return found


def refuse_other_model(path: PathLike, saved: GraphStructure, found: GraphStructure, graphs: str,
                       way_on: str) -> None:
    """``CheckpointError`` where the training graphs ``graphs`` (where they are, in words), whose
    inference graph's ``model.structure`` is ``found``, are not those the checkpoint at ``path`` was
    saved with (``saved``, its header's): another model with the same tensor names, or the model
    lowered otherwise at another opset. Names the first difference and ``way_on``. A header edited
    to record another structure is refused as corrupted (its digest is verified on this path
    alone), not blamed on the graphs."""
    problem = difference(saved, found)
    if problem is not None:
        load(path)
        raise CheckpointError(f"{resolve(path)}: the training graphs {graphs} are not the ones this checkpoint was "
                              f"saved with: {problem}. {way_on}")


def structure_of(artifacts: Path) -> GraphStructure:
    """The ``model.structure`` of the inference graph in the artifact directory ``artifacts``,
    its weights left unread where they are external."""
    import onnx_ir as ir

    from graphc.compile.training import read_manifest

    return of(ir.load(own_entry(artifacts, read_manifest(artifacts).graphs["inference"].file)))


def trained_from(artifacts: PathLike, near: Iterable[PathLike]) -> list[Path]:
    """Checkpoint files in the folders ``near`` and their sub-folders that were trained from the
    artifact directory ``artifacts`` (their header records it, or they hold it beside them as
    their ``artifacts/``), newest first. Only headers are read; unreadable files are skipped."""
    root = Path(artifacts).resolve()
    folders = dict.fromkeys(Path(f).resolve() for f in near)
    candidates = dict.fromkeys(c for f in folders for pattern in ("*.safetensors", "*/*.safetensors")
                               for c in sorted(f.glob(pattern)))
    found = []
    for candidate in candidates:
        try:
            recorded = read_meta(candidate).artifacts
        except (CheckpointError, OSError):
            continue
        beside = candidate.name == FILE_NAME and (candidate.parent / ARTIFACTS_DIR).resolve() == root
        if beside or (recorded and Path(recorded).resolve() == root):
            found.append(candidate)
    return sorted(found, key=lambda c: c.stat().st_mtime, reverse=True)
