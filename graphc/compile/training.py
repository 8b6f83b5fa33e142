# Over 500 lines: gc.training as one module, as API.md names it: the manifest, the artifacts
# (lazily read, released) and generate read and write the same format, so they stay together.
"""``gc.training.generate``: a model plus a loss and an optimizer become four ONNX graphs.

    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(lr=0.1, momentum=0.9))
    arts.save("artifacts/")            # train_step.onnx gradients.onnx eval.onnx inference.onnx
    arts = gc.training.load("artifacts/")   #   state.safetensors manifest.json

Graph interfaces (``manifest.json`` lists every input and output with its role, so tools never
guess from names):

* ``train_step``: data inputs, the label input, the trainable params (initial values as
  defaults), their optimizer state (``.momentum_buffer`` for SGD with momentum, ``.exp_sum`` and
  ``.exp_sum_sq`` for Adam/AdamW: the moments as exponentially weighted sums, PyTorch's
  ``exp_avg`` over ``1 - beta1`` and ``exp_avg_sq`` over ``1 - beta2``, which format 3 and before
  kept, and format 5 and before the second; float16 and bfloat16 params keep ``.exp_avg_sq``),
  the step counter ``step`` (int64 scalar), BatchNorm running
  statistics (role state) and ``lr`` (role hyper, default the spec's lr: a float64 scalar where a
  trainable param is float64, else float32, ``passes/training/optimizers.lr_dtype``). Outputs
  ``loss``, ``X.next`` for every param/state input ``X`` (``manifest.feeds`` maps
  ``X.next -> X``) and, where the loss has a label, the model output the loss reads, as the
  training-mode forward computed it (role ``prediction``; ``gc.Trainer`` computes the train
  metrics from it, format 3 on) and, with the spec's ``max_grad_norm``, ``grad_norm`` (the total
  gradient norm before clipping, role ``grad_norm``). Frozen params stay initializers. With the fused update (the
  default) the params are updated a group at a time (by dtype and weight-decay setting, up to
  2**19 elements each, ``params.<dtype>[.no_decay][.<n>]``: ``manifest.layout`` lists each
  group's params in order) and the optimizer state is one flat buffer per group and slot, ``<group>.<slot>`` (say ``params.float32.exp_sum``), of
  the group's params end to end. ``fused=False`` keeps one update, and state, per param.
* ``gradients``: the train_step inputs without optimizer state, step and lr; outputs ``loss``,
  ``<param>_grad``, for each BatchNorm running statistic ``X``, ``X.next`` (role state, its
  updated value) and, as train_step, the prediction (role ``prediction``: data-parallel workers'
  train metrics; artifacts from before it have none) and, for a param read only under control
  flow, ``<param>.touched`` (role ``touched``, bool: this step read it). Dropout/BatchNorm run in
  training mode (batch statistics, as train_step).
  ``update_model(manifest)`` is the optimizer update alone: data-parallel training runs
  ``gradients`` per worker and this on the averaged gradients and the ORed ``.touched`` flags.
* Dropout randomness is an input of ``train_step`` and ``gradients``: one ``dropout_noise.<k>``
  (role ``noise``, float32 uniform in [0, 1), the Dropout input's shape) per training-mode
  Dropout; an element is kept where ``noise >= ratio``. ``gc.Trainer`` draws it each step from
  its seeded numpy Generator (saved in checkpoints), so runs replay exactly on every backend.
* ``eval``: inference-mode forward (BatchNorm uses the running statistics fed in, Dropout is the
  identity); inputs data, label, params and BN stats (with defaults); outputs ``loss`` and the
  model's outputs.
* ``inference``: the forward graph in inference mode with params as initializers; the model's
  own inputs and outputs.
* ``noise_shapes`` (only where a Dropout input's shape is computed inside the model, so the
  batch's dims cannot size its noise): batch inputs in, ``<noise>.shape`` out
  (``passes/training/noise.py``); the Trainer runs it to size the noise it draws.

Every graph is ``ai.onnx`` only and keeps symbolic dims symbolic (any batch size).
``state.safetensors`` and checkpoints always name tensors per param (``fc1.weight``,
``fc1.weight.exp_sum``), whatever the layout, so either layout resumes the other's checkpoints.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict, ValidationError

from graphc.compile.amp import autocast_dtype, loss_scale_json
from graphc.compile.complex_loss import complex_output, l1_of_pairs, with_complex_label
from graphc.compile.losses import LossSpec
from graphc.compile.opsets import emitted_opset
from graphc.errors import ArtifactsError, PassError
from graphc.fileio import (OutsideFolder, confined, fsync_dir, remove_stale_temps, scratch_dir,
                           write_synced)
from graphc.model import Model, value_spec
from graphc.model.dtypes import TensorSpec, as_dtype, to_numpy, to_onnx

# Every format read, the last one written. /5: Adam's second moment as PyTorch's average
# (``exp_avg_sq``, not the sum ``exp_sum_sq``); /4: nor ``orders`` (every param in the model's
# order); /3: nor Adam's first moment as a sum (PyTorch's average, ``exp_avg``); /2: nor a
# train_step prediction output; /1: nor metrics, noise_shapes.
FORMATS = ("graphc.training/1", "graphc.training/2", "graphc.training/3", "graphc.training/4",
           "graphc.training/5", "graphc.training/6")
FORMAT = FORMATS[-1]
AVERAGED_MOMENTS = {"first_moment": frozenset(FORMATS[:3]), "second_moment": frozenset(FORMATS[:5])}
GRAPH_FILES = {
    "train_step": "train_step.onnx",
    "gradients": "gradients.onnx",
    "eval": "eval.onnx",
    "inference": "inference.onnx",
    "noise_shapes": "noise_shapes.onnx",  # only where a Dropout noise shape is computed in the model
}
REQUIRED_GRAPHS = ("train_step", "gradients", "eval", "inference")
STATE_FILE = "state.safetensors"
MANIFEST_FILE = "manifest.json"
ARTIFACT_FILES = (*GRAPH_FILES.values(), STATE_FILE, MANIFEST_FILE)
"""Every file ``TrainingArtifacts.save`` may write into its folder."""

CARRIED_ROLES = ("param", "state", "hyper")  # train_step inputs that each step's outputs replace
Role = Literal["data", "label", "param", "state", "hyper", "loss", "grad", "output", "noise", "noise_shape",
               "prediction", "grad_norm", "touched", "weight"]  # "weight": ``passes/training/accumulate.WEIGHT``


class TensorEntry(BaseModel):
    """One graph input or output: its name, role, dtype name and shape (dims int/str/None)."""

    name: str
    role: Role
    dtype: str
    shape: list[Union[int, str, None]] | None


class GraphEntry(BaseModel):
    file: str
    inputs: list[TensorEntry]
    outputs: list[TensorEntry]


class FlatBuffer(BaseModel):
    """One group of the fused update: ``params`` updated end to end as one flat vector, their
    optimizer state one train_step input ``<name>.<slot>`` per slot, in the same layout."""

    name: str
    dtype: str
    params: list[str]
    shapes: list[list[int]]
    slots: list[str]
    weight_decay: bool

    def tensors(self) -> list[tuple[str, str]]:
        """(buffer name, suffix of the per-param names it holds), one per slot."""
        return [(f"{self.name}.{s}", f".{s}") for s in self.slots]

    def pack_one(self, tensors: Mapping[str, np.ndarray], suffix: str) -> np.ndarray:
        """The buffer of the per-param ``tensors`` named ``<param><suffix>`` (``w.exp_sum``)."""
        dtype = to_numpy(self.dtype)
        return np.concatenate([np.asarray(tensors[p + suffix], dtype=dtype).reshape(-1) for p in self.params])

    def offsets(self) -> list[tuple[str, int, int]]:
        """(param, its first element in the buffer, its elements), the params laid end to end."""
        out, offset = [], 0
        for p, shape in zip(self.params, self.shapes):
            size = math.prod(shape)
            out.append((p, offset, size))
            offset += size
        return out

    def unpack(self, buffers: Mapping[str, np.ndarray],
               orders: Mapping[str, list[int]] | None = None) -> dict[str, np.ndarray]:
        """Per-param arrays from the buffers ``pack`` made: views, but copies in the model's order
        of the params ``orders`` names (their pieces are in that order of axes)."""
        out, pieces, orders = {}, list(zip(self.offsets(), self.shapes)), orders or {}
        for buf, suffix in self.tensors():
            for (p, offset, size), shape in pieces:
                out[p + suffix] = _model_order(buffers[buf][offset:offset + size], shape, orders.get(p))
        return out


def _model_order(piece: np.ndarray, shape: list[int], order: list[int] | None) -> np.ndarray:
    """``piece`` as an array of the model's ``shape``: a view, or for a param held in ``order``
    of its axes, a copy transposed back."""
    return piece.reshape(shape) if order is None else to_model_order(piece.reshape([shape[i] for i in order]), order)


def to_model_order(held: np.ndarray, order: list[int]) -> np.ndarray:
    """An array train_step holds in ``order`` of its axes (``Manifest.orders``) back in the
    model's order, as a contiguous copy."""
    return np.ascontiguousarray(np.asarray(held).transpose(np.argsort(order)))


