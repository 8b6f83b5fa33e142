"""The numpy reference backend: a planned interpreter over one readable kernel per ONNX op.

Kernels live by family (elementwise, reduction, linalg, conv, norm, resize, shape, indexing,
control, rnn, sequence) and register in ``kernels.KERNELS`` by op type and opset version.
"""

from graphc.backends.numpy.backend import NumpyBackend, NumpyExecutable, run_node
from graphc.backends.numpy.kernels import claimed_ops, lookup

__all__ = ["NumpyBackend", "NumpyExecutable", "claimed_ops", "lookup", "run_node"]
