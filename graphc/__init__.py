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
import importlib.machinery
import inspect
import sys

from graphc.startup import quiet_interrupts as _quiet_interrupts

_quiet_interrupts()  # the graphc command: Ctrl-C while it imports exits 130 quietly

from graphc.model.dtypes import (
    TORCH_NAMES as _TORCH_NAMES,
    TensorSpec,
    bfloat16,
    bool_,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    spec,
    uint8,
    uint16,
    uint32,
    uint64,
)
from graphc.errors import (AutodiffError, BackendError, BackendUnavailable, CaptureError, DataParallelWarning,
                           GraphcError, GraphError, InputError, MissingDependency, MissingGradientRule, MissingKernel,
                           ModelLoadError, PassError, PerformanceWarning, PipelineError)
from graphc.model import Model, load
from graphc.version import __version__
from graphc.passes import evaluate as _evaluate

# Passes never import a backend: their compile-time evaluator (constant values, loop trip
# counts, gradient matrices) gets the numpy kernels here, loaded on its first use.
_evaluate.use_kernels(lambda: importlib.import_module("graphc.backends.numpy").run_node)


_OPS = (
    "relu gelu sigmoid tanh exp log sqrt abs softmax log_softmax matmul concat stack reshape "
    "transpose where maximum minimum clip sum mean max min cast detach"
).split()
_NN_OPS = "conv2d max_pool2d avg_pool2d batch_norm layer_norm dropout embedding".split()

# torch-named functions (issue 12): graphc.dsl.ops_array's
_ARRAY_OPS = (
    "pad split chunk gather index_select scatter cumsum einsum topk argmax argmin arange zeros ones full "
    "zeros_like ones_like full_like masked_fill expand repeat tile triu tril one_hot clamp rsqrt sin cos cat "
    "permute flip roll logsumexp var std"
).split()
_MATH_OPS = ("square reciprocal neg sign floor ceil round trunc frac logaddexp logical_not logical_and logical_or "
             "logical_xor isnan isinf isfinite nan_to_num prod amax amin any all norm").split()
_VIEW_OPS = ("unflatten movedim narrow select t expand_as diff sort argsort outer addmm baddbmm index_add index_copy "
             "repeat_interleave").split()
_LINALG_OPS = ("mm bmm mv dot vdot inner kron cross diag diagonal diag_embed diagflat trace addmv addr addbmm "
               "chain_matmul det logdet slogdet cumprod logcumsumexp").split()
_STATS_OPS = ("nansum nanmean count_nonzero aminmax var_mean std_mean quantile nanquantile kthvalue mode cov corrcoef "
              "dist histc").split()
_RESHAPE_OPS = ("unbind tensor_split hsplit vsplit dsplit split_with_sizes squeeze unsqueeze swapaxes swapdims moveaxis "
                "rot90 fliplr flipud ravel broadcast_to broadcast_tensors atleast_1d atleast_2d atleast_3d clone "
                "take_along_dim take numel is_floating_point").split()
_SCATTER_OPS = ("scatter_add scatter_reduce index_fill index_put select_scatter slice_scatter diagonal_scatter "
                "masked_scatter masked_select nonzero argwhere").split()
_BINARY_OPS = ("add sub subtract mul multiply div divide true_divide floor_divide atan2 arctan2 hypot xlogy lerp "
               "addcmul addcdiv copysign fmax fmin float_power heaviside logaddexp2 isclose allclose equal eq ne "
               "not_equal lt less le less_equal gt greater ge greater_equal bitwise_and bitwise_or bitwise_xor "
               "bitwise_not bitwise_left_shift bitwise_right_shift gcd lcm").split()
_ELEMENTWISE_OPS = ("tan sinh cosh asin acos atan asinh acosh atanh arcsin arccos arctan arcsinh arccosh arctanh "
                    "log1p expm1 log2 log10 exp2 erfc erfinv sinc logit deg2rad rad2deg sgn signbit positive negative "
                    "absolute fix isneginf isposinf isreal clamp_min clamp_max").split()