class Manifest(BaseModel):
    """``manifest.json``: what each artifact graph takes and gives, and how steps chain."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[FORMATS] = FORMAT
    opset: int
    graphs: dict[str, GraphEntry]  # keys: train_step, gradients, eval, inference[, noise_shapes]
    feeds: dict[str, str]  # train_step output -> the train_step input it feeds next step
    trainable: list[str]
    frozen: list[str]  # float initializers kept fixed (chosen so, or not reaching the loss)
    constants: dict[str, str] = {}  # float initializers the exporter made, not params: name -> why
    # params (trainable or frozen) a dynamo export's optimizer folded from one parameter of the source
    # model by moving its elements (a Linear's transposed weight): name -> that parameter's name, by
    # which name patterns (no_decay, frozen, params, trainable) select them too; the tensor keeps its name
    sources: dict[str, str] = {}
    batchnorm: Literal["train", "frozen"] = "train"  # BatchNorm in train_step/gradients
    state: list[str]  # names stored in state.safetensors (params, opt state, step, BN stats, lr)
    optimizer: dict  # the optimizer spec as JSON ({"kind": "sgd", "lr": ..., ...})
    loss: dict  # the loss spec as JSON (kind, output, label, options); {"kind": "output", ...}
    metrics: list[str] = []  # what Trainer.evaluate reports by default (empty: the loss kind's defaults)
    model_outputs: list[str]
    layout: list[FlatBuffer] = []  # the fused update's flat buffers; empty: one input per param
    # params (and their optimizer state) train_step holds in another order of axes, as np.transpose's
    # axes from the model's: conv weights as their dense_conv reads them (passes/training/taps_params)
    orders: dict[str, list[int]] = {}
    # the backward recomputes forward values: generate's recompute=True, or gc.utils.checkpoint regions
    recompute: bool = False
    # trainable params an embedding with max_norm renormalises in place: train_step steps them from
    # their renormalised values; data-parallel workers' gradients graph gives them (``renorm_rows``)
    renormed: list[str] = []
    device: Literal["cpu", "cuda"] = "cpu"  # whose kernels the backward's lowerings suit (generate's option)
    # train-mode BatchNorms with one value per channel in a batch of one row: {module: [data input, axis]}
    one_row_batchnorms: dict[str, tuple[str, int]] = {}
    # data inputs a binary_cross_entropy reads as probabilities (its target, mostly): the Trainer
    # refuses a batch with a value outside [0, 1] there (``marked_inputs.probability_inputs``)
    probabilities: list[str] = []
    # (data input, C: its size, an input dim's name or None, ignore index) of each cross_entropy / nll_loss in
    # the model that reads a data input as class labels: the Trainer refuses a label outside [0, C)
    # (``marked_inputs.class_label_inputs``)
    class_labels: list[tuple[str, Union[int, str, None], int]] = []
    # loss scaling (generate's option, ``gc.amp``): {"kind": "dynamic", init_scale, growth_factor,
    # backoff_factor, growth_interval} or {"kind": "static", init_scale}; None: none
    loss_scale: Optional[dict] = None
    autocast: Optional[Literal["bfloat16", "float16"]] = None  # generate's option: the low dtype; None: none
    # weight averaging (generate's ``averaged``, gc.optim.swa_utils.AveragedModel): {"fn", "decay", "use_buffers",
    # "start", "every", "names": what has an ``averaged.<name>`` copy}; None: none
    averaging: Optional[dict] = None

    def pack(self, tensors: Mapping[str, np.ndarray], graph: str | None = None, *,
             consume: bool = False) -> dict[str, np.ndarray]:
        """``tensors`` named per param (``state.safetensors``, a checkpoint) as train_step takes
        them: each optimizer-state buffer whose per-param pieces ``tensors`` all hold is packed
        from them; with ``graph``, only that graph's inputs are kept. ``consume``: ``tensors`` is a
        dict its owner gives up; it becomes the result, each piece dropped once packed, so the
        pieces and the buffers are never all held at once."""
        out = tensors if consume else dict(tensors)
        if graph in (None, "train_step"):  # the other graphs take the model's order
            for name, order in self._held().items():
                if name in out:
                    out[name] = np.ascontiguousarray(np.asarray(out[name]).transpose(order))
        for buf in self.layout:
            for name, suffix in buf.tensors():
                members = [p + suffix for p in buf.params]
                if all(m in out for m in members):
                    out[name] = buf.pack_one(out, suffix)
                    for m in members:
                        del out[m]
        if graph is not None:
            wanted = {e.name for e in self.graphs[graph].inputs}
            out = {n: a for n, a in out.items() if n in wanted}
        return out

    def unpack(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inverse of ``pack`` (for train_step): flat buffers split into per-param arrays
        (views), each in the model's order."""
        out = dict(tensors)
        for buf in self.layout:
            out.update(buf.unpack({name: out.pop(name) for name, _ in buf.tensors()}, self.orders))
        for name, order in self._held().items():
            if name in tensors:  # a param, or its state without the fused layout
                out[name] = to_model_order(out[name], order)
        return out

    def _held(self) -> dict[str, list[int]]:
        """{name: order} of each tensor named per param that train_step holds in another order
        (``orders``): the param, its optimizer state and its averaged copy (``averaging``)."""
        from graphc.passes.training.optimizers import state_slots
        from graphc.passes.training.weight_averaging import PREFIX

        dtypes = {e.name: ir.DataType(to_onnx(e.dtype)) for e in self.graphs["train_step"].inputs
                  if e.name in self.orders}
        return {name: order for p, order in self.orders.items()
                for name in (p, *(f"{p}.{s}" for s in state_slots(self.kept_optimizer(), dtypes[p])),
                             *([PREFIX + p] if self.averaging else []))}

    def kept_optimizer(self) -> dict:
        """``optimizer`` with Adam's moments in the forms this format's graphs keep them: those of
        format 5 and before keep the second as PyTorch's average, of format 3 and before the first
        too (``passes/training/adam_moments``)."""
        return {**self.optimizer, **{moment: "average" for moment, formats in AVERAGED_MOMENTS.items()
                                     if self.format in formats}}

    def in_model_order(self) -> "Manifest":
        """This manifest as if train_step held every param in the model's order (no ``orders``):
        what the gradients and update graphs (data-parallel training) take."""
        if not self.orders:
            return self
        held = self._held()
        step = self.graphs["train_step"]
        inputs = [e.model_copy(update={"shape": [e.shape[i] for i in np.argsort(held[e.name])]})
                  if e.name in held and e.shape is not None else e for e in step.inputs]
        graphs = {**self.graphs, "train_step": step.model_copy(update={"inputs": inputs})}
        return self.model_copy(update={"orders": {}, "graphs": graphs})

    def carried(self) -> dict[str, TensorEntry]:
        """What train_step carries from step to step (roles param, state, hyper) as checkpoints
        name it: each flat buffer's params and state one by one, the rest as the input it is, in
        the model's order."""
        if self.orders:
            return self.in_model_order().carried()
        buffers = {name: buf for buf in self.layout for name, _ in buf.tensors()}
        out = {}
        for entry in self.graphs["train_step"].inputs:
            if entry.role not in CARRIED_ROLES:
                continue
            buf = buffers.get(entry.name)
            if buf is None:
                out[entry.name] = entry
                continue
            suffix = entry.name[len(buf.name):]
            for p, shape in zip(buf.params, buf.shapes):
                out[p + suffix] = TensorEntry(name=p + suffix, role=entry.role, dtype=buf.dtype, shape=shape)
        return out

    def interface(self) -> str:
        """A digest of ``carried()`` (names, roles, dtypes, shapes): equal for training graphs
        whose checkpoints fit each other."""
        described = sorted((e.name, e.role, e.dtype, str(e.shape)) for e in self.carried().values())
        return hashlib.sha256(repr(described).encode()).hexdigest()[:16]

    def digest(self) -> str:
        """A digest of the whole manifest as JSON (optimizer and loss specs, trainable/frozen
        sets, every graph's inputs and outputs, ...): what tells one set of training graphs from
        another (a checkpoint folder keeps the graphs of the digest its checkpoint records). An
        empty ``sources`` is left out, so graphs without folds keep the digest they had before it."""
        dumped = self.model_dump_json(exclude=None if self.sources else {"sources"})
        return hashlib.sha256(dumped.encode()).hexdigest()[:16]


