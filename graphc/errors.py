"""The exceptions graphc raises. Each names the thing at fault and, where known, the source line."""


class GraphcError(Exception):
    """Base class of every graphc error."""


class GraphError(GraphcError, ValueError):
    """A graph cannot be built or used: shape/dtype mismatch, unknown op, no gradient rule."""


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


class ServeError(GraphcError, OSError):
    """A server cannot start: its port is in use or its address cannot be bound."""