_SAMPLE_OPS = "randint randint_like randperm normal bernoulli multinomial".split()
_COMPLEX_SAMPLE_OPS = "rand randn rand_like randn_like".split()  # real or complex dtypes
_FACTORIES_OPS = ("eye linspace logspace range empty empty_like scalar_tensor tensor as_tensor asarray tril_indices "
                  "triu_indices meshgrid cartesian_prod combinations block_diag vander unravel_index tensordot "
                  "column_stack hstack vstack row_stack dstack concatenate result_type promote_types can_cast "
                  "broadcast_shapes from_numpy").split()
_SPECTRAL_OPS = "hann_window hamming_window blackman_window bartlett_window kaiser_window stft istft".split()
# torch's remaining top-level aliases, in-place forms and *_copy functions (graphc.dsl.ops_aliases)
_ALIASES_OPS = (
    "adaptive_avg_pool1d avg_pool1d bilinear celu channel_shuffle conv1d conv3d conv_transpose1d conv_transpose2d "
    "conv_transpose3d cosine_similarity hardshrink max_pool1d max_pool1d_with_indices max_pool3d pairwise_distance "
    "pixel_shuffle pixel_unshuffle prelu rms_norm selu threshold group_norm instance_norm kl_div "
    "binary_cross_entropy_with_logits cosine_embedding_loss hinge_embedding_loss margin_ranking_loss "
    "triplet_margin_loss poisson_nll_loss ctc_loss adaptive_max_pool1d constant_pad_nd grid_sampler grid_sampler_2d "
    "grid_sampler_3d "
    "affine_grid_generator rsub rrelu alpha_dropout feature_alpha_dropout feature_dropout native_channel_shuffle "
    "abs_ acos_ acosh_ addmv_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ asin_ asinh_ atan_ atanh_ ceil_ "
    "clamp_ clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ detach_ erf_ erfc_ exp2_ exp_ expm1_ fill_ fix_ floor_ "
    "frac_ gcd_ i0_ index_put_ lcm_ ldexp_ log10_ log1p_ log2_ log_ logit_ nan_to_num_ neg_ negative_ rad2deg_ reciprocal_ "
    "round_ rsqrt_ sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_ zero_ conj_physical_ relu_ "
    "selu_ celu_ threshold_ rrelu_ dropout_ alpha_dropout_ feature_alpha_dropout_ feature_dropout_ fill conj "
    "resolve_conj resolve_neg real conj_physical imag is_conj is_neg is_complex is_same_size is_signed adjoint "
    "msort narrow_copy ger alias_copy detach_copy diagonal_copy expand_copy permute_copy select_copy slice_copy "
    "split_copy split_with_sizes_copy squeeze_copy t_copy transpose_copy unbind_copy unsqueeze_copy view_copy "
    "unfold_copy"
).split()
_SEARCH_OPS = ("searchsorted bucketize isin histogram cdist pdist trapezoid trapz cumulative_trapezoid gradient put "
               "index_reduce renorm").split()
_SPECIAL_OPS = "lgamma digamma polygamma mvlgamma multigammaln i0 igamma igammac frexp ldexp".split()
_SOLVE_OPS = ("inverse lu_unpack triangular_solve cholesky cholesky_solve cholesky_inverse matrix_power "
              "matrix_exp").split()
_REJECTION_OPS = "_standard_gamma poisson".split()
_COUNTS_OPS = "bincount unique unique_consecutive histogramdd".split()
_GAMMA_GRAD_OPS = "_standard_gamma_grad _dirichlet_grad".split()
_VMAP_OPS = "vmap".split()
_HOUSEHOLDER_OPS = "geqrf orgqr ormqr".split()
_FAKE_QUANTIZE_OPS = "fake_quantize_per_tensor_affine fake_quantize_per_channel_affine".split()
_FAKE_QUANTIZE_LEARNABLE_OPS = ("fake_quantize_learnable_per_tensor_affine "
                                "fake_quantize_learnable_per_channel_affine").split()
