"""torch's fused autocast kernels found in an exported graph: where ``torch.autocast`` rounds to the
low dtype once per kernel, not once per ONNX node (``autocast.py`` walks the graph with these roles).

``linear`` (torch.onnx writes a 3-D input's as MatMul + Add of the bias): torch rounds
``x @ W^T + bias`` once, the bias read in the low dtype; the MatMul rounding first moved the result
by up to 0.125 on N(0, 1) data of 16 features. ``scaled_dot_product_attention`` (written out:
q and k scaled by a scalar, MatMul, scaling and masking, Softmax, MatMul with v): torch's CPU flash
kernel scales and multiplies q and k in float32, takes the Softmax in float32 and multiplies the
unnormalized probabilities ``exp(s - max)``, rounded to the low dtype, by v before dividing by their
sum, rounding the output once; here ``exp(s - max)`` is ``p / max(p)`` and the division a product
with ``max(p) = 1 / sum``. Its backward is the kernel's (``FUSED_GRADIENT_KEY`` on the last Mul:
autodiff's ``rules_fused``), not the nodes'.
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.values import FUSED_GRADIENT_KEY

# the roles: ``ACCUMULATE``: a lowered op whose result stays float32 until its epilogue;
# ``EPILOGUE``: the node after it (the bias Add, attention's normalization) whose result torch rounds;
# ``SCORES``: attention's scores MatMul and ``SCALE`` the scalar scalings and moves of q and k before it,
# float32 on the low q and k
ACCUMULATE, EPILOGUE, SCORES, SCALE = "accumulate", "epilogue", "scores", "scale"

# what may lie between attention's scores MatMul and its Softmax: the scale, an additive or boolean mask
_SCORE_STEPS = frozenset({"Mul", "Div", "Add", "Sub", "Where"})
_MOVES = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze"})


def fused_roles(graph: ir.Graph, opset: int, lowered: frozenset[str]) -> tuple[dict[ir.Node, str], set[int]]:
    """The nodes of ``graph`` that are part of a fused kernel, by role, and the ids of the float32
    values the kernels keep unrounded (attention's ``1 / sum``); rewrites each attention's
    Softmax -> MatMul with v into the flash kernel's order (module docstring)."""
    roles: dict[ir.Node, str] = {}
    exact: set[int] = set()
    for node in list(graph):
        if node.op_type != "MatMul" or "MatMul" not in lowered:
            continue
        softmax = _scores_softmax(node)
        if softmax is not None:
            roles[node] = SCORES
            for index in range(2):
                roles.update(dict.fromkeys(_scale_chain(node, index), SCALE))
            flash = _flash(graph, opset, softmax)
            if flash is not None:
                roles.update(flash[0])
                exact.add(id(flash[1]))
        elif node not in roles:
            bias = _bias_add(node)
            if bias is not None:
                roles[bias] = EPILOGUE
                if not _permuted(node.inputs[0]):
                    roles[node] = ACCUMULATE
    return roles, exact


def _only_user(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _scores_softmax(node: ir.Node) -> ir.Node | None:
    """The Softmax ``node`` (a MatMul) reaches through scaling and masking alone, if any."""
    value = node.outputs[0]
    while (user := _only_user(value)) is not None:
        if user.op_type == "Softmax":
            return user
        if user.op_type not in _SCORE_STEPS:
            return None
        value = user.outputs[0]
    return None


def scalar(value: ir.Value | None) -> bool:
    """A Python number in torch's forward: one element, not a param (torch.onnx writes numbers,
    and numbers computed from shapes, as Constants and nodes of shape [] or [1])."""
    return value is not None and value.shape is not None and all(d == 1 for d in value.shape) and \
        not value.is_graph_input() and not value.is_initializer()


def _scale_chain(matmul: ir.Node, index: int) -> list[ir.Node]:
    """The moves and scalar Mul/Div that alone make ``matmul``'s input ``index`` from q (or k), up
    to the last scaling."""
    chain, scaled, user, value = [], 0, matmul, matmul.inputs[index]
    while (node := value.producer()) is not None and _only_user(value) is user:
        if node.op_type in ("Mul", "Div") and scalar(node.inputs[1]):
            value = node.inputs[0]
        elif node.op_type == "Mul" and scalar(node.inputs[0]):
            value = node.inputs[1]
        elif node.op_type in _MOVES:
            value = node.inputs[0]
        else:
            break
        chain.append(node)
        user = node
        scaled = len(chain) if node.op_type in ("Mul", "Div") else scaled
    return chain[:scaled]


def _permuted(value: ir.Value) -> bool:
    """Whether ``value`` (rank >= 3) is a Transpose's output that moves a dim not known to be 1: a
    permuted view in torch, which ``linear`` multiplies with ``matmul`` and rounds before adding
    the bias (``add_``), where it fuses a contiguous input's product and bias (``addmm``)."""
    node = value.producer()
    if node is None or node.op_type != "Transpose" or value.shape is None or len(value.shape) < 3:
        return False
    source = node.inputs[0].shape
    perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else list(range(len(value.shape)))[::-1]
    moved = [axis for axis in perm if source is None or source[axis] != 1]
    return moved != sorted(moved)


def _bias_add(node: ir.Node) -> ir.Node | None:
    """The Add of a rank-1 bias that alone reads ``node``'s (a MatMul's) result: linear's."""
    add = _only_user(node.outputs[0])
    if add is None or add.op_type != "Add":
        return None
    bias = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
    return add if bias is not None and bias.shape is not None and len(bias.shape) == 1 else None


def _flash(graph: ir.Graph, opset: int, softmax: ir.Node) -> tuple[dict[ir.Node, str], ir.Value] | None:
    """``Softmax -> MatMul(p, v)`` (softmax over the last axis) made ``MatMul(p / r, v) * r`` with
    ``r = ReduceMax(p)``: the MatMul accumulates, the Mul is its epilogue, r is kept float32; None
    when not that form."""
    p = softmax.outputs[0]
    matmul = _only_user(p)
    rank = None if p.shape is None else len(p.shape)
    axis = softmax.attributes["axis"].as_int() if "axis" in softmax.attributes else -1
    if matmul is None or matmul.op_type != "MatMul" or matmul.inputs[0] is not p or rank is None or \
            axis not in (-1, rank - 1):
        return None
    axes = {"axes": [-1]} if opset < 18 else {}
    extra = [] if opset < 18 else [ir.Value(name=f"{p.name}_max_axes", const_value=ir.tensor([-1]))]
    if extra:
        graph.initializers.add(extra[0])
    peak = ir.node("ReduceMax", [p, *extra], {**axes, "keepdims": 1}, name=f"{softmax.name}_max")
    unnormalized = ir.node("Div", [p, peak.outputs[0]], name=f"{softmax.name}_unnormalized")
    out = matmul.outputs[0]
    scaled = ir.node("Mul", [out, peak.outputs[0]], name=f"{matmul.name}_normalized",
                     metadata_props={FUSED_GRADIENT_KEY: "cpu_flash_attention"})
    for new, stem in ((peak, "max"), (unnormalized, "unnormalized")):
        new.outputs[0].name, new.outputs[0].type = f"{p.name}_{stem}", p.type
    new_shape = list(p.shape)
    new_shape[-1] = 1
    peak.outputs[0].shape, unnormalized.outputs[0].shape = ir.Shape(new_shape), p.shape
    graph.insert_after(softmax, [peak, unnormalized])
    matmul.replace_input_with(0, unnormalized.outputs[0])
    graph.insert_after(matmul, scaled)
    result = scaled.outputs[0]
    result.type, result.shape = out.type, out.shape
    take_place(graph, out, result, "unnormalized", readers="all")
    return {matmul: ACCUMULATE, scaled: EPILOGUE}, peak.outputs[0]


def take_place(graph: ir.Graph, old: ir.Value, new: ir.Value, suffix: str, readers: str) -> None:
    """``new`` read instead of ``old`` by the outputs of ``graph`` and, as ``readers`` says, by every node but
    ``new``'s own ("all"), by those of ``graph`` but ``new``'s own ("graph": subgraphs keep reading ``old``) or
    by none ("none"); ``new`` takes ``old``'s name, which passes and graph outputs find it by, and ``old`` is
    renamed ``<name>_<suffix>``."""
    if readers != "none":
        for use in list(old.uses()):
            if use.node is not new.producer() and (readers == "all" or use.node.graph is graph):
                use.node.replace_input_with(use.idx, new)
    for index, output in enumerate(graph.outputs):
        if output is old:
            graph.outputs[index] = new
    name = old.name
    old.name = f"{name}_{suffix}"
    new.name = name