GraphSource = Union[Model, Callable[[], Model]]
StateSource = Union[Mapping[str, np.ndarray], Callable[[], Mapping[str, np.ndarray]]]


class TrainingArtifacts:
    """The four graphs, the initial state and the manifest that ties them together. A graph, and
    the state, may be given as a function that loads it (``load`` does so): it is read on first
    use, so a Trainer that only trains never holds the other graphs' copies of the weights, and
    ``release`` forgets what was read so (it is read again when next used)."""

    def __init__(self, train_step: GraphSource, gradients: GraphSource, eval: GraphSource,
                 inference: GraphSource, state: StateSource, manifest: Manifest,
                 noise_shapes: GraphSource | None = None):
        self._sources: dict[str, Any] = {"train_step": train_step, "gradients": gradients, "eval": eval,
                                         "inference": inference}
        if noise_shapes is not None:
            self._sources["noise_shapes"] = noise_shapes
        self._sources["state"] = state if callable(state) else dict(state)
        self._loaded = {key: source for key, source in self._sources.items() if not callable(source)}
        self.manifest = manifest

    def _graph(self, key: str) -> Model:
        if key not in self._loaded:
            self._loaded[key] = self._sources[key]()
        return self._loaded[key]

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The initial params, optimizer state and step, per param (``<param>.<slot>``)."""
        if "state" not in self._loaded:
            self._loaded["state"] = dict(self._sources["state"]())
        return self._loaded["state"]

    @state.setter
    def state(self, tensors: Mapping[str, np.ndarray]) -> None:
        self._sources["state"] = self._loaded["state"] = dict(tensors)

    def release(self) -> None:
        """Forget the graphs and state that were read from files; the next use reads them again.
        A Trainer that read its artifacts itself calls this once its session and device buffers
        hold what it needs: ResNet-50 keeps the state and a graph's weights twice otherwise."""
        for key, source in self._sources.items():
            if callable(source):
                self._loaded.pop(key, None)

    train_step = property(lambda self: self._graph("train_step"))
    gradients = property(lambda self: self._graph("gradients"))
    eval = property(lambda self: self._graph("eval"))
    inference = property(lambda self: self._graph("inference"))
    noise_shapes = property(lambda self: self._graph("noise_shapes") if "noise_shapes" in self._sources else None)

    @property
    def graphs(self) -> dict[str, Model]:
        return {key: self._graph(key) for key in self._sources if key != "state"}

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<gc.TrainingArtifacts {len(m.trainable)} trainable, {len(m.frozen)} frozen, "
                f"{len(m.constants)} exporter constants, "
                f"optimizer {m.optimizer.get('kind')}, loss {m.loss.get('kind')}>")

    def save(self, directory: Union[str, os.PathLike]) -> Path:
        """Write the files (six, or seven with ``noise_shapes``) into ``directory``. All are
        written and synced in a temp folder inside it first, then renamed over the old ones,
        ``manifest.json`` last: a save that fails (a full disk, an error, Ctrl-C) changes nothing,
        where replacing the files one by one had left a folder of new graphs and the old state; a
        ``directory`` it made is removed again. Files of an earlier save there are replaced."""
        from safetensors.numpy import save as st_save

        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise FileExistsError(f"cannot save training artifacts into {directory}: it is a file; give a folder")
        with scratch_dir(directory / MANIFEST_FILE) as tmp:  # folders it made go again on failure
            for key, model in self.graphs.items():
                model.save(tmp / GRAPH_FILES[key])
            state = {k: np.asarray(v, order="C") for k, v in self.state.items()}  # keeps 0-d step/lr 0-d
            write_synced(tmp / STATE_FILE, st_save(state))
            write_synced(tmp / MANIFEST_FILE, self.manifest.model_dump_json(indent=2).encode())
            for name in sorted(os.listdir(tmp), key=lambda n: n == MANIFEST_FILE):
                os.replace(tmp / name, directory / name)
        fsync_dir(directory)
        return directory


