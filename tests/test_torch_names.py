"""torch's top-level names that model files and training scripts use beside the ops (``finfo``, ``manual_seed``,
``from_numpy``, ``Size``, ``compile``, ...), against torch 2.13: values and behaviour, the refusals' messages, and a
sweep that fails on a callable of ``torch`` that graphc neither provides nor lists here with the reason."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import graphc as gc
from graphc.model.dtypes import as_dtype
from tests.dsl_util import check
from tests.torch_grad_util import run_both

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _process_switches():
    """The seed and the deterministic flag are process-wide: each test leaves them as they were."""
    yield
    gc.manual_seed(0)
    gc.use_deterministic_algorithms(False)


# -- finfo / iinfo --------------------------------------------------------------------------------

FLOATS = [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
          ("float64", torch.float64)]


@pytest.mark.parametrize("name,torch_dtype", FLOATS)
def test_finfo_equals_torchs_for_graphc_and_torch_dtypes(name, torch_dtype):
    want = torch.finfo(torch_dtype)
    for given in (getattr(gc, name), name, torch_dtype):
        got = gc.finfo(given)
        for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
            assert getattr(got, attr) == getattr(want, attr), (given, attr)
        assert got.dtype == want.dtype
    assert gc.finfo(gc.float) == gc.finfo() == gc.finfo("float32")
    assert gc.finfo(gc.double).max == torch.finfo(torch.double).max and gc.finfo(gc.half).min == -65504.0


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "int32", "int64", "uint16", "uint32", "uint64"])
def test_iinfo_equals_torchs(name):
    """Each integer dtype graphc holds has torch's limits (uint16/32/64 were refused)."""
    want = torch.iinfo(getattr(torch, name))
    for given in (gc.from_numpy(np.zeros(1, name)).dtype, getattr(gc, name), name, getattr(torch, name)):
        got = gc.iinfo(given)
        assert (got.bits, got.max, got.min, got.dtype) == (want.bits, want.max, want.min, want.dtype)
    assert gc.iinfo(gc.long).max == 2**63 - 1


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_wide_unsigned_dtype_names_cast_and_fill_as_torchs_on_both_backends(name):
    """gc.uint16/uint32/uint64 as torch's (were missing: only gc.from_numpy made these dtypes): .to() and the
    factories give torch's dtype and values on numpy and ort-cpu, 65000 included (past int16)."""
    dtype = getattr(gc, name)
    assert dtype == name and as_dtype(getattr(torch, name)) == dtype and repr(dtype) == f"gc.{name}"
    x = np.array([[1.5, 2.7, 65000.0], [3.0, 4.0, 0.0]])
    model = gc.capture(lambda x: (x.to(dtype), gc.zeros(2, 3, dtype=dtype), gc.full((2,), 7, dtype=dtype)),
                       x=gc.spec("float64", ("N", 3)))
    check(model)
    t, want_dtype = torch.from_numpy(x), getattr(torch, name)
    want = [t.to(want_dtype), torch.zeros(2, 3, dtype=want_dtype), torch.full((2,), 7, dtype=want_dtype)]
    for backend in ("numpy", "ort-cpu"):
        got = list(gc.Session(model, backend=backend).run({"x": x}).values())
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.dtype(name) and g.tolist() == w.tolist(), (backend, g, w)


# torch's dtype names (torch 2.13) that are not gc names, by pattern, and why
ABSENT_DTYPES = {
    r"complex32|chalf": "complex32: graphc's complex Tensors have float32 or float64 parts (gc.complex64/128)",
    r"q(u)?int\w+": "quantized dtypes: graphc quantizes in float (fake quantization, QAT) and as int8 QDQ",
    r"u?int[1-7]|bits\w*|bit": "sub-byte and bit-pattern dtypes: graphc's smallest integers are int8/uint8",
    r"float8_\w+|float4_\w+": "8- and 4-bit floats: gc.optimize quantizes to int8 QDQ; ONNX's float8 types load",
}


