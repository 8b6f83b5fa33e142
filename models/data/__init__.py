"""The small data set shipped with graphc: ``load_digits()`` works from any working directory."""

from __future__ import annotations

from importlib import resources

import numpy as np

__all__ = ["load_digits"]


def load_digits() -> dict[str, np.ndarray]:
    """scikit-learn's handwritten digits (1,797 8x8 images as float32[64], labels int64):
    ``x_train``/``y_train`` (1,438) and ``x_test``/``y_test`` (359)."""
    with resources.as_file(resources.files(__name__) / "digits.npz") as path:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