# torch's names still missing (the torch coverage sweep), by graphc.dsl module
_TORCH_COVERAGE_OPS = {
    "linalg_legacy": ("svd qr lu pinverse matrix_rank nuclear_norm frobenius_norm norm_except_dim lu_solve "
                      "svd_lowrank pca_lowrank"),
    "ops_strided": "as_strided as_strided_copy as_strided_scatter empty_strided empty_permuted",
    "ops_torch_misc": "nonzero_static unsafe_chunk unsafe_split unsafe_split_with_sizes angle binomial",
    "ops_segment": "segment_reduce",
    "ops_cells": "rnn_tanh_cell rnn_relu_cell lstm_cell gru_cell convolution conv_tbc",
    "grad_mode": "set_grad_enabled enable_grad is_grad_enabled inference_mode is_inference_mode_enabled",
    "ops_fractional": ("fractional_max_pool2d fractional_max_pool3d fractional_max_pool2d_with_indices "
                       "fractional_max_pool3d_with_indices"),
}
# torch's functional multi-layer recurrent ops, native_* tuples and the reach sweep's aliases, by module
_REACH_OPS = {
    "graphc.nn.rnn_functional": "lstm gru rnn_tanh rnn_relu",
    "graphc.dsl.ops_native": "native_layer_norm native_batch_norm native_group_norm native_dropout",
    "graphc.dsl.methods_values": "is_nonzero",
}
_RENAMED_OPS = {  # gc name -> (module, function) where torch's top-level name differs from F's
    "embedding_bag": ("graphc.dsl.ops_embedding", "embedding_bag_with_bags"),
}
_SETTINGS_OPS = ("get_default_dtype set_default_dtype use_deterministic_algorithms "
                 "are_deterministic_algorithms_enabled is_deterministic_algorithms_warn_only_enabled").split()
_REFUSED_OPS = "save get_num_threads set_num_threads".split()
# complex Tensors (graphc.dsl.complex_ops): the constructors, and the names that take real or complex Tensors
_COMPLEX_OPS = "complex polar view_as_real view_as_complex view_as_real_copy view_as_complex_copy".split()
_EITHER_OPS = ("zeros ones zeros_like exp abs sum mean matmul einsum real imag conj angle is_complex add sub mul "
               "div").split()
_COMPLEX_MATH_OPS = ("sqrt rsqrt reciprocal square log log2 log10 log1p expm1 exp2 sinc sigmoid sin cos tan sinh "
                     "cosh tanh asin acos atan asinh acosh atanh arcsin arccos arctan arcsinh arccosh arctanh sgn "
                     "neg negative conj_physical isfinite isnan isinf isclose allclose").split()

