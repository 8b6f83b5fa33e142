"""The shape numpy gives nested lists of numbers, worked out from the lists' lengths alone (so a large
nested JSON array parsed a slice at a time is shaped, or refused as ragged, as ``np.asarray`` of the
whole parse's lists is, with numpy's own message), following numpy's depth-first shape discovery."""

from __future__ import annotations

import numpy as np

# numpy's limit on dims (NPY_MAXDIMS), where discovery starts.
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


class Ragged:
    """Nested lists numpy refuses as ragged: as data, ``np.asarray`` of it raises numpy's ValueError."""

    def __init__(self, message: str):
        self.message = message

    def __array__(self, dtype=None, copy=None):
        raise ValueError(self.message)


class _Discovery:
    """numpy's discovery state: the dims found so far, how many of them hold, and whether one list's
    length or depth differed from the first's."""

    def __init__(self):
        self.ndim, self.shape, self.reached, self.ragged = MAX_DIMS, [0] * MAX_DIMS, False, False

    def update(self, depth: int, size: int | None) -> bool:
        """A list of ``size`` items (None: an element) met at ``depth``."""
        new = [] if size is None else [size]
        ok, reached = True, self.reached
        if depth + len(new) > self.ndim:
            ok, new = False, new[:self.ndim - depth]
        elif size is None and self.ndim != depth:
            self.ndim, ok = depth, not reached
        for i, dim in enumerate(new):
            if not reached:
                self.shape[depth + i] = dim
            elif dim != self.shape[depth + i]:
                ok = False
                self.ndim = depth if size is not None else self.ndim - (len(new) - i)
                break
        if size is None:
            self.reached = True
        self.ragged = self.ragged or not ok
        return ok

    def visit(self, node: list | int, sizes: list[int], depth: int) -> None:
        """Walk ``node`` (a list of nodes, or a row's index into ``sizes``) at ``depth``."""
        size = sizes[node] if isinstance(node, int) else len(node)
        if not self.update(depth, size):
            return
        if size == 0:
            self.reached, self.ndim = True, depth + 1
        elif isinstance(node, int):
            self.update(depth + 1, None)  # its elements: the first says all the others would
        else:
            for child in node:
                self.visit(child, sizes, depth + 1)


def numpy_shape(tree: list | int, sizes: list[int]) -> tuple[int, ...] | Ragged:
    """The shape of ``np.asarray`` of the nested lists ``tree`` (lists of nodes; a list of elements is
    an index into ``sizes``, its length), or ``Ragged`` with numpy's message where it refuses them."""
    discovery = _Discovery()
    discovery.visit(tree, sizes, 0)
    shape = tuple(discovery.shape[:discovery.ndim])
    if discovery.ragged:
        return Ragged(f"setting an array element with a sequence. The requested array has an inhomogeneous shape "
                      f"after {discovery.ndim} dimensions. The detected shape was {shape} + inhomogeneous part.")
    return shape
