"""Make imported models trainable.

Exporters keep weights in odd places. This pass handles:

1. weights stored in ``Constant`` nodes: a floating-point ``Constant`` of rank >= 1 with at
   least 2 elements, not all zero, becomes an initializer named after its output (scalars and
   1-element constants such as epsilons, scales and exponents stay constants, and so do zero
   tensors such as recurrent initial states and constants that only set how an op behaves, such
   as Resize scales: ``settings_only``). Constants captured from the DSL (they carry
   ``graphc.source``) stay constants: there the user chose between ``gc.nn.Parameter`` and a
   constant; so do a PyTorch export's (``torch.onnx`` keeps every parameter in an initializer);
2. an initializer aliased through ``Identity`` or read by several nodes: nothing to rewrite;
   the initializer is the param and autodiff sums the gradients of every use;
3. shape arithmetic built from ``Shape``/``Gather``/``Concat``: integer paths, which autodiff
   never differentiates;
4. one initializer feeding the scale or bias of several normalization layers: usually not a
   tie in the source model but an exporter merging equal values (torch.onnx's dynamo exporter
   does it to every freshly initialized LayerNorm), so training would tie those layers. It
   stays as it is (the graph means exactly that) with a warning naming the layers.

5. initializers that the exporter made, not the source model's parameters, and the buffers of
   ``gc.nn`` modules (``exporter_constants``);
6. parameters the exporter's constant folding merged with other tensors (a BatchNorm fused into
   the Conv before it, a table gathered by constant indices) or replaced with a function of them
   (``sigmoid(gate)``, a weight norm): the folded tensor trains, which is not what the source
   model trains; a warning names them (``warn_folded_parameters``). A transposed or reshaped
   parameter trains as the parameter does and is not named (``fold_records``).
7. a weight shared by two layers that TorchScript's constant folding split in two (an Embedding
   tied to the output Linear: ``e.weight`` and ``onnx::MatMul_6``, its transpose): the folded
   copy is computed from the weight again (``retie_folded_copies``), so both train as one;
8. separate parameters that TorchScript merged for their equal values (an eval-mode export of
   fresh norm layers: ``ln2.weight = Identity(bn1.weight)``): each gets its own initializer
   again (``untie_merged_params``), so they train apart, as in torch;
9. torch's ``detach`` (a straight-through estimator, a param read only as ``p.detach()``): the
   dynamo exporter writes an Identity recording it, which stops the gradient as ``gc.detach``
   does (``mark_detached``). TorchScript writes nothing for it.

Initializers listed as graph inputs (IR < 4 exports) keep working: they already are inputs.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from graphc.model import BUFFERS_KEY, SOURCE_KEY
from graphc.passes.autodiff.registry import settings_only
from graphc.passes.training import fold_records
from graphc.passes.values import STOP_GRADIENT_KEY

_FLOAT = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def promote_constant_weights(model: ir.Model) -> list[str]:
    """Turn weight-like ``Constant`` nodes of the main graph into initializers; return names."""
    graph = model.graph
    promoted = []
    if model.producer_name == _TORCH:
        return promoted
    for node in list(graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or "value" not in node.attributes:
            continue
        if SOURCE_KEY in node.metadata_props:
            continue
        tensor = node.attributes["value"].as_tensor()
        if tensor.dtype not in _FLOAT or len(tensor.shape) == 0 or tensor.size < 2 or not tensor.numpy().any():
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.name in graph.initializers or settings_only(out):
            continue
        promoted.append(_as_initializer(graph, node, tensor, "constant").name)
    return promoted


def _as_initializer(graph: ir.Graph, node: ir.Node, tensor: ir.TensorProtocol, suffix: str) -> ir.Value:
    """``node`` replaced by an initializer holding ``tensor``, under its output's name (the old
    output renamed ``<name>/<suffix>``); returns that initializer."""
    out = node.outputs[0]
    value = ir.Value(name=out.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    out.name = f"{out.name}/{suffix}"
    out.replace_all_uses_with(value)
    graph.remove(node, safe=True)
    graph.register_initializer(value)
    return value


# What torch.onnx records (evidence read by ``exporter_constants``). The dynamo exporter writes
# torch.export's graph signature on the graph and each lifted input's kind on its initializer;
# onnxscript's optimizer (``optimize=True``, the default) names the sources of a folded one.
_TORCH = "pytorch"
SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
_FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # a node's module path: ['', 'emb', 'embedding']
FX_NODE = "pkg.torch.onnx.fx_node"  # the torch.export node it came from, its inputs as %placeholders
_PLACEHOLDER = "pkg.torch.onnx.original_node_name"  # an initializer's placeholder there (p_emb_weight)
_TORCHSCRIPT_FOLDED = "onnx::"  # the TorchScript exporter's names for values it computed
_DETACH_TARGET = "target=torch.ops.aten.detach.default]"  # in a node's fx_node: torch's detach


def torchscript(model: ir.Model) -> bool:
    """Whether ``model`` is a TorchScript export (torch.onnx's, without dynamo's graph signature)."""
    return model.producer_name == _TORCH and SIGNATURE not in model.graph.metadata_props


def retie_folded_copies(model: ir.Model) -> list[str]:
    """Rebuild each folded copy of another float initializer (its values, or its transpose's)
    from that one (an Identity or a Transpose of it, same name), in place; returns their names.
    Constant folding turns a weight that two layers share into two tensors, which would train
    apart: TorchScript's ``onnx::MatMul_6`` is ``e.weight`` transposed (any float initializer
    without an ``onnx::`` name may be the source), onnxscript's ``val_0`` records its source
    (``folded_from``: one initializer) in a dynamo export. Values with fewer than three distinct
    elements (zeros, ones, an identity matrix) are equal by construction, not a copy, and stay."""
    graph = model.graph
    if torchscript(model):
        sources = [v for n, v in graph.initializers.items()
                   if not n.startswith(_TORCHSCRIPT_FOLDED) and is_float(v) and v.const_value is not None]
        copies = {n: sources for n in graph.initializers if n.startswith(_TORCHSCRIPT_FOLDED)}
    elif SIGNATURE in graph.metadata_props:
        copies = {n: [graph.initializers[s] for s in found] for n, v in graph.initializers.items()
                  if len(found := _sources(v)) == 1 and found <= set(graph.initializers) - {n}}
    else:
        return []
    rebuilt = []
    for name, candidates in copies.items():
        value = graph.initializers[name]
        if not is_float(value) or value.const_value is None or value.is_graph_input():
            continue
        array = value.const_value.numpy()
        match = next(((op, v) for v in candidates if v.const_value is not None
                      and (op := _copy_op(v.const_value.numpy(), array))), None)
        if match is None or np.unique(array).size < 3:
            continue
        op, source = match
        copy = ir.node(op, [source], {"perm": [1, 0]} if op == "Transpose" else None).outputs[0]
        copy.type, copy.shape = value.type, value.shape
        graph.insert_before(next(iter(graph)), copy.producer())
        graph.initializers.pop(name)
        value.replace_all_uses_with(copy)
        copy.name = name
        rebuilt.append(name)
    return rebuilt


def untie_merged_params(model: ir.Model) -> list[str]:
    """Give each TorchScript ``Identity`` of a float initializer whose output bears a module path
    (``ln2.weight = Identity(bn1.weight)``) an initializer of its own holding a copy of the
    value, in place; returns their names. An export in eval mode merges initializers of equal
    values (every fresh norm layer's ones and zeros into the first one's), which would train
    those layers as one; a parameter the model really shares is one initializer read twice,
    never an Identity. (Dynamo merges them too, without an Identity: ``warn_shared_normalization_params``.)"""
    graph = model.graph
    if not torchscript(model):
        return []
    untied = []
    for node in list(graph):
        source, out = (node.inputs[0] if node.inputs else None), node.outputs[0]
        if node.op_type != "Identity" or node.domain not in ("", "ai.onnx") or source is None \
                or not source.is_initializer() or source.is_graph_input() or source.const_value is None \
                or not is_float(source) or out.name.startswith(_TORCHSCRIPT_FOLDED) or out.is_graph_output():
            continue
        own = ir.tensor(source.const_value.numpy().copy(), dtype=source.dtype, name=out.name)
        untied.append(_as_initializer(graph, node, own, "merged").name)
    return untied


def mark_detached(model: ir.Model) -> list[str]:
    """Mark each Identity that a dynamo export recorded as torch's ``detach`` (its fx node calls
    ``aten.detach``) as stopping the gradient, in place; returns their outputs' names. Torch sends
    no gradient through it: differentiated, a straight-through estimator ``x + (q - x).detach()``
    got the gradient of ``q``, and a param read only through it trained."""
    marked = []
    for node in model.graph:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") \
                and _DETACH_TARGET in node.metadata_props.get(FX_NODE, ""):
            node.metadata_props[STOP_GRADIENT_KEY] = "true"
            marked.append(node.outputs[0].name)
    return marked


def _copy_op(source: np.ndarray, array: np.ndarray) -> str | None:
    """``"Identity"`` when ``array`` equals ``source``, ``"Transpose"`` when it equals the 2-D
    ``source`` transposed, else None."""
    if source.shape == array.shape and np.array_equal(source, array):
        return "Identity"
    if source.ndim == 2 and source.T.shape == array.shape and np.array_equal(source.T, array):
        return "Transpose"
    return None


def exporter_constants(model: ir.Model, names: Sequence[str]) -> dict[str, str]:
    """``{name: why}`` for the initializers among ``names`` that the exporter made rather than
    the source model's parameters, decided by the exporters' own records:

    1. dynamo (``torch.onnx.export(..., dynamo=True)``): an initializer is a parameter when its
       kind is ``PARAMETER`` or it was folded from one (a transposed ``fc.weight``, LSTM gates
       concatenated, a BatchNorm fused into the Conv before it keeps the Conv's name); buffers (``BUFFER``, ``CONSTANT_TENSOR``) and values the exporter made
       (``val_N``, ``scalar_tensor_default``: scalars, masks, zero states) are constants;
    2. TorchScript (producer ``pytorch``): parameters keep their module paths; a value the
       exporter computed is named ``onnx::<Op>_<N>``: a parameter folded through a Transpose or
       gate reordering, unless it is a scalar or all zero (nothing PyTorch trains folds to those).
       A float buffer keeps its module path too and trains unless frozen (``frozen=["pe"]``):
       this exporter records nothing that tells it from a parameter (checked with its defaults,
       ``training=TRAINING``, ``export_modules_as_functions`` and ``keep_initializers_as_inputs``);
    3. ``gc.capture``: the buffers of its modules (``register_buffer``, a loss's class weights; the
       model's ``graphc.buffers``), which torch does not train either;
    4. any other producer: none (every float initializer is a parameter).
    """
    graph = model.graph
    buffers = set(model.metadata_props.get(BUFFERS_KEY, "").split(","))
    if buffers & set(names):
        return {n: "a buffer of a gc.nn module, not a parameter" for n in names if n in buffers}
    dynamo = SIGNATURE in graph.metadata_props or any(
        _KIND in graph.initializers[n].metadata_props for n in names)
    if dynamo:
        params = signature_targets(graph, "PARAMETER")
        params |= {n for n in names if graph.initializers[n].metadata_props.get(_KIND) == "PARAMETER"}
        return {n: why for n in names if (why := _dynamo_constant(graph.initializers[n], params))}
    if model.producer_name != _TORCH:
        return {}
    out = {}
    for n in names:
        tensor = graph.initializers[n].const_value
        if not n.startswith(_TORCHSCRIPT_FOLDED) or tensor is None:
            continue
        if tensor.size <= 1:
            out[n] = "a scalar computed by the TorchScript exporter"
        elif not tensor.numpy().any():
            out[n] = "all zero, computed by the TorchScript exporter"
    return out


def _dynamo_constant(value: ir.Value, params: set[str]) -> str | None:
    """Why the dynamo exporter's initializer ``value`` is a constant; None for a parameter."""
    kind = value.metadata_props.get(_KIND)
    if kind == "PARAMETER" or value.name in params:  # the name survives a BatchNorm fused into a Conv
        return None
    if kind is not None:
        return f"a {kind.lower().replace('_', ' ')} of the torch module, not a parameter"
    if _FOLDED_FROM in value.metadata_props:
        if _sources(value) & params:
            return None
        return "folded by the exporter from constants"
    return "made by the dynamo exporter (no module parameter behind it)"


def is_float(value: ir.Value) -> bool:
    return value.dtype in _FLOAT


_NORMALIZATIONS = frozenset({"LayerNormalization", "BatchNormalization", "GroupNormalization",
                             "InstanceNormalization", "RMSNormalization"})


def warn_shared_normalization_params(graph: ir.Graph, params: Sequence[str]) -> None:
    """One warning naming each trainable param that is the scale or bias of several
    normalization nodes, and those nodes."""
    shared = {}
    for name in params:
        users = [use.node.name for use in graph.initializers[name].uses()
                 if use.node.op_type in _NORMALIZATIONS and use.idx in (1, 2)]
        if len(users) > 1:
            shared[name] = users
    if shared:
        listed = "; ".join(f"{name!r} by {', '.join(map(repr, users))}" for name, users in shared.items())
        warnings.warn(
            f"one tensor is the scale or bias of several normalization nodes ({listed}): training updates each as "
            "one tensor. If they are separate layers in the source model, the exporter merged initializers with "
            "equal values (torch.onnx.export(..., dynamo=True) does unless optimize=False); export without that "
            "merge to train them apart.", UserWarning, stacklevel=4)


# ops whose weight the TorchScript exporter never re-lays out: one named ``onnx::Conv_<N>`` is
# computed from more than the Conv's own weight (a BatchNorm folded into it)
_COMPUTED_WEIGHTS = frozenset({"Conv", "ConvTranspose"})


def folded_parameters(model: ir.Model, params: Sequence[str], notes: Mapping[str, str] = {}) -> list[str]:
    """Descriptions of what the exporter's constant folding merged into the trainable ``params``,
    decided by the exporters' records and by the folded values (``notes``: {tensor: text added to
    its description}):

    1. dynamo: a parameter of the signature that is no initializer and no initializer's only
       source (``folded_from``): a BatchNorm's weight and bias fused into the Conv before it;
    2. TorchScript: a trainable ``onnx::<Op>_<N>`` initializer read by a Conv (the exporter
       re-lays out Linear and recurrent weights, never a Conv's), named with its readers (their
       names are module paths: ``/layer1/conv/Conv``);
    3. dynamo: a trainable tensor folded from parameters by an op other than one that moves
       their elements (``fold_records.functions``: ``sigmoid(gate)``, a weight norm, ``w * 0.5``);
    4. either: any other trainable tensor folded from a parameter (``folded_from`` naming one, or
       an ``onnx::`` name) whose nonzero values repeat: the parameter copied to several places (a
       relative position bias table gathered by constant indices), which the source model trains
       as one value and training here as several. A slice or a reordering copies each value once.
    """
    graph = model.graph
    found = []
    if SIGNATURE in graph.metadata_props:
        signature = signature_targets(graph, "PARAMETER")
        for name, fold in dynamo_folds(model, params).items():
            if fold.warned:
                found.append(f"{name!r} ({fold}{notes.get(name, '')})")
        sources = {name: _sources(value) for name, value in graph.initializers.items()}
        gone = signature - set(graph.initializers) - {s for group in sources.values() for s in group} \
            - _tied_parameters(graph, signature)
        gone = sorted(gone - _aliases(graph, gone))
        return found + ([f"parameters {', '.join(gone)} (folded into other tensors)"] if gone else [])
    if model.producer_name != _TORCH:
        return []
    for name in params:
        if name.startswith(_TORCHSCRIPT_FOLDED):
            readers = [use.node for use in graph.initializers[name].uses()]
            if _repeats(graph.initializers[name]) or any(node.op_type in _COMPUTED_WEIGHTS for node in readers):
                found.append(f"{name!r} (read by {', '.join(repr(n.name or n.op_type) for n in readers)})")
    return found


class Fold(NamedTuple):
    """A tensor a dynamo export's optimizer folded from the parameters ``params`` (sorted): made by
    the aten ``ops`` other than element moves (``fold_records.functions``), or by ``moves`` alone
    (in words) and then whether its nonzero values ``repeat`` (a table gathered to several places)."""

    params: list[str]
    ops: list[str]
    moves: str
    repeats: bool

    @property
    def warned(self) -> bool:
        """Whether it does not train as its parameters do (``warn_folded_parameters`` names it)."""
        return bool(self.ops) or self.repeats

    @property
    def moved(self) -> bool:
        """Whether it only moves the elements of one parameter: it trains as that one, and name
        patterns select it by that one's name."""
        return len(self.params) == 1 and not self.warned

    def __str__(self) -> str:
        if self.ops:
            return f"computed from {', '.join(self.params)} by {', '.join(self.ops)}"
        return f"copies of {', '.join(self.params)}" if self.repeats else f"{', '.join(self.params)}, {self.moves}"


def dynamo_folds(model: ir.Model, names: Iterable[str]) -> dict[str, Fold]:
    """The ``Fold`` of each initializer among ``names`` that a dynamo export's optimizer folded from
    parameters (its ``folded_from`` naming any in the signature); empty for other models."""
    graph = model.graph
    if SIGNATURE not in graph.metadata_props:
        return {}
    signature, inputs = signature_targets(graph, "PARAMETER"), signature_targets(graph, "[A-Z_]+")
    folds = {}
    for name in names:
        sources = _sources(graph.initializers[name])
        if sources & signature:
            ops = fold_records.functions(name, sources, inputs)
            folds[name] = Fold(sorted(sources & signature), ops, fold_records.moves(name, sources, inputs),
                               not ops and _repeats(graph.initializers[name]))
    return folds


def signature_targets(graph: ir.Graph, kind: str) -> set[str]:
    """The names a dynamo export's signature gives its inputs of ``kind`` (``PARAMETER``,
    ``BUFFER``): ``fc.weight``, ``bn.running_mean``; empty for other models."""
    return set(re.findall(rf"{kind} target='([^']+)'", graph.metadata_props.get(SIGNATURE, "")))


def module_path(node: ir.Node) -> str:
    """The module a dynamo export recorded ``node`` under (``emb``, ``layer1.0.bn1``), else "".
    The scopes are each a full path (``['', 'layer1', 'layer1.0', 'layer1.0.bn1', 'batch_norm']``)
    or each one name (``['', 'layer1', '0', 'bn1', ...]``)."""
    try:
        scopes = ast.literal_eval(node.metadata_props.get(_NAME_SCOPES, "[]"))
    except (ValueError, SyntaxError):
        return ""
    path = ""
    for scope in map(str, scopes[1:-1] if isinstance(scopes, list) else ()):
        path = scope if not path or scope.startswith(f"{path}.") else f"{path}.{scope}"
    return path


def _tied_parameters(graph: ir.Graph, signature: set[str]) -> set[str]:
    """Parameters of a dynamo export's ``signature`` kept as another's initializer because the
    source model ties them: a node of the parameter's module (its recorded name scopes) reads
    another module's initializer of the same attribute name, and so did torch.export's node it
    came from (its placeholder in the recorded ``fx_node``): the embedding ``0`` reads ``2.weight``
    (``%p_2_weight``). Equal values that onnxscript's optimizer merged read another placeholder
    there (``ln2`` reads ``ln1.weight`` where torch read ``%p_ln2_weight``): not a tie."""
    tied = set()
    for node in graph:
        module = module_path(node)
        read = set(re.findall(r"%(\w+)", node.metadata_props.get(FX_NODE, "")))
        for value in node.inputs:
            if value is None or not value.is_initializer() or value.name not in signature \
                    or value.metadata_props.get(_PLACEHOLDER) not in read:
                continue
            owner, _, attribute = value.name.rpartition(".")
            if module and owner != module and f"{module}.{attribute}" in signature:
                tied.add(f"{module}.{attribute}")
    return tied


def _aliases(graph: ir.Graph, gone: set[str]) -> set[str]:
    """The parameters among ``gone`` that are another name of a weight kept under its last one:
    torch.export lists every name of a module registered twice (T5's ``shared`` is its
    ``encoder.embed_tokens``) and keeps the tensor under the last. One is a parameter of a module
    no node ran under and with no buffer (a BatchNorm fused away leaves its statistics gone too),
    named before a kept initializer of the same attribute that another module's node reads (a
    tie: ``lm_head.weight`` read by the embedding)."""
    order = re.findall(r"(?:PARAMETER|BUFFER) target='([^']+)'", graph.metadata_props.get(SIGNATURE, ""))
    buffers = signature_targets(graph, "BUFFER")
    ran = {module_path(node) for node in graph}
    shared = {value.name for node in graph if (path := module_path(node)) for value in node.inputs
              if value is not None and value.is_initializer() and value.name.rpartition(".")[0] not in ("", path)}
    aliases = set()
    for name in gone:
        module, _, attribute = name.rpartition(".")
        later = order[order.index(name) + 1:] if name in order else []
        if module not in ran and not any(b.startswith(f"{module}.") for b in buffers) and any(
                n in shared and n.endswith(f".{attribute}") for n in later):
            aliases.add(name)
    return aliases


def _repeats(value: ir.Value) -> bool:
    """Whether a nonzero value occurs more than once in the initializer ``value``."""
    array = value.const_value.numpy().reshape(-1) if value.const_value is not None else np.zeros(0)
    nonzero = array[array != 0]
    return np.unique(nonzero).size < nonzero.size


def _sources(value: ir.Value) -> set[str]:
    """The names onnxscript's optimizer records as what it folded ``value`` from."""
    folded = value.metadata_props.get(_FOLDED_FROM)
    try:
        return set(ast.literal_eval(folded)) if folded else set()
    except (ValueError, SyntaxError):
        return set()


def warn_folded_parameters(model: ir.Model, params: Sequence[str], notes: Mapping[str, str] = {}) -> None:
    """One warning listing ``folded_parameters`` (``notes`` added) and how to export without the merge."""
    found = folded_parameters(model, params, notes)
    if found:
        warnings.warn(
            f"the exporter folded parameters into other tensors: {'; '.join(found)}. Training updates those tensors "
            "in their place, which does not train as the source model does (a BatchNorm fused into a Conv, a table "
            "gathered by constant indices, a function of a parameter such as sigmoid(gate) or a weight norm). Export "
            "without constant folding to train the model's own parameters: torch.onnx.export(..., dynamo=True, "
            "optimize=False) or torch.onnx.export(..., do_constant_folding=False).",
            UserWarning, stacklevel=4)