# public name -> (module, attribute); attribute None means the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    **{op: ("graphc.dsl.ops", op) for op in _OPS},
    **{op: ("graphc.dsl.ops_array", op) for op in _ARRAY_OPS},
    "interpolate": ("graphc.dsl.ops_layers", "interpolate"),
    "scaled_dot_product_attention": ("graphc.dsl.ops_attention", "scaled_dot_product_attention"),
    **{op: ("graphc.dsl.ops_fold", op) for op in ("unfold", "fold")},
    **{op: ("graphc.dsl.ops", op) for op in ("erf", "flatten")},
    "no_grad": ("graphc.dsl.builder", "no_grad"),
    **{op: ("graphc.dsl.autocast", op) for op in ("autocast", "is_autocast_enabled")},
    **{op: ("graphc.dsl.ops_divide", op) for op in ("remainder", "fmod")},
    **{op: ("graphc.dsl.ops_math", op) for op in _MATH_OPS},
    **{op: ("graphc.dsl.ops_views", op) for op in _VIEW_OPS},
    **{op: ("graphc.dsl.ops_nn", op) for op in _NN_OPS},
    **{op: ("graphc.dsl.ops_order", op) for op in ("median", "nanmedian", "cummax", "cummin")},
    **{op: ("graphc.dsl.ops_linalg", op) for op in _LINALG_OPS},
    **{op: ("graphc.dsl.ops_stats", op) for op in _STATS_OPS},
    **{op: ("graphc.dsl.ops_reshape", op) for op in _RESHAPE_OPS},
    **{op: ("graphc.dsl.ops_scatter", op) for op in _SCATTER_OPS},
    **{op: ("graphc.dsl.ops_binary", op) for op in _BINARY_OPS},
    **{op: ("graphc.dsl.ops_elementwise", op) for op in _ELEMENTWISE_OPS},
    **{op: ("graphc.dsl.ops_sample", op) for op in _SAMPLE_OPS},
    **{op: ("graphc.dsl.ops_factories", op) for op in _FACTORIES_OPS},
    **{op: ("graphc.dsl.ops_spectral", op) for op in _SPECTRAL_OPS},
    "device": ("graphc.dsl.devices", "device"),
    **{op: ("graphc.dsl.ops_aliases", op) for op in _ALIASES_OPS},
    **{op: ("graphc.dsl.ops_search", op) for op in _SEARCH_OPS},
    **{op: ("graphc.dsl.ops_special", op) for op in _SPECIAL_OPS},
    "special": ("graphc.dsl.special", None),
    **{op: ("graphc.dsl.ops_solve", op) for op in _SOLVE_OPS},
    **{op: ("graphc.dsl.ops_rejection", op) for op in _REJECTION_OPS},
    **{op: ("graphc.dsl.ops_counts", op) for op in _COUNTS_OPS},
    **{op: ("graphc.dsl.vmap", op) for op in _VMAP_OPS},
    **{op: ("graphc.dsl.linalg_householder", op) for op in _HOUSEHOLDER_OPS},
    **{op: ("graphc.dsl.ops_fake_quantize", op) for op in _FAKE_QUANTIZE_OPS},
    **{op: ("graphc.dsl.ops_fake_quantize_learnable", op) for op in _FAKE_QUANTIZE_LEARNABLE_OPS},
    "func": ("graphc.nn.func", None),
    "autograd": ("graphc.dsl.autograd", None),
    **{op: (f"graphc.dsl.{module}", op) for module, ops in _TORCH_COVERAGE_OPS.items() for op in ops.split()},
    "nextafter": ("graphc.dsl.ops_nextafter", "nextafter"),
    **{op: (module, op) for module, ops in _REACH_OPS.items() for op in ops.split()},
    **_RENAMED_OPS,
    # torch's names that model files and training scripts use beside the ops (the torch names sweep)
    **{op: ("graphc.model.dtype_limits", op) for op in ("finfo", "iinfo")},
    **{op: ("graphc.dsl.seeding", op) for op in ("manual_seed", "initial_seed")},
    **{op: ("graphc.dsl.torch_settings", op) for op in _SETTINGS_OPS},
    **{op: ("graphc.dsl.refusals", op) for op in _REFUSED_OPS},
    **{op: ("graphc.dsl.complex_ops", op) for op in _COMPLEX_OPS},
    **{op: ("graphc.dsl.complex_ops", f"{op}_any") for op in _EITHER_OPS},
    "pow": ("graphc.dsl.complex_pow", "pow_any"),
    **{op: ("graphc.dsl.complex_math", f"{op}_any") for op in _COMPLEX_MATH_OPS},
    **{op: ("graphc.dsl.complex_random", f"{op}_any") for op in _COMPLEX_SAMPLE_OPS},
    "fft": ("graphc.dsl.fft", None),
    "compile": ("graphc.compile", None),  # the sub-package, callable as torch.compile
    "is_tensor": ("graphc.nn.parameter", "is_tensor"),
    "Size": ("graphc.dsl.tensor", "Size"),
    **{op: ("graphc.dsl.ops_gamma_grad", op) for op in _GAMMA_GRAD_OPS},
    "linalg": ("graphc.dsl.linalg", None),
    "distributions": ("graphc.dsl.distributions", None),
    "Tensor": ("graphc.dsl.tensor", "Tensor"),
    "capture": ("graphc.dsl.capture", "capture"),
    "cond": ("graphc.dsl.control", "cond"),
    "fori_loop": ("graphc.dsl.control", "fori_loop"),
    "scan": ("graphc.dsl.control", "scan"),
    "while_loop": ("graphc.dsl.control_while", "while_loop"),
    "nn": ("graphc.nn", None),
    "losses": ("graphc.compile.losses", None),
    "optim": ("graphc.compile.optim", None),
    "amp": ("graphc.compile.amp", None),
    "training": ("graphc.compile.training", None),
    "data": ("graphc.runtime.data", None),
    "metrics": ("graphc.runtime.metrics", None),
    "checkpoint": ("graphc.runtime.checkpoint", None),
    "utils": ("graphc.utils", None),  # torch.utils' names: gc.utils.checkpoint
    "distributed": ("graphc.runtime.distributed", None),
    "parity": ("graphc.runtime.parity", None),
    "deploy": ("graphc.serving.deploy", None),
    "optimize": ("graphc.compile.optimize", "optimize"),
    "convert_float": ("graphc.compile.precision", "convert_float"),
    "grad": ("graphc.compile.grad", "grad"),
    "Session": ("graphc.runtime.session", "Session"),
    "BackendInfo": ("graphc.backends.base", "BackendInfo"),
    "Trainer": ("graphc.runtime.trainer", "Trainer"),
    "History": ("graphc.runtime.trainer", "History"),
    "TrainingArtifacts": ("graphc.compile.training", "TrainingArtifacts"),
    "ParityReport": ("graphc.runtime.parity", "ParityReport"),
    "serve": ("graphc.serving.serve", "serve"),
}


