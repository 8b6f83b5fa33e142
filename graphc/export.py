"""Inference export: the ``inference`` artifact graph with trained tensors folded in, optimized.

    graphc.export.inference_model(artifacts, trained_tensors) -> gc.Model
    graphc.export.export_inference(source, "model.onnx")   # artifact dir or checkpoint

The result is one self-contained ``.onnx`` (params as initializers, no training-only parts,
symbolic batch dim kept) whose outputs equal the ``eval`` graph's model outputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional, Union

import numpy as np
import onnx_ir as ir

from graphc.model import Model

__all__ = ["export_inference", "inference_model", "load_source"]

EXPORT_LEVEL = 3


def inference_model(artifacts, tensors: Mapping[str, np.ndarray], opset: Optional[int] = None,
                    level: int = EXPORT_LEVEL) -> Model:
    """``artifacts.inference`` with every initializer named in ``tensors`` replaced by its
    trained value (params and BatchNorm statistics), optimized at ``level`` and converted to
    ``opset`` when given."""
    model = ir.serde.deserialize_model(artifacts.inference.proto)  # a private copy to edit
    for name, value in model.graph.initializers.items():
        if name in tensors:
            array = np.asarray(tensors[name])
            if value.const_value is not None and tuple(value.const_value.shape) != array.shape:
                raise ValueError(f"trained tensor {name!r} has shape {array.shape}, the inference "
                                 f"graph expects {tuple(value.const_value.shape)}")
            value.const_value = ir.tensor(np.asarray(array, order="C"), name=name)
    result = Model(model)
    if level:
        from graphc.optimization import optimize

        result = optimize(result, level=level)
    if opset is not None:
        from graphc.opsets import convert_opset

        result = convert_opset(result, int(opset))
    return result


def load_source(source: Union[str, os.PathLike]):
    """(artifacts, trained tensors) for an artifact directory or a checkpoint (file or dir)."""
    from graphc import checkpoint, training

    path = Path(source)
    if path.is_dir() and (path / training.MANIFEST_FILE).is_file():
        artifacts = training.load(path)
        return artifacts, dict(artifacts.state)
    target = checkpoint.resolve(path)
    if not target.is_file():
        raise FileNotFoundError(f"{source}: neither an artifact directory (no {training.MANIFEST_FILE}) "
                                f"nor a checkpoint (no {target.name})")
    tensors, meta = checkpoint.load(target)
    where = checkpoint.find_artifacts(target)
    if where is None:
        raise FileNotFoundError(f"{source}: the checkpoint's training graphs are not beside it nor where it "
                                f"recorded them ({meta.artifacts or 'nothing recorded'}); save checkpoints "
                                "as directories to keep the graphs with them")
    artifacts = training.load(where)
    return artifacts, {**artifacts.state, **tensors}


def export_inference(source: Union[str, os.PathLike], path: Union[str, os.PathLike],
                     opset: Optional[int] = None) -> Path:
    """Write the inference model of an artifact directory or checkpoint to ``path``."""
    artifacts, tensors = load_source(source)
    return inference_model(artifacts, tensors, opset=opset).save(path)
