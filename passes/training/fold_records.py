"""What a dynamo export records about a tensor that onnxscript's optimizer (``optimize=True``)
folded from parameters, and whether training it in their place trains them as torch does.

The folded nodes are gone; the initializer keeps its last value's name and ``folded_from``: the
name of every value those nodes read, transitively. Those are the export's inputs (its signature's
targets: ``gate``, ``rel_index``), values the exporter made inside one op's conversion (``val_N``:
constants, Linear's transposed weight, an LSTM's reordered gates) and torch.export's node names,
each its aten op's name with a counter (``sigmoid``, ``t_1``, ``linalg_vector_norm``), shape and
index computations included (``zeros`` read by an LSTM's conversion for its size). The source
parameter's values and shape are not kept.

A tensor that only moves each element of its parameters to one place (transpose, reshape,
squeeze, slice, concatenation) or negates it trains as they do: its gradient is theirs moved
alike, and SGD, Adam(W) and their kin step and decay each element on its own, odd in its
gradient. Any other function does not: ``c * w`` steps ``c * w`` by Adam's step rather than ``c``
times it (SGD: ``c**2`` times), and ``sigmoid(gate)`` or a weight norm ``g * v / ||v||`` move in
directions torch never takes. A gather by constant indices moves each element once unless indices
repeat; those indices may have been computed by any op (T5's relative position buckets), so a
fold with a gather is judged by its values (``imports.folded_parameters``).
"""

from __future__ import annotations

import re
from collections.abc import Collection

# aten ops that read a tensor by indices; a fold with one of them is judged by its values
_GATHERS = frozenset({"index", "embedding", "index_select", "gather", "take"})
# aten ops whose output holds their input's elements, each once (or, for expand, several times:
# caught by the values), or negated, by what they do in words: "val_6 (fc.weight, transposed)"
_MOVE_WORDS = {"transposed": {"t", "transpose", "permute", "numpy_T", "movedim"},
               "reshaped": {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze"},
               "sliced": {"slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind", "getitem"},
               "concatenated": {"cat", "stack"}, "expanded": {"expand"}, "negated": {"neg"},
               "copied": {"clone", "alias", "contiguous"}}
_MOVES = frozenset().union(*_MOVE_WORDS.values())
# aten ops that make a tensor from nothing but sizes: constants (an LSTM's zero state, read for its shape)
_MADE = frozenset({"zeros", "ones", "full", "empty", "arange", "zeros_like", "ones_like", "full_like",
                   "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "scalar_tensor",
                   "lift_fresh_copy"})
_EXPORTER_VALUE = re.compile(r"val_\d+")
_COUNTER = re.compile(r"_\d+$")


def functions(name: str, folded_from: Collection[str], inputs: Collection[str]) -> list[str]:
    """The aten ops (sorted) that make the folded tensor ``name`` other than a moved copy of the
    parameters it was folded from (``folded_from``), so that it does not train as they do; empty
    when it only moves their elements or when it gathers (then its values decide). ``inputs``: the
    export's signature targets."""
    ops = _ops(name, folded_from, inputs)
    if ops & _GATHERS:
        return []
    return sorted(ops - _MOVES - _MADE)


def moves(name: str, folded_from: Collection[str], inputs: Collection[str]) -> str:
    """The element moves recorded as making the folded tensor ``name``, in words (``"transposed,
    reshaped"``); ``"re-laid out by the exporter"`` where none is (only the exporter's own values:
    a Linear's weight transposed by its conversion, an LSTM's gates reordered)."""
    ops = _ops(name, folded_from, inputs)
    words = [word for word, group in [*_MOVE_WORDS.items(), ("gathered", _GATHERS)] if ops & group]
    return ", ".join(words) or "re-laid out by the exporter"


def _ops(name: str, folded_from: Collection[str], inputs: Collection[str]) -> set[str]:
    """The aten ops among the names ``name`` and ``folded_from`` (the export's ``inputs`` and the
    exporter's ``val_N`` values left out), each without its counter."""
    return {_COUNTER.sub("", n) for n in {name, *folded_from} if n not in inputs and not _EXPORTER_VALUE.fullmatch(n)}