# Module paths from before graphc/ was grouped into folders. The public contract names these
# modules, so they keep importing (`import graphc.training`, `from graphc.trainer import Trainer`),
# each as the very module at its new path: the API's gc.* submodules, and the paths docs/api.md
# cited (graphc.trainer.TrainingFailed, graphc.history.EpochRecord, ...).
_MOVED = {
    "graphc.training": "graphc.compile.training",  # API: gc.training
    "graphc.losses": "graphc.compile.losses",  # API: gc.losses
    "graphc.optim": "graphc.compile.optim",  # API: gc.optim
    "graphc.amp": "graphc.compile.amp",  # gc.amp
    "graphc.export": "graphc.compile.export",  # docs/api.md: graphc.export.ExportError
    "graphc.data": "graphc.runtime.data",  # API: gc.data
    "graphc.parity": "graphc.runtime.parity",  # API: gc.parity
    "graphc.distributed": "graphc.runtime.distributed",  # API: gc.distributed
    "graphc.metrics": "graphc.runtime.metrics",  # docs/api.md: gc.metrics
    "graphc.checkpoint": "graphc.runtime.checkpoint",  # docs/api.md: graphc.checkpoint.CheckpointError
    "graphc.trainer": "graphc.runtime.trainer",  # docs/api.md: graphc.trainer.TrainingFailed
    "graphc.history": "graphc.runtime.history",  # docs/api.md: graphc.history.EpochRecord, EpochLog
    "graphc.progress": "graphc.runtime.progress",  # docs/api.md: graphc.progress.TrainProgress
    "graphc.deploy": "graphc.serving.deploy",  # API: gc.deploy
    "graphc.kserve": "graphc.serving.kserve",  # docs/api.md: graphc.kserve.model_config
}


class _MovedModules:
    """Import hook: an old path, or a module under it, imports as the module at the new path
    (one module object, so classes, exceptions and monkeypatches are shared)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("graphc.") and _moved(fullname):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(_moved(spec.name))
        spec.loader_state = module.__spec__  # the import system sets __spec__ to this alias's spec
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


def _moved(fullname: str) -> str | None:
    for old, new in _MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str):
    if name == "backends":
        # `gc.backends()` lists backends; the sub-package `graphc.backends` is callable for it.
        return importlib.import_module("graphc.backends")
    if name in _TORCH_NAMES:
        return _TORCH_NAMES[name]
    if name not in _LAZY:
        raise AttributeError(f"module 'graphc' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    if module_name.startswith("graphc.dsl"):  # gc.Tensor's operators and methods, for ops outside a capture too
        for bound in ("graphc.dsl.methods", "graphc.dsl.methods_torch"):
            importlib.import_module(bound)
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    if module_name.startswith("graphc.dsl") and inspect.isfunction(value):  # torch's keywords: gc.maximum(input=)
        keywords = importlib.import_module("graphc.dsl.torch_keywords")
        value = keywords.torch_names(value, keywords.RENAMES.get(name))
    globals()[name] = value
    return value


__all__ = [
    "AutodiffError", "BackendError", "BackendUnavailable", "CaptureError", "DataParallelWarning", "GraphError",
    "GraphcError", "InputError",
    "MissingDependency", "MissingGradientRule", "MissingKernel", "Model", "ModelLoadError", "PassError", "PerformanceWarning",
    "PipelineError", "TensorSpec", "backends", "bfloat16", "bool_", "complex64", "complex128", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "load", "spec", "uint8", "uint16", "uint32", "uint64",
    *_LAZY,
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_TORCH_NAMES))
