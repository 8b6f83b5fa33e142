"""Inference export: the ``inference`` artifact graph with trained tensors folded in, optimized.

    graphc.compile.export.inference_model(artifacts, trained_tensors) -> gc.Model
    graphc.compile.export.export_inference(source, "model.onnx")   # artifact dir or checkpoint
    graphc.compile.export.export_inference(source, "swa.onnx", averaged=True)   # its SWA/EMA weights

The result is one self-contained ``.onnx`` (params as initializers, no training-only parts,
symbolic batch dim kept) whose outputs equal the ``eval`` graph's model outputs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Optional, Union

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphcError
from graphc.fileio import missing
from graphc.model import Model
from graphc.model.quantizers import FAKE_QUANTIZERS_KEY, never_calibrated, uncalibrated

__all__ = ["ExportError", "UncalibratedError", "UntrainedWeightsWarning", "check_calibrated", "export_inference",
           "inference_model", "load_source"]

EXPORT_LEVEL = 3


def inference_model(artifacts, tensors: Mapping[str, np.ndarray], opset: Optional[int] = None,
                    level: int = EXPORT_LEVEL, dtype: Optional[str] = None, keep_io_types: bool = False,
                    allow_uncalibrated: bool = False) -> Model:
    """``artifacts.inference`` with every initializer named in ``tensors`` replaced by its
    trained value (params and BatchNorm statistics), optimized at ``level``, converted to
    ``opset`` when given and to ``dtype`` ("float16", "bfloat16": ``gc.convert_float``, its
    float32 inputs and outputs kept float32 with ``keep_io_types``) when given. A fake
    quantization whose observer never saw data is refused (``check_calibrated``)."""
    from graphc.compile.precision import check_keep_io_types, convert_float

    check_keep_io_types(dtype, keep_io_types, default=False)
    model = ir.serde.deserialize_model(artifacts.inference.proto)  # a private copy to edit
    check_calibrated(model, tensors, allow_uncalibrated)
    model.metadata_props.pop(FAKE_QUANTIZERS_KEY, None)  # what capture saw, not what the file holds
    for name, value in model.graph.initializers.items():
        if name in tensors:
            array = np.asarray(tensors[name])
            if value.const_value is not None and tuple(value.const_value.shape) != array.shape:
                raise ValueError(f"trained tensor {name!r} has shape {array.shape}, the inference "
                                 f"graph expects {tuple(value.const_value.shape)}")
            value.const_value = ir.tensor(np.asarray(array, order="C"), name=name)
    result = Model(model)
    if level:
        from graphc.compile.optimize import optimize

        result = optimize(result, level=level)
    if opset is not None:
        from graphc.compile.opsets import convert_opset

        result = convert_opset(result, int(opset))
    return result if dtype is None else convert_float(result, dtype, keep_io_types=keep_io_types)


class ExportError(GraphcError, ValueError):
    """No inference model can be exported from this source (a plain model; untrained weights
    while a trained checkpoint of them exists)."""


class UncalibratedError(ExportError):
    """A model's fake quantizations were never calibrated: deployed, they would quantize with the scale and
    zero point they were built with (1.0 and 0) and compute garbage."""


def check_calibrated(model: ir.Model, tensors: Optional[Mapping[str, np.ndarray]] = None,
                     allow_uncalibrated: bool = False) -> None:
    """Raise ``UncalibratedError`` naming ``model``'s fake quantizations whose observer never saw data (the
    statistics in ``tensors``, else as captured: ``graphc.model.quantizers``), unless ``allow_uncalibrated``."""
    names = uncalibrated(model, tensors)
    if names and not allow_uncalibrated:
        raise UncalibratedError(never_calibrated(names) + ", or, with scales set by hand, allow it explicitly "
                                "(allow_uncalibrated=True; --allow-uncalibrated)")


class UntrainedWeightsWarning(UserWarning):
    """An export carries the artifacts' initial weights, not trained ones."""


