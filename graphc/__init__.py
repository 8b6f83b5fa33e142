"""graphc: write a model in a small Python DSL, capture it to ONNX, optimize, differentiate,
train and deploy it on numpy or onnxruntime backends.

    import graphc as gc
    model = gc.capture(MyNet(), x=gc.spec("float32", ("N", 784)))
    out = gc.Session(model, backend="ort-cpu").run({"x": batch})

Names are loaded on first use so ``import graphc`` stays light (onnxruntime, FastAPI and
the DSL load only when touched).
"""

from __future__ import annotations

import importlib

from graphc.dtypes import (
    TensorSpec,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int32,
    int64,
    spec,
    uint8,
)
from graphc.errors import (AutodiffError, BackendError, BackendUnavailable, CaptureError, GraphcError, GraphError,
                           InputError, MissingDependency, MissingGradientRule, MissingKernel, ModelLoadError, PassError,
                           PipelineError)
from graphc.model import Model, load
from graphc.version import __version__
from graphc.passes import evaluate as _evaluate

# Passes never import a backend: their compile-time evaluator (constant values, loop trip
# counts, gradient matrices) gets the numpy kernels here, loaded on its first use.
_evaluate.use_kernels(lambda: importlib.import_module("graphc.backends.numpy").run_node)


_OPS = (
    "relu gelu sigmoid tanh exp log sqrt abs softmax log_softmax matmul concat stack reshape "
    "transpose where maximum minimum clip sum mean max min cast"
).split()
_NN_OPS = "conv2d max_pool2d avg_pool2d batch_norm layer_norm dropout embedding".split()

# torch-named functions (issue 12): graphc.dsl.ops_array's and the functional layers of graphc.dsl.ops_layers
_ARRAY_OPS = (
    "pad split chunk gather index_select scatter cumsum einsum topk argmax argmin arange zeros ones full "
    "zeros_like ones_like full_like masked_fill expand repeat tile triu tril one_hot clamp pow rsqrt sin cos cat "
    "permute flip roll logsumexp var std"
).split()
_LAYER_OPS = "interpolate scaled_dot_product_attention".split()

# public name -> (module, attribute); attribute None means the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    **{op: ("graphc.dsl.ops", op) for op in _OPS},
    **{op: ("graphc.dsl.ops_array", op) for op in _ARRAY_OPS},
    **{op: ("graphc.dsl.ops_layers", op) for op in _LAYER_OPS},
    **{op: ("graphc.dsl.ops", op) for op in ("erf", "flatten")},
    **{op: ("graphc.dsl.ops_nn", op) for op in _NN_OPS},
    "Tensor": ("graphc.dsl.tensor", "Tensor"),
    "capture": ("graphc.dsl.capture", "capture"),
    "cond": ("graphc.dsl.control", "cond"),
    "fori_loop": ("graphc.dsl.control", "fori_loop"),
    "scan": ("graphc.dsl.control", "scan"),
    "nn": ("graphc.nn", None),
    "losses": ("graphc.losses", None),
    "optim": ("graphc.optim", None),
    "training": ("graphc.training", None),
    "data": ("graphc.data", None),
    "metrics": ("graphc.metrics", None),
    "checkpoint": ("graphc.checkpoint", None),
    "distributed": ("graphc.distributed", None),
    "parity": ("graphc.parity", None),
    "deploy": ("graphc.deploy", None),
    "optimize": ("graphc.optimization", "optimize"),
    "grad": ("graphc.gradients", "grad"),
    "Session": ("graphc.session", "Session"),
    "BackendInfo": ("graphc.backends.base", "BackendInfo"),
    "Trainer": ("graphc.trainer", "Trainer"),
    "History": ("graphc.trainer", "History"),
    "TrainingArtifacts": ("graphc.training", "TrainingArtifacts"),
    "ParityReport": ("graphc.parity", "ParityReport"),
    "serve": ("graphc.serving", "serve"),
}


def __getattr__(name: str):
    if name == "backends":
        # `gc.backends()` lists backends; the sub-package `graphc.backends` is callable for it.
        return importlib.import_module("graphc.backends")
    if name not in _LAZY:
        raise AttributeError(f"module 'graphc' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


__all__ = [
    "AutodiffError", "BackendError", "BackendUnavailable", "CaptureError", "GraphError", "GraphcError", "InputError",
    "MissingDependency", "MissingGradientRule", "MissingKernel", "Model", "ModelLoadError", "PassError", "PipelineError",
    "TensorSpec", "backends", "bfloat16", "bool_", "float16", "float32", "float64", "int8", "int32", "int64", "load", "spec", "uint8", *_LAZY,
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
