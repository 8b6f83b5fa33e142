"""The numpy reference backend: a planned interpreter over one readable kernel per ONNX op.

Kernels live by family (elementwise, reduction, linalg, conv, norm, resize, shape, indexing,
control, rnn, sequence, losses, attention, quantize, random, image, signal) and register in
``kernels.KERNELS`` by op type and opset version; ``interpreter.Plan`` plans a graph once and
runs it; ``backend.NumpyBackend`` is the ``Backend``; ``run_node`` evaluates one node eagerly.

    exe = NumpyBackend().prepare(model_proto, seed=0)
    exe.run({"x": x}, outputs=["y", "some/intermediate"])
"""

from graphc.backends.numpy.backend import NumpyBackend, NumpyExecutable, run_node
from graphc.backends.numpy.kernels import claimed_ops, lookup

__all__ = ["NumpyBackend", "NumpyExecutable", "claimed_ops", "lookup", "run_node"]