def load(directory: Union[str, os.PathLike]) -> TrainingArtifacts:
    """Read what ``TrainingArtifacts.save`` wrote.

    Temps that a killed save left beside the files are removed. Each graph is read on first
    use and checked against the manifest then; so is the state (its header is read now).

    Raises:
        ArtifactsError: ``manifest.json`` is missing, not JSON or not a valid manifest, lacks one
            of the four graphs; it, the state or a graph file it names leads outside ``directory``
            (a symlink, '..', a hard link: ``fileio.confined``); ``state.safetensors`` has no
            readable header. Checked before any graph
            is read. On first use of a graph: its inputs or outputs differ from the manifest's; of
            the state: a tensor's entry or data is bad (truncated, offsets outside the file).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    files = {key: _graph_file(directory, key, entry.file) for key, entry in manifest.graphs.items()}
    state = _own_file(directory, STATE_FILE)
    for path in (*files.values(), state, directory / MANIFEST_FILE):
        remove_stale_temps(path)  # what a save killed mid-way left beside them
    graphs = {key: partial(_load_graph, path, directory / MANIFEST_FILE, manifest.graphs[key])  # read on first use
              for key, path in files.items()}
    artifacts = TrainingArtifacts(graphs["train_step"], graphs["gradients"], graphs["eval"], graphs["inference"],
                                  partial(_read_state, state), manifest, graphs.get("noise_shapes"))
    _check_state(state)  # its header now, so an unreadable state fails here
    return artifacts


def _read_state(path: Path) -> dict[str, np.ndarray]:
    from graphc.tensorfile import read_tensors

    try:
        return read_tensors(path)
    except (OSError, ValueError) as exc:
        raise ArtifactsError(f"{path}: cannot read the initial state ({exc})") from None


def _check_state(path: Path) -> None:
    """Fail now if ``path`` is no safetensors file: its header is read, none of its tensors
    (a Trainer reads them only once its session holds the graph)."""
    from graphc.tensorfile import read_header

    try:
        read_header(path)
    except (OSError, ValueError) as exc:
        raise ArtifactsError(f"{path}: cannot read the initial state ({exc})") from None


def read_manifest(directory: Union[str, os.PathLike]) -> Manifest:
    """The validated ``manifest.json`` of an artifact directory; ``ArtifactsError`` if it is not one."""
    path = _own_file(Path(directory), MANIFEST_FILE)
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ArtifactsError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = f" at {'.'.join(map(str, first['loc']))}" if first["loc"] else ""
        more = f" (and {exc.error_count() - 1} more error(s))" if exc.error_count() > 1 else ""
        raise ArtifactsError(f"{path}: not a valid graphc training manifest: {first['msg']}{where}{more}") from None
    missing = [key for key in REQUIRED_GRAPHS if key not in manifest.graphs]
    if missing:
        raise ArtifactsError(f"{path}: the manifest lists no {', '.join(missing)} graph(s); it needs "
                             f"{', '.join(REQUIRED_GRAPHS)}")
    unknown = sorted(set(manifest.graphs) - set(GRAPH_FILES))
    if unknown:
        raise ArtifactsError(f"{path}: the manifest lists unknown graph(s) {', '.join(unknown)}; "
                             f"known: {', '.join(GRAPH_FILES)}")
    problem = _inconsistency(manifest)
    if problem is not None:  # a manifest edited by hand: a param without its feed never trained
        raise ArtifactsError(f"{path}: the manifest contradicts itself: {problem}")
    return manifest


def _inconsistency(m: Manifest) -> str | None:
    """The first place where ``feeds``, ``trainable``, ``layout`` or ``state`` disagree with the
    train_step graph the manifest lists, or None."""
    step = m.graphs["train_step"]
    inputs, outputs = {e.name: e for e in step.inputs}, {e.name: e for e in step.outputs}
    for out, into in m.feeds.items():
        source, target = outputs.get(out), inputs.get(into)
        if source is None or target is None or target.role not in ("param", "state"):
            return (f"feeds maps {out!r} to {into!r}, but train_step has no such output, or no such param or "
                    "state input")
        if (source.dtype, source.shape) != (target.dtype, target.shape):
            return f"feeds maps {out!r} ({source.dtype}{source.shape}) to {into!r} ({target.dtype}{target.shape})"
    fed, still = list(m.feeds.values()), _frozen_statistics(m)
    for name, entry in inputs.items():
        if entry.role in ("param", "state") and fed.count(name) not in ((0, 1) if name in still else (1,)):
            return f"feeds gives the train_step {entry.role} {name!r} {fed.count(name)} next values, not 1"
    differs = _differs("trainable", m.trainable, [n for n, e in inputs.items() if e.role == "param"],
                       "train_step's params")
    if differs:
        return differs
    for p, order in m.orders.items():
        if p not in m.trainable or sorted(order) != list(range(len(inputs[p].shape or []))):
            return f"orders holds {p!r} in the order {order}, not an order of a train_step param's axes"
    m = m.in_model_order()
    inputs = {e.name: e for e in m.graphs["train_step"].inputs}
    laid = [p for buf in m.layout for p in buf.params]
    for buf in m.layout:
        if len(buf.params) != len(buf.shapes):
            return f"layout {buf.name!r} lists {len(buf.params)} params and {len(buf.shapes)} shapes"
        for p, shape in zip(buf.params, buf.shapes):
            if p not in inputs or inputs[p].shape != shape or laid.count(p) != 1:
                return f"layout {buf.name!r} holds {p!r} as {shape}, not a param train_step takes once so"
        size = sum(math.prod(s) for s in buf.shapes)
        for name, _ in buf.tensors():
            if name not in inputs or inputs[name].shape != [size]:
                return f"layout {buf.name!r} needs a train_step state input {name!r} of [{size}]"
    return _differs("state", m.state, m.carried(), "what train_step carries")


def _frozen_statistics(m: Manifest) -> set[str]:
    """What may be train_step state no output feeds: with ``batchnorm="frozen"``, the gradients
    graph's state inputs it gives no next value (the BatchNorm statistics, read, never updated)."""
    if m.batchnorm != "frozen":
        return set()
    grads = m.graphs["gradients"]
    nexts = {e.name for e in grads.outputs}
    return {e.name for e in grads.inputs if e.role == "state" and f"{e.name}.next" not in nexts}