def test_every_torch_dtype_name_is_a_gc_dtype_or_listed_absent_with_the_reason():
    """torch.uint16 / uint32 / uint64 had no gc names (gc.uint8, gc.int16 and torch's aliases did)."""
    names = {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
    provided = {n for n in names if hasattr(gc, n)}
    assert {"uint16", "uint32", "uint64", "int16", "short", "long", "half"} <= provided
    assert all(as_dtype(getattr(torch, n)) == getattr(gc, n) for n in provided)
    unlisted = sorted(n for n in names - provided if not any(re.fullmatch(p, n) for p in ABSENT_DTYPES))
    assert unlisted == []
    assert [p for p in ABSENT_DTYPES if not any(re.fullmatch(p, n) for n in names - provided)] == []


def test_finfo_and_iinfo_refuse_the_other_kind_naming_it():
    with pytest.raises(TypeError, match=r"gc.finfo: dtype must be a floating point dtype .*got int32 \(gc.iinfo"):
        gc.finfo(gc.int32)
    with pytest.raises(TypeError, match=r"gc.iinfo: dtype must be an integer dtype .*got float32 \(gc.finfo"):
        gc.iinfo(torch.float32)
    with pytest.raises(TypeError, match="gc.iinfo: dtype must be an integer dtype .*got bool$"):
        gc.iinfo(gc.bool)
    with pytest.raises(AttributeError, match="read-only"):
        gc.finfo().eps = 1.0


class _MaskedScores(gc.nn.Module):
    """HF's extended attention mask: ``(1 - mask) * torch.finfo(dtype).min`` added to the scores."""

    def forward(self, scores, mask):
        return (scores + (1.0 - mask) * gc.finfo(scores.dtype).min).softmax(-1)


def test_hf_attention_mask_with_finfo_min_matches_torch_on_both_backends():
    scores = RNG.standard_normal((2, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    model = gc.capture(_MaskedScores(), scores=gc.spec("float32", ("B", 5)), mask=gc.spec("float32", ("B", 5)))
    check(model)
    got = run_both(model, {"scores": scores, "mask": mask})["output"]
    ts, tm = torch.from_numpy(scores), torch.from_numpy(mask)
    want = (ts + (1.0 - tm) * torch.finfo(ts.dtype).min).softmax(-1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert (got[0, 3:] == 0).all()


# -- manual_seed / initial_seed -------------------------------------------------------------------

class _Noisy(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 2)
        self.register_buffer("noise", gc.randn(2))  # drawn in __init__, outside a capture

    def forward(self, x):
        return self.fc(x) + self.noise


def _weights(seed=None):
    net = _Noisy()
    model = gc.capture(net, x=gc.spec("float32", ("N", 3))) if seed is None else \
        gc.capture(net, seed=seed, x=gc.spec("float32", ("N", 3)))
    return {k: np.asarray(v) for k, v in net.state_dict().items()}, model


def test_manual_seed_replays_the_draws_outside_a_capture_and_seeds_capture_and_init():
    assert gc.initial_seed() == 0  # torch's is random until set; graphc's draws are seeded 0 until set
    first, _ = _weights()
    gc.manual_seed(0)
    again, _ = _weights()
    gc.manual_seed(7)
    seven, _ = _weights()
    assert gc.initial_seed() == 7
    gc.manual_seed(7)
    seven_again, _ = _weights()
    explicit, _ = _weights(seed=7)  # capture's seed= draws the weights; the buffer was drawn at __init__
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
        np.testing.assert_array_equal(seven[key], seven_again[key])
        assert not np.array_equal(first[key], seven[key]), key
    np.testing.assert_array_equal(explicit["fc.weight"], seven["fc.weight"])
    gc.manual_seed(7)
    net = _Noisy().init_parameters()
    np.testing.assert_array_equal(net.fc.weight.numpy(), seven["fc.weight"])
    # the same sequence of draws on the same seed, as torch's: two draws differ, a reseed replays both
    gc.manual_seed(3)
    a, b = np.asarray(gc.randn(4)), np.asarray(gc.randn(4))
    gc.manual_seed(3)
    np.testing.assert_array_equal(np.asarray(gc.randn(4)), a)
    np.testing.assert_array_equal(np.asarray(gc.randn(4)), b)
    assert not np.array_equal(a, b)


def test_manual_seed_seeds_a_thread_that_starts_drawing_later():
    gc.manual_seed(11)
    here = np.asarray(gc.rand(5))
    drawn = []
    worker = threading.Thread(target=lambda: drawn.append(np.asarray(gc.rand(5))))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(drawn[0], here)


def test_manual_seed_refusals():
    with pytest.raises(gc.CaptureError, match=r"gc.manual_seed inside a capture.*gc.capture\(\.\.\., seed=\)"):
        gc.capture(lambda x: (gc.manual_seed(1), x)[1], x=np.zeros(1))
    with pytest.raises(TypeError, match="seed must be an int, got float 1.5"):
        gc.manual_seed(1.5)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        gc.manual_seed(-1)
    assert gc.initial_seed() == 0


# -- from_numpy, is_tensor, Size ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.int64, np.uint8, np.bool_])
def test_from_numpy_keeps_the_dtype_and_values_as_torch_in_and_out_of_a_capture(dtype):
    a = (RNG.standard_normal((2, 3)) * 4).astype(dtype)
    want = torch.from_numpy(a)
    got = gc.from_numpy(a)
    assert got.dtype == str(want.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    model = gc.capture(lambda x: x + gc.from_numpy(a).to(x.dtype), x=np.zeros((2, 3), np.float64))
    check(model)
    np.testing.assert_array_equal(run_both(model, {"x": np.zeros((2, 3))})["output"], a.astype(np.float64))


def test_from_numpy_refuses_other_data_as_torch():
    with pytest.raises(TypeError, match=r"expected np.ndarray \(got list\)"):
        torch.from_numpy([1.0])
    with pytest.raises(TypeError, match=r"gc.from_numpy: expected np.ndarray \(got list\)"):
        gc.from_numpy([1.0])


def test_is_tensor_answers_as_torch():
    layer, torch_layer = gc.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    cases = [(gc.ones(2), torch.ones(2)), (layer.weight, torch_layer.weight), (np.ones(2), np.ones(2)),
             ([1.0], [1.0]), (2.0, 2.0)]
    assert [gc.is_tensor(g) for g, _ in cases] == [torch.is_tensor(t) for _, t in cases] == [True, True, False,
                                                                                             False, False]


def test_shape_and_size_are_gc_size_with_torchs_numel():
    seen = {}

    def fn(x):
        seen.update(shape=x.shape, size=x.size(), head=x.shape[:-1], numel=x.shape.numel())
        return x

    gc.capture(fn, x=np.zeros((2, 3, 4), np.float32))
    t = torch.zeros(2, 3, 4)
    assert isinstance(seen["shape"], gc.Size) and isinstance(seen["size"], gc.Size)
    assert isinstance(seen["head"], gc.Size) and seen["head"] == tuple(t.shape[:-1])
    assert seen["shape"] == t.shape and seen["numel"] == t.shape.numel() == 24
    assert gc.Size([2, 3]) == torch.Size([2, 3]) and gc.Size([2, 3]).numel() == 6
    assert isinstance(gc.nn.Linear(3, 2).weight.shape, gc.Size) and gc.nn.Linear(3, 2).weight.size() == (2, 3)
    assert gc.zeros(gc.Size([2, 3])).shape == (2, 3)


def test_size_arithmetic_keeps_size_as_torchs():
    """A Size joined with a tuple on either side, with a Size, or repeated is a Size as torch's (was a tuple:
    ``(x.shape[:1] + (4,)).numel()`` an AttributeError); a list is refused alike."""
    s, t = gc.Size([2, 3]), torch.Size([2, 3])
    for op in (lambda a: a + (4,), lambda a: (4,) + a, lambda a: a + a, lambda a: a * 2, lambda a: 2 * a,
               lambda a: a[:1] + (5, 6)):
        assert type(op(t)) is torch.Size and type(op(s)) is gc.Size and op(s) == op(t)
    assert (s + (4,)).numel() == (t + (4,)).numel() == 24
    with pytest.raises(TypeError, match="concatenate"):
        s + [4]


def test_symbolic_shape_is_a_size_of_dim_names():
    def fn(x):
        assert isinstance(x.shape, gc.Size) and x.shape == ("N", 3)
        return x.reshape(x.shape[0] * 3)

    model = gc.capture(fn, x=gc.spec("float32", ("N", 3)))
    assert run_both(model, {"x": np.ones((4, 3), np.float32)})["output"].shape == (12,)


# -- the process-wide switches --------------------------------------------------------------------

def test_default_dtype_is_float32_as_torchs_and_cannot_be_changed():
    assert gc.get_default_dtype() == str(torch.get_default_dtype()).removeprefix("torch.") == "float32"
    gc.set_default_dtype(gc.float32)
    gc.set_default_dtype(torch.float32)
    with pytest.raises(TypeError, match=r"gc.set_default_dtype\(float64\): .*cannot be changed.*dtype=gc.float64"):
        gc.set_default_dtype(torch.float64)
    assert gc.get_default_dtype() == "float32"


def test_compile_returns_the_model_and_the_decorated_function():
    net = gc.nn.Linear(3, 2)
    assert gc.compile(net) is net and gc.compile(net, mode="reduce-overhead", fullgraph=True) is net

    @gc.compile(dynamic=True)
    def double(x):
        return x * 2

    assert double.__name__ == "double"
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_both(gc.capture(gc.compile(net), x=x), {"x": x})["output"],
                               run_both(gc.capture(net, x=x), {"x": x})["output"])
    with pytest.raises(TypeError, match="gc.compile: model must be a Module or function, got int"):
        gc.compile(3)
    import graphc.compile.optimize  # noqa: F401  the sub-package keeps its modules
    assert gc.compile.optimize.optimize is gc.optimize


def test_deterministic_algorithms_flag_round_trips_as_torchs():
    for mode in (True, False):
        torch.use_deterministic_algorithms(mode)
        gc.use_deterministic_algorithms(mode)
        assert gc.are_deterministic_algorithms_enabled() is torch.are_deterministic_algorithms_enabled() is mode
    for warn_only in (True, False):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        gc.use_deterministic_algorithms(True, warn_only=warn_only)
        assert gc.is_deterministic_algorithms_warn_only_enabled() is \
            torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    torch.use_deterministic_algorithms(False)
    with pytest.raises(TypeError, match="mode must be a bool, got int 1"):
        gc.use_deterministic_algorithms(1)


def test_inference_mode_state_follows_torchs():
    def states(M):
        seen = [M.is_inference_mode_enabled()]
        with M.inference_mode():
            seen += [M.is_inference_mode_enabled(), M.is_grad_enabled()]
            with M.inference_mode(False):
                seen += [M.is_inference_mode_enabled(), M.is_grad_enabled()]
            seen.append(M.is_inference_mode_enabled())
        with M.no_grad(), M.inference_mode(False):
            seen.append(M.is_grad_enabled())
        return seen + [M.is_inference_mode_enabled(), M.is_grad_enabled()]

    assert states(gc) == states(torch) == [False, True, False, False, True, True, True, False, True]


# -- names refused with the way out ---------------------------------------------------------------

def test_save_and_thread_counts_refuse_naming_the_way_out(tmp_path):
    with pytest.raises(NotImplementedError, match=r"gc.save: graphc never pickles.*safetensors.numpy.save_file"):
        gc.save(gc.nn.Linear(2, 2).state_dict(), tmp_path / "w.pt")
    assert not list(tmp_path.iterdir())
    for name in ("get_num_threads", "set_num_threads"):
        with pytest.raises(NotImplementedError, match=rf"gc.{name}: .*gc.Session\(model, backend='ort-cpu', "
                                                      r"threads=N\)"):
            getattr(gc, name)(2)


# -- the sweep ------------------------------------------------------------------------------------

_STORAGE = "torch's storages and legacy typed tensor classes: graphc's values are arrays (gc.tensor(data, dtype=))"
_JIT = "TorchScript's IR, types and runtime: graphc captures to ONNX (gc.capture) and runs it on a backend"
_VENDOR = "a vendor kernel torch dispatches to; graphc's backends choose their kernels"
_QUANTIZED = ("quantized tensors: graphc quantizes in float (gc.fake_quantize_*, QAT) and as int8 QDQ at "
              "gc.optimize level 3")
_SPARSE = "sparse tensors: graphc's are dense (gc.nn.Embedding(sparse=True) trains dense)"
_AUTOCAST = "torch's autocast state per device type: gc.autocast(...) blocks and gc.is_autocast_enabled()"
_SYNC_BN = "SyncBatchNorm's kernels: gc.nn.SyncBatchNorm"
_NATIVE = "torch's internal forms of the layers: gc.batch_norm, gc.layer_norm, gc.group_norm, gc.dropout, gc.norm"
_RNG_STATE = "graphc's draws are seeded, not a stream's state to save and restore: gc.manual_seed(s) replays them"
_THREADS = "graphc has no process-wide thread count: gc.Session(model, threads=N)"
_DEVICE = "graphc's values have no device: the backend places the graph (gc.Session(model, backend='ort-cuda'))"
_INTERNAL = "torch's own machinery, not called by model code"
_REMOVED = "removed from torch (torch.linalg's replace it): gc.linalg.solve / lstsq / eigh"
_INPLACE = "an in-place form graphc lacks: assign the result (x = gc.as_strided(x, ...))"
_ANOMALY = "autograd anomaly detection: graphc's gradients are ONNX graphs, not an eager tape"

# torch callables (torch 2.13) that are not gc names, by pattern, and why
ABSENT_PATTERNS = {
    r"\w*Storage(Base)?|is_storage|(BFloat16|Bool|Byte|Char|Double|Float|Half|Int|Long|Short)Tensor": _STORAGE,
    r"(cudnn|miopen|mkldnn|fbgemm)_\w+": _VENDOR,
    r"quantized?_\w+|q_\w+|qscheme|dequantize|int_repr|empty_quantized|choose_qparams_optimized|"
    r"fused_moving_avg_obs_fake_quant": _QUANTIZED,
    r"sparse_\w+_tensor|\w*s\w*mm|hspmm|(c?col|crow|row)?_?indices_copy|values_copy|resize_as_sparse_": _SPARSE,
    r"(get|set|is)_autocast_\w+|autocast_(in|de)crement_nesting|clear_autocast_cache": _AUTOCAST,
    r"batch_norm_(backward|elemt|gather|stats|update)\w*": _SYNC_BN,
    r"native_\w+": _NATIVE,
    r"sym_\w+|Sym(Bool|Float|Int)": "torch.export's symbolic numbers: graphc's symbolic dims are DimNames in .shape",
}
ABSENT = {
    **dict.fromkeys(
        "AliasDb AnyType Argument ArgumentSpec AwaitType Block BoolType CallStack Capsule ClassType Code "
        "CompilationUnit CompleteArgumentSpec ComplexType ConcreteModuleType ConcreteModuleTypeBuilder "
        "DeepCopyMemoTable DeviceObjType DictType EnumType ErrorReport ExecutionPlan FileCheck FloatType "
        "FunctionSchema Future FutureType "
        "Gradient Graph GraphExecutorState IODescriptor InferredType IntType InterfaceType JITException ListType "
        "LiteScriptModule Node NoneType NumberType OperatorInfo OptionalType PyObjectType RRefType ScriptClass "
        "ScriptClassFunction ScriptDict ScriptDictIterator ScriptDictKeyIterator ScriptFunction ScriptList "
        "ScriptListIterator ScriptMethod ScriptModule ScriptModuleSerializer ScriptObject ScriptObjectProperty "
        "StaticModule StreamObjType StringType SymBoolType SymIntType TensorType TracingState TupleType Type UnionType "
        "Use Value import_ir_module import_ir_module_from_buffer parse_ir parse_schema parse_type_comment "
        "merge_type_from_type_comment unify_type_list fork wait".split(), _JIT),
    **dict.fromkeys(
        "AggregationType BenchmarkConfig BenchmarkExecutionStats DispatchKey DispatchKeySet DisableTorchFunction "
        "DisableTorchFunctionSubclass ExcludeDispatchKeyGuard LockingLogger LoggerBase NoopLogger PyTorchFileReader "
        "PyTorchFileWriter SerializationStorageContext DeserializationStorageContext Tag ThroughputBenchmark "
        "classproperty compiled_with_cxx11_abi get_file_path is_vulkan_available prepare_multiprocessing_environment "
        "profiler_allow_cudagraph_cupti_lazy_reinit_cuda12 thread_safe_generator typename slice_inverse hash_tensor "
        "is_distributed AcceleratorError OutOfMemoryError FatalError".split(), _INTERNAL),
    **dict.fromkeys("get_rng_state set_rng_state seed Generator".split(), _RNG_STATE),
    **dict.fromkeys("get_num_interop_threads set_num_interop_threads init_num_threads".split(), _THREADS),
    **dict.fromkeys("get_device get_default_device set_default_device get_device_module Stream Event".split(),
                    _DEVICE),
    **dict.fromkeys("eig symeig lstsq solve".split(), _REMOVED),
    **dict.fromkeys("as_strided_ resize_as_".split(), _INPLACE),
    **dict.fromkeys("is_anomaly_enabled is_anomaly_check_nan_enabled set_anomaly_enabled".split(), _ANOMALY),
    "dtype": "torch's dtype class: graphc's dtypes are names (gc.float32 == 'float32', graphc.model.dtypes.DType)",
    "layout": "strided/sparse layouts: graphc's values are dense",
    "memory_format": "memory layouts (channels_last): an ONNX graph has none; the backend picks its own",
    "GradScaler": "gc.amp.GradScaler; graphc's loss scaling is a training-graph option",
    "ModuleDict": "torch's alias of nn.ModuleDict: gc.nn.ModuleDict",
    "ParameterDict": "torch's alias of nn.ParameterDict: gc.nn.ParameterDict",
    "BufferDict": "a dict of buffers: register_buffer each (gc.nn.Module.register_buffer)",
    "embedding_renorm_": "gc.nn.functional.embedding(max_norm=) renormalises the rows it reads",
    "lobpcg": "an iterative eigensolver: gc.linalg.eigh",
    "from_dlpack": "DLPack exchange: np.from_dlpack(x) then gc.from_numpy",
    "to_dlpack": "DLPack exchange: np.asarray(x) of a graphc Tensor",
    "from_file": "np.fromfile then gc.from_numpy",
    "frombuffer": "np.frombuffer then gc.from_numpy",
    "is_inference": "torch's inference tensors: a graphc Tensor is not one (gc.is_inference_mode_enabled)",
    "get_deterministic_debug_mode": "graphc's flag has no debug modes (gc.use_deterministic_algorithms)",
    "set_deterministic_debug_mode": "graphc's flag has no debug modes (gc.use_deterministic_algorithms)",
    "get_float32_matmul_precision": "no TF32 switch: float32 matmuls run as the backend's float32 kernels",
    "set_float32_matmul_precision": "no TF32 switch: float32 matmuls run as the backend's float32 kernels",
    "is_warn_always_enabled": "torch's warning switch: Python's warnings filters govern graphc's",
    "set_warn_always": "torch's warning switch: Python's warnings filters govern graphc's",
    "set_default_tensor_type": "deprecated in torch: gc.set_default_dtype (float32 only)",
    "set_flush_denormal": "per session: gc.Session(model, flush_denormals=True)",
    "set_printoptions": "a gc.Tensor prints through numpy: np.set_printoptions",
}


def _reason(name):
    return ABSENT.get(name) or next((why for pattern, why in ABSENT_PATTERNS.items()
                                     if re.fullmatch(pattern, name)), None)


def test_every_torch_callable_is_a_gc_name_or_listed_absent_with_the_reason():
    names = {n for n in dir(torch) if not n.startswith("_") and callable(getattr(torch, n, None))}
    missing = sorted(n for n in names if not hasattr(gc, n))
    assert [n for n in missing if _reason(n) is None] == []
    assert sorted(n for n in ABSENT if hasattr(gc, n)) == []  # a name graphc came to provide leaves the list
    assert [p for p in ABSENT_PATTERNS if not any(re.fullmatch(p, n) for n in missing)] == []