def load_source(source: Union[str, os.PathLike], allow_untrained: bool = False):
    """(artifacts, trained tensors) for an artifact directory or a checkpoint (file or dir).

    An artifact directory holds initial weights (its state's ``step`` is 0: ``graphc grad`` wrote
    them and training never changes them). Unless ``allow_untrained``, exporting those raises
    ``ExportError`` naming the checkpoint to export instead when one trained from these artifacts
    lies in their parent folder, the current folder or a sub-folder of either, and warns
    (``UntrainedWeightsWarning``) when none does.
    """
    from graphc.compile import training
    from graphc.runtime import checkpoint, checkpoint_folder

    path = Path(source)
    if path.is_dir() and (path / training.MANIFEST_FILE).is_file():
        artifacts = training.load(path)
        if not allow_untrained and int(artifacts.state.get("step", 0)) == 0:
            _refuse_or_warn(path)
        return artifacts, dict(artifacts.state)
    if path.is_file() and path.suffix.lower() == ".onnx":
        raise ExportError(f"{source} is an ONNX model, not training artifacts or a checkpoint: graphc export "
                          "writes the inference model of an artifact directory (graphc grad -o DIR) or of a "
                          "checkpoint (graphc train --checkpoint DIR); to optimize a model use graphc optimize")
    if not path.exists():
        # as graphc train says
        raise FileNotFoundError(f"{source}: {missing(path, 'artifact directory or checkpoint')}")
    target = checkpoint.resolve(path)
    if not target.exists():
        raise FileNotFoundError(f"{source}: neither an artifact directory (no {training.MANIFEST_FILE}) "
                                f"nor a checkpoint (no {target.name})")
    tensors, meta = checkpoint.load(target)
    where = checkpoint_folder.find_artifacts(target)
    if where is None:
        raise FileNotFoundError(f"{source}: the checkpoint's training graphs are not beside it nor where it "
                                f"recorded them ({meta.artifacts or 'nothing recorded'}); save checkpoints "
                                "as directories to keep the graphs with them")
    artifacts = training.load(where)
    return artifacts, {**artifacts.state, **tensors}


def _refuse_or_warn(artifacts: Path) -> None:
    from graphc.runtime import checkpoint, checkpoint_folder

    found = checkpoint_folder.trained_from(artifacts, near=(artifacts.parent, Path.cwd()))
    if found:
        newest = found[0].parent if found[0].name == checkpoint.FILE_NAME else found[0]
        others = f" (the newest of {len(found)})" if len(found) > 1 else ""
        raise ExportError(f"{artifacts} holds the initial, untrained weights, and checkpoint {newest}{others} "
                          f"was trained from these artifacts: export it instead (graphc export {newest} -o ...), "
                          "or allow the initial weights explicitly (--allow-untrained; allow_untrained=True)")
    warnings.warn(UntrainedWeightsWarning(
        f"{artifacts} holds the initial, untrained weights, and no checkpoint trained from these artifacts "
        "was found beside them or in the current directory: the exported model has untrained weights; export "
        "a checkpoint (graphc train --checkpoint DIR) for trained ones, or allow the initial weights "
        "explicitly (--allow-untrained; allow_untrained=True)"), stacklevel=3)


def export_inference(source: Union[str, os.PathLike], path: Union[str, os.PathLike],
                     opset: Optional[int] = None, allow_untrained: bool = False, dtype: Optional[str] = None,
                     keep_io_types: bool = False, allow_uncalibrated: bool = False, averaged: bool = False) -> Path:
    """Write the inference model of an artifact directory or checkpoint to ``path``; see
    ``load_source`` for when an artifact directory's initial weights are refused, and
    ``inference_model`` for ``opset``, ``dtype``, ``keep_io_types`` and ``allow_uncalibrated``.
    ``averaged``: the averaged copy of the weights (``gc.optim.swa_utils``, as
    ``Trainer.export_inference(averaged=True)``); ``ArtifactsError`` for artifacts that keep none."""
    from graphc.compile.precision import check_keep_io_types
    from graphc.runtime.weight_averaging import as_model

    check_keep_io_types(dtype, keep_io_types, default=False)
    artifacts, tensors = load_source(source, allow_untrained=allow_untrained)
    if averaged:
        tensors = as_model(artifacts.manifest, tensors)
    return inference_model(artifacts, tensors, opset=opset, dtype=dtype, keep_io_types=keep_io_types,
                           allow_uncalibrated=allow_uncalibrated).save(path)