def _differs(field: str, listed, wanted, what: str) -> str | None:
    """Which names the manifest's ``field`` lists beyond ``wanted`` or lacks from it, or None."""
    extra, lacking = sorted(set(listed) - set(wanted)), sorted(set(wanted) - set(listed))
    if not extra and not lacking:
        return None
    return f"{field} lists {extra} beyond {what} and lacks {lacking}" if extra and lacking else (
        f"{field} lists {extra} beyond {what}" if extra else f"{field} lacks {lacking} of {what}")


def _load_graph(path: Path, manifest: Path, entry: GraphEntry) -> Model:
    """The graph at ``path``, refused with ``ArtifactsError`` unless its inputs and outputs are
    the ones ``entry`` (in ``manifest``) lists, with the same dtypes, ranks and fixed dims."""
    from graphc.model import load as load_model

    model = load_model(path)
    where = f"{path} does not match {manifest}"
    for kind, listed, found in (("input", entry.inputs, model.inputs), ("output", entry.outputs, model.outputs)):
        have = {spec.name: spec for spec in found}
        for want in listed:
            spec = have.pop(want.name, None)
            if spec is None:
                raise ArtifactsError(f"{where}: the graph has no {kind} {want.name!r} (another model's graph?)")
            if not _same_type(want, spec):
                raise ArtifactsError(f"{where}: {kind} {want.name!r} is {spec.dtype}{list(spec.shape or [])} in the "
                                     f"graph, {want.dtype}{want.shape} in the manifest")
        if kind == "input" and have:
            raise ArtifactsError(f"{where}: the graph has input(s) {sorted(have)} that the manifest does not list")
    return model


def _same_type(entry: TensorEntry, spec: TensorSpec) -> bool:
    """Same dtype and rank, and the same size on every axis fixed in both (dim names may differ)."""
    if str(spec.dtype) != entry.dtype:
        return False
    if spec.shape is None or entry.shape is None:
        return True
    return len(spec.shape) == len(entry.shape) and all(
        a == b for a, b in zip(spec.shape, entry.shape) if isinstance(a, int) and isinstance(b, int))


def _graph_file(directory: Path, key: str, name: str) -> Path:
    """``directory / name``, refused unless it is one of ``directory``'s own files (``confined``)."""
    target = _own_file(directory, name, f"the {key} graph file ").resolve()
    if not target.is_file():
        raise ArtifactsError(f"{directory / MANIFEST_FILE}: the {key} graph file {name!r} is missing")
    return target


