"""The arrays ``graphc train`` trains and evaluates on: the model's batch inputs from ``--data``'s
.npz (``NAME`` or ``NAME_train``) and from ``--eval-data``, or ``--data``'s ``NAME_val`` / ``NAME_test``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from graphc.cli.arrays import check_dtypes, fit_bfloat16, load_npz, npz_names
from graphc.errors import InputError
from graphc.model.complex_io import pairs_of
from graphc.runtime.labels import int64_labels

EVAL_SUFFIXES = ("val", "test")  # the evaluation split --data holds, in order of preference


def load_data(path: Path, specs: list, eval_path: Optional[Path] = None, labels: frozenset[str] = frozenset(),
              complex_inputs: frozenset[str] = frozenset()
              ) -> tuple[dict[str, np.ndarray], Optional[dict[str, np.ndarray]], str]:
    """Train arrays from ``path`` (each input NAME of ``specs``, the model's batch inputs, as
    ``NAME`` or ``NAME_train``) and the evaluation arrays with where they came from: from
    ``eval_path`` (NAME, NAME_val or NAME_test) when given, else from ``path``'s ``NAME_val``
    arrays, else its ``NAME_test`` arrays (each set used only when every input has one). ``labels``:
    class-label inputs whose uint8 arrays are cast to int64 (``labels.int64_labels``); ``complex_inputs``: those
    whose complex arrays are read as their ``[..., 2]`` pairs (``complex_io.pairs_of``)."""
    train, _ = _pick_arrays(path, "--data", specs, ("", "_train"), labels=labels, complex_inputs=complex_inputs)
    if eval_path is not None:
        arrays, keys = _pick_arrays(eval_path, "--eval-data", specs, ("", *(f"_{s}" for s in EVAL_SUFFIXES)),
                                    labels=labels, complex_inputs=complex_inputs)
        return train, arrays, f"{', '.join(keys)} of --eval-data {eval_path}"
    found = _pick_arrays(path, "--data", specs, tuple(f"_{s}" for s in EVAL_SUFFIXES), required=False, labels=labels,
                         complex_inputs=complex_inputs)
    if found is None:
        return train, None, ""
    arrays, keys = found
    return train, arrays, f"{', '.join(keys)} of {path}"


def _pick_arrays(path: Path, option: str, specs: list, suffixes: tuple[str, ...], required: bool = True,
                 labels: frozenset[str] = frozenset(), complex_inputs: frozenset[str] = frozenset()
                 ) -> Optional[tuple[dict[str, np.ndarray], list[str]]]:
    """Each input NAME's array NAME+suffix in the .npz ``path``, one suffix for every input (the
    first that all have: ``x_val`` with ``y``, two different sets of rows, was once paired), of
    its input's dtype (``fit_bfloat16``), and the array names used; where no suffix fits every
    input, an error, or None if not ``required``."""
    names = [spec.name for spec in specs]
    files = set(npz_names(path, option))
    suffix = next((s for s in suffixes if all(name + s in files for name in names)), None)
    if suffix is None and not required:
        return None
    if suffix is None:
        for name in names:
            if not any(name + s in files for s in suffixes):
                raise ValueError(f"{option} {path}: no array {' or '.join(repr(name + s) for s in suffixes)} for the "
                                 f"model input {name!r}; arrays in the file: {', '.join(sorted(files))}")
        sets = "; ".join(", ".join(name + s for name in names) for s in suffixes)
        raise ValueError(f"{option} {path}: the inputs' arrays are from different sets (arrays in the file: "
                         f"{', '.join(sorted(files))}); give every input with one suffix: {sets}")
    keys = [name + suffix for name in names]
    arrays = load_npz(path, option, keys)
    rows = {key: f"{len(a)} rows" if a.ndim else "a scalar" for key, a in arrays.items()}
    if len(set(rows.values())) > 1 or "a scalar" in rows.values():
        raise ValueError(f"{option} {path}: the inputs' arrays need one row per sample, the same length along axis 0; "
                         f"got {', '.join(f'{key!r} {n}' for key, n in rows.items())}")
    picked = int64_labels(fit_bfloat16({name: arrays[key] for name, key in zip(names, keys)}, specs), labels)
    try:
        picked = pairs_of(specs, complex_inputs, picked)
    except InputError as exc:
        raise InputError(f"{option} {path}: {exc}") from None
    check_dtypes(picked, specs, keys, f"{option} {path}")
    return picked, keys
