"""The exceptions graphc raises. Each names the thing at fault and, where known, the source line; the
helpers their messages share (``first_few``, ``did_you_mean``)."""

from collections.abc import Sequence


class GraphcError(Exception):
    """Base class of every graphc error."""


class GraphError(GraphcError, ValueError):
    """A graph cannot be built, transformed or run as given. The base users catch; each failure
    family below is a subclass, so ``except gc.GraphError`` still catches all of them."""


class CaptureError(GraphError):
    """DSL code cannot be captured: shape/dtype mismatch, an op misused, a traced value used as a
    Python value. The message names the op, the values and the user's ``file.py:LINE``."""


class PassError(GraphError):
    """A graph-to-graph pass (optimize, autodiff, training graphs) cannot transform the graph."""


class PipelineError(PassError, RuntimeError):
    """An optimize pass broke its contract (changed the graph's interface): a bug in that pass."""


class InferenceError(PassError):
    """A node's inputs cannot go together (dims that do not broadcast, a dtype its op does not
    take). The DSL reports it as a ``CaptureError``; from a pass it is a bug in that pass."""


class AutodiffError(PassError):
    """The graph cannot be differentiated as asked: a non-float loss or parameter, an unsupported
    case of an op's gradient, or a gradient rule that broke its contract."""


class MissingGradientRule(AutodiffError, NotImplementedError):
    """An op on the path from a trainable parameter to the loss has no gradient rule."""


class MissingKernel(GraphError, NotImplementedError):
    """The numpy backend has no kernel for an op (or an attribute of it) the graph uses."""


class ModelLoadError(GraphcError, ValueError):
    """A file or buffer is not a usable ONNX model (corrupt, truncated, unsafe external data)."""


class ArtifactsError(GraphcError, ValueError):
    """A training-artifacts directory cannot be used: manifest missing, invalid or naming files outside it."""


class InputError(GraphcError, ValueError):
    """Feeds do not match a graph's inputs (missing, unknown, dtype, rank or fixed-dim mismatch)."""


class MissingDependency(GraphcError, ImportError):
    """An optional package a feature needs is not installed; the message says what to install."""


class BackendUnavailable(GraphcError, RuntimeError):
    """The requested backend cannot run here; the message says why."""


class BackendError(GraphcError, RuntimeError):
    """A backend failed while running a node; the message names node, op and source line."""


class RunCancelled(GraphcError, RuntimeError):
    """A run stopped because its ``CancelToken`` was cancelled (``graphc.backends.cancel``)."""


class TensorTooLarge(GraphcError, ValueError):
    """A run would make a tensor over its ``max_tensor_bytes``; names the node, the shape and the bytes."""


class RequestTooLarge(TensorTooLarge):
    """A run would hold more bytes of tensors at once than its ``max_request_bytes``; names where."""


class ServeError(GraphcError, OSError):
    """A server cannot start: its port is in use or its address cannot be bound."""


class PerformanceWarning(UserWarning):
    """Code runs correctly but much slower than it could, and says why (``gc.vmap`` falling back to a
    Scan over the examples for an op without a batching rule)."""


class DataParallelWarning(UserWarning):
    """Data-parallel workers may not compute what one process on the whole batch does, and say why
    (``gc.Trainer(workers=N)`` or ``gc.distributed.map_batches`` on a model whose forward mixes the batch's rows)."""


class UncalibratedWarning(UserWarning):
    """A fake quantization will quantize with its initial scale 1.0 and zero point 0: a ``gc.nn.FakeQuantize``
    captured in eval mode before its observer saw any data, so no graph of the capture ever runs it."""



def first_few(names: Sequence[str], shown: int = 3, sep: str = ", ", more: str = " and {} more") -> str:
    """The first ``shown`` of ``names`` joined by ``sep``, then ``more`` with the count of the others
    (``a, b, c and 4 more``; a ``more`` such as ``", ..."`` leaves the count out); all of them when no
    more than ``shown``. A message's list of what is at fault."""
    left = len(names) - shown
    return sep.join(names[:shown]) + (more.format(left) if left > 0 else "")


def did_you_mean(given: object, choices) -> str:
    """`` (did you mean 'numpy'?)`` where ``given`` is a near miss of one of ``choices``: at most one
    edit away (a letter missing, extra, wrong or two swapped), two for names over 4 letters, case
    aside (``nump``, ``NumPy``, ``adma``); else ``""``. The end of an "unknown NAME" message."""
    if not isinstance(given, str) or not given:
        return ""
    limit = 1 if len(given) <= 4 else 2
    # the fewest edits case aside, then the fewest with case: 'Nett' is 'Net', not 'net'
    scored = sorted((_edits(given.lower(), str(c).lower()), _edits(given, str(c)), str(c)) for c in choices)
    return f" (did you mean {scored[0][2]!r}?)" if scored and scored[0][0] <= limit else ""


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) turning ``a`` into ``b``."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb)))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]