def _own_file(directory: Path, name: str, what: str = "") -> Path:
    """``directory / name`` if it lies in ``directory`` (``fileio.confined``), else ``ArtifactsError``."""
    try:
        return confined(directory, name, "artifact directory")
    except OutsideFolder as exc:
        where = directory / MANIFEST_FILE if what else directory
        raise ArtifactsError(f"{where}: {what}{exc}") from None


def generate(model: Model, loss: Union[LossSpec, str], optimizer, trainable: Iterable[str] | None = None,
             frozen: Iterable[str] = (), fused: bool = True, recompute: bool = False, params: Iterable[str] = (),
             batchnorm: Literal["train", "frozen"] = "train", device: Literal["cpu", "cuda"] = "cpu",
             loss_scale=None, scheduled: Iterable[str] = (), autocast=None, averaged=None) -> TrainingArtifacts:
    """Training artifacts for ``model``.

    Which float initializers are params: for an imported model, what the source framework
    trains. A PyTorch export's module parameters are params; what the exporter made (scalars
    such as GELU's 0.044715 or an attention scale, masks, zero initial states: dynamo's
    ``val_N``, TorchScript's scalar or zero ``onnx::...``) are constants, decided from the
    exporter's own records (``graphc.passes.training.imports.exporter_constants``).
    ``manifest.trainable`` and ``manifest.constants`` (with the reason for each) report the
    decision; ``params`` and ``frozen`` override it either way.

    Args:
        model: a ``gc.Model`` (captured or imported with ``gc.load``).
        loss: a ``gc.losses`` spec such as ``gc.losses.mse("out", label="y")``, or the name of a
            scalar float output that already is the loss.
        optimizer: ``gc.optim.SGD``, ``Adam`` or ``AdamW``.
        trainable: param names (or glob patterns such as ``"encoder.*"``) to train; default every
            float initializer that reaches the loss and is no exporter constant (BatchNorm
            running statistics are state, never trainable). A param the loss never reads is not
            updated even when named here (a warning says so): it has no gradient, as in torch.
        frozen: names or patterns excluded from ``trainable`` (they stay initializers).
        params: names or patterns trained though the rule above calls them constants. These
            (and the optimizer's ``no_decay``) also select a tensor that a dynamo export folded
            from one parameter by moving its elements by that parameter's name (``val_6`` by
            ``fc.weight``: ``manifest.sources``).
        batchnorm: ``"train"`` (batch statistics, running ones updated: ``model.train()``) or
            ``"frozen"`` (the running statistics normalise and stay as they are, as
            ``model.eval()`` / ``FrozenBatchNorm2d``; scale and bias still train unless frozen).
        fused: update the params as a few flat buffers (one per dtype and weight-decay group),
            not one by one: the update's cost then follows the params' bytes, not their count.
        recompute: activation checkpointing for memory-bound models: the backward recomputes
            the cheap forward values it reads (elementwise ops, reshapes) from the expensive
            ones (convolutions, matmuls, pooling), so those are all a step keeps alive
            (ResNet-50, batch 32, onnxruntime CPU, 2 threads: peak RSS 2.9 -> 2.5 GB for about
            8 % more time per step). ``gc.utils.checkpoint`` regions are recomputed either way.
        device: ``"cpu"`` or ``"cuda"``: whose kernels (onnxruntime's CPU or CUDA provider) the
            backward's lowerings are chosen for, where the fastest differ (a convolution's weight
            gradient: see ``passes/autodiff/rules_nn.py``; reductions over batch and pixels:
            ``passes/training/reductions.py``; small depthwise convs). On ``"cpu"``, where this
            machine's onnxruntime has NCHWc kernels (which ort-cpu runs Convs with fed weights on,
            ``backends/nchwc.py``), the depthwise weight gradients are chosen for them. The graphs
            run on any backend and compute the same values up to rounding; only the speed follows
            the choice.
        loss_scale: ``gc.amp.GradScaler(...)`` (dynamic loss scaling, ``torch.amp.GradScaler``'s
            semantics) or a float (a static scale): train_step backpropagates ``loss * scale``,
            unscales the gradients (before any clipping) and skips the update (params, optimizer
            state, ``step``) when one of them is inf or NaN; the scale (``loss_scale``) and the
            growth tracker (``loss_scale.growth_tracker``) are train_step state
            (``passes/training/loss_scaling.py``). None (default): no scaling, the graphs as before.
        scheduled: hyper-parameters beside the lr to make train_step inputs a scheduler sets
            between steps: ``("momentum",)`` for OneCycleLR and CyclicLR with
            ``cycle_momentum=True`` (SGD's and RMSprop's momentum, the Adam family's beta1; a
            float64 input ``momentum``, ``Trainer.momentum``). Adam and AdamW then keep their
            first moment as torch does, ``exp_avg``; NAdam keeps torch's ``mu_product`` (a float64
            state); SGD gets its momentum buffer even at ``momentum=0``, and SGD and RMSprop skip
            it at a step whose momentum is exactly 0, as torch. Default: none (the spec's
            constants, graphs as before).
        autocast: ``"bfloat16"`` or ``"float16"``: mixed precision as ``torch.autocast(device,
            dtype)`` for a float32 model (imported ones too): train_step's and gradients' forward
            follows torch's dtype flow (``passes/precision/autocast.py``): the ops torch's autocast
            lowers on ``device`` (MatMul, Gemm, Conv, ...; ``autocast_policy.ONNX_OPS``) run in it,
            the ops after them on what they are given (the widest of their inputs), float32-listed
            ops and the loss in float32, the norms in float32 rounded back; the params stay float32
            master weights. eval and inference stay
            the model as given. float16 without ``loss_scale`` warns. None (default): graphs as before.
        averaged: ``gc.optim.swa_utils.AveragedModel(...)``: train_step also keeps the averaged
            copy of the params (and buffers) torch's ``update_parameters`` computes after each
            optimizer step, EMA or SWA, from its ``start`` step every ``every`` steps
            (``passes/training/weight_averaging.py``); the Trainer's ``averaged=True`` reads it.
            None (default): graphs as before.

    Raises:
        gc.GraphError: unknown output/param names, a loss that is not a float scalar, an op
            without a gradient rule on the way to a trainable param.
    """
    from graphc.dsl.autocast_policy import onnx_kinds
    from graphc.passes.training import artifacts, marked_inputs
    from graphc.passes.training.recompute import marked
    from graphc.passes.training.scheduled import with_scheduled

    if not isinstance(model, Model):
        raise TypeError(f"generate() takes a gc.Model, got {type(model).__name__}")
    pair = isinstance(loss, LossSpec) and complex_output(model, loss)  # l1 on a complex output's pair
    if isinstance(loss, str):
        loss_args = artifacts.LossArgs(output=loss)
        loss_json = {"kind": "output", "output": loss, "label": None, "options": {}}
    elif isinstance(loss, LossSpec):
        loss_args = artifacts.LossArgs(loss.output, loss.label, build=partial(capture_loss, loss, complex_pair=pair))
        loss_json = {**loss.model_dump(), "options": loss.resolved_options()}
    else:
        raise TypeError("loss must be a gc.losses spec (e.g. gc.losses.mse('out', label='y')) or the "
                        f"name of a scalar output, got {type(loss).__name__}")
    if batchnorm not in ("train", "frozen"):
        raise ValueError(f"batchnorm must be 'train' or 'frozen', got {batchnorm!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    opt_json = with_scheduled(_optimizer_json(optimizer), scheduled)
    scale_json = loss_scale_json(loss_scale)
    low = autocast_dtype(autocast, scale_json)
    model = emitted_opset(model, "training graphs")
    built = artifacts.build(model.ir, loss_args, opt_json,
                            trainable=None if trainable is None else names(trainable), frozen=names(frozen),
                            fused=fused, recompute=recompute, params=names(params), batchnorm=batchnorm,
                            device=device, nchwc=_nchwc_block() if device == "cpu" else 0, loss_scale=scale_json,
                            autocast=None if low is None else (low, onnx_kinds(device)))
    averaging = None if averaged is None else _averaging(built, averaged)
    if pair:
        for m in built.graphs.values():
            with_complex_label(m, loss.label)
    graphs = {key: Model(m) for key, m in built.graphs.items()}
    manifest = Manifest(
        opset=built.opset,
        graphs={key: _graph_entry(key, m, built.roles[key]) for key, m in graphs.items()},
        feeds=built.feeds, trainable=built.trainable, frozen=built.frozen, constants=built.constants,
        sources=built.sources,
        batchnorm=batchnorm, state=list(built.state),
        optimizer=opt_json, loss=loss_json, metrics=_default_metrics(loss_json, graphs["eval"]),
        model_outputs=built.model_outputs, recompute=recompute or marked(model.ir.graph), device=device,
        layout=[FlatBuffer(name=g.name, dtype=str(as_dtype(int(g.dtype))), params=g.params,
                           shapes=[list(s) for s in g.shapes], slots=list(built.slots[g.name]),
                           weight_decay=g.weight_decay) for g in built.layout],
        orders=built.orders, one_row_batchnorms=built.one_row_batchnorms, loss_scale=scale_json,
        renormed=built.renormed, autocast=low, probabilities=marked_inputs.probability_inputs(model.ir.graph),
        class_labels=marked_inputs.class_label_inputs(model.ir.graph),
        averaging=averaging)
    return TrainingArtifacts(graphs["train_step"], graphs["gradients"], graphs["eval"],
                             graphs["inference"], built.state, manifest, graphs.get("noise_shapes"))


def _averaging(built, averaged) -> dict:
    """``averaged`` (an ``AveragedModel``) added to ``built``'s train_step; the manifest's record of it."""
    from graphc.passes.training import weight_averaging
    from graphc.runtime.swa_utils import AveragedModel

    if not isinstance(averaged, AveragedModel):
        raise TypeError(f"averaged must be a gc.optim.swa_utils.AveragedModel, got {type(averaged).__name__}")
    spec = averaged.spec()
    return {**spec, "names": weight_averaging.add(built, spec)}


def update_model(manifest: Manifest, grad_norm: bool = False, shard: Optional[Collection[str]] = None,
                 args: Optional[dict[str, Any]] = None) -> Model:
    """The optimizer update of ``manifest``'s train_step as a model of its own (see
    ``passes.training.update_graphs``), built from the manifest alone: artifacts saved
    before it existed get it too, and its ``lr`` has train_step's dtype (float32 where artifacts
    of float64 params were saved before their lr became float64). ``grad_norm``: with the spec's
    ``max_grad_norm``, also output train_step's ``grad_norm`` (the total norm before clipping).
    ``shard``: the params of one worker of a sharded update (whole flat buffers): their update alone,
    given the total norm and found_inf of every shard (``update_graphs.update_graph``'s ``norm_dtype``).
    ``args``: ``update_args(manifest, shard)``, where the caller has them already."""
    from graphc.passes.training import update_graphs

    args = update_args(manifest, shard) if args is None else args
    return Model(update_graphs.update_graph(manifest.opset, args["optimizer"], args["params"], args["groups"],
                                            args["optimizer"].get("no_decay") or (), args["lr_dtype"],
                                            manifest.loss_scale, args["gated"], args["flagged"], manifest.sources,
                                            grad_norm, args["norm_dtype"]))


def update_args(manifest: Manifest, shard: Optional[Collection[str]] = None) -> dict[str, Any]:
    """What ``update_graphs`` builds ``manifest``'s update from: ``params`` (typed values),
    ``groups`` (flat buffers), the kept ``optimizer``, ``lr_dtype``, the ``gated`` and ``flagged``
    params, and with a ``shard`` (param names) those of its params alone and the dtype of every
    gradient's norm, ``norm_dtype`` (None without)."""
    from graphc.passes.training import artifacts, clipping, flat
    from graphc.passes.training.guarded_params import STEP_SUFFIX, TOUCHED_SUFFIX

    manifest = manifest.in_model_order()
    params = [ir.Value(name=e.name, type=ir.TensorType(ir.DataType(to_onnx(e.dtype))), shape=ir.Shape(e.shape))
              for e in manifest.graphs["train_step"].inputs if e.role == "param"]
    groups = [flat.Group(b.name, ir.DataType(to_onnx(b.dtype)), list(b.params), [tuple(s) for s in b.shapes],
                         b.weight_decay)
              for b in manifest.layout]
    norm = None
    if shard is not None:
        norm = clipping.norm_dtype(p.dtype for p in params)
        params = [p for p in params if p.name in shard]
        groups = [g for g in groups if g.params[0] in shard]
    inputs = {e.name for e in manifest.graphs["train_step"].inputs}
    lr = next(e for e in manifest.graphs["train_step"].inputs if e.name == artifacts.LR)
    gated = [p.name for p in params if p.name + STEP_SUFFIX in inputs]  # each with its own step count
    flagged = [e.name[: -len(TOUCHED_SUFFIX)] for e in manifest.graphs["gradients"].outputs if e.role == "touched"]
    return {"params": params, "groups": groups, "optimizer": manifest.kept_optimizer(),
            "lr_dtype": ir.DataType(to_onnx(lr.dtype)), "gated": gated, "flagged": flagged, "norm_dtype": norm}


def worker_gradients_model(artifacts: TrainingArtifacts) -> Model:
    """The gradients graph data-parallel workers run: the artifacts', or with loss scaling one that
    outputs the scaled loss's gradients (``loss_scaling.scaled_gradients``), which the update
    graph checks for inf/NaN and unscales once they are combined, as DDP's with torch's GradScaler."""
    from graphc.passes.training import loss_scaling

    if artifacts.manifest.loss_scale is None:
        return artifacts.gradients
    return Model(loss_scaling.scaled_gradients(artifacts.gradients.ir))


def capture_loss(spec: LossSpec, output: ir.Value, opset: int, complex_pair: bool = False) -> ir.Model:
    """The loss as a graph of its own, captured from ``gc.losses``: inputs ``pred`` (the model
    output's type) and ``label`` (int64 class indices [N, d1...] for cross-entropy on
    [N, C, d1...], else the output's type); one scalar output. ``complex_pair``: the output is a
    complex value's pair (``complex_loss``)."""
    from graphc.dsl import losses as _dsl_losses
    from graphc.dsl.capture import capture

    pred = value_spec(output)
    if pred.shape is None:
        raise PassError(f"loss {spec.kind!r}: the rank of model output {output.name!r} is unknown")
    label = pred
    if spec.kind == "cross_entropy":
        if len(pred.shape) < 2:
            raise PassError(f"cross_entropy needs logits [N, C, ...]; output {output.name!r} has shape {pred.shape}")
        label = TensorSpec(name="label", dtype="int64", shape=(pred.shape[0], *pred.shape[2:]))
    fn = l1_of_pairs if complex_pair else getattr(_dsl_losses, spec.kind)
    options = spec.resolved_options()
    if "weight" in options:  # cast to the logits' dtype by the loss
        options["weight"] = np.asarray(options["weight"], np.float64)
        classes = pred.shape[1]
        if isinstance(classes, int) and classes != len(options["weight"]):
            raise ValueError(f"cross_entropy: classes and weights differ: model output {output.name!r} "
                             f"{list(pred.shape)} has {classes} classes, the class weight has "
                             f"{len(options['weight'])} entries")
    model = capture(lambda pred, label: fn(pred, label, **options), name=f"{spec.kind}_loss", opset=opset,
                    pred=pred.model_copy(update={"name": "pred"}), label=label.model_copy(update={"name": "label"}))
    return model.ir


def _nchwc_block() -> int:
    """The channel block of this machine's onnxruntime NCHWc kernels, which ort-cpu runs Convs
    with fed weights on (``graphc.backends.nchwc``); 0 without them (or without onnxruntime)."""
    try:
        from graphc.backends import nchwc

        return nchwc.block_size()
    except ImportError:
        return 0


def _optimizer_json(optimizer) -> dict:
    from graphc.compile import optim

    if isinstance(optimizer, dict):
        optimizer = optim.from_dict(optimizer)
    if not isinstance(optimizer, tuple(optim.BY_KIND.values())):
        raise TypeError(f"optimizer must be one of gc.optim.{', '.join(c.__name__ for c in optim.BY_KIND.values())}, "
                        f"got {type(optimizer).__name__}")
    return optimizer.model_dump(mode="json")


def _default_metrics(loss: dict, evaluation: Model) -> list[str]:
    """What ``Trainer.evaluate`` reports for this loss (``gc.metrics.default_names``); empty
    where that depends on a class count the graphs leave symbolic (then decided per batch)."""
    from graphc.runtime import metrics

    if loss.get("kind") == "output":  # a loss output with no label: nothing to compare with
        return []
    out = next((s for s in evaluation.outputs if s.name == loss.get("output")), None)
    classes = out.shape[1] if out is not None and out.shape is not None and len(out.shape) > 1 else None
    return metrics.default_names(loss.get("kind", ""), classes if isinstance(classes, int) else None) or []


def names(given: Union[str, Iterable[str]]) -> list[str]:
    """Param names or patterns as a list: one name given as a string is that one (not its letters)."""
    return [given] if isinstance(given, str) else list(given)


def _graph_entry(key: str, model: Model, roles: tuple[dict[str, str], dict[str, str]]) -> GraphEntry:
    def entry(spec, role: dict[str, str]) -> TensorEntry:
        shape = None if spec.shape is None else list(spec.shape)
        return TensorEntry(name=spec.name, role=role[spec.name], dtype=str(spec.dtype), shape=shape)

    inputs, outputs = roles
    return GraphEntry(file=GRAPH_FILES[key], inputs=[entry(s, inputs) for s in model.inputs],
                      outputs=[entry(s, outputs) for s in model.outputs])


__all__ = ["ArtifactsError", "FlatBuffer", "GraphEntry", "Manifest", "TensorEntry", "TrainingArtifacts", "generate", "load",
           "read_manifest", "update_model"]
