"""Write models/data/digits.npz from scikit-learn's handwritten-digits set (run once, by hand).

scikit-learn is not a graphc dependency: the demo and tests read the committed .npz, so no
download or extra package is needed at run time. Re-running this script gives the same file.

    .venv/bin/pip install scikit-learn && .venv/bin/python scripts/make_digits.py

Contents (no pickle; load with ``np.load(path, allow_pickle=False)``):
    x_train float32[N_train, 64]  pixel intensities scaled from 0..16 to [0, 1], 8x8 flattened
    y_train int64[N_train]        class labels 0..9
    x_test  float32[N_test, 64]
    y_test  int64[N_test]
The split is a fixed, class-stratified 80/20 split drawn with seed 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parent.parent / "models" / "data" / "digits.npz"
TEST_FRACTION = 0.2
SEED = 0


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def main() -> None:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # [1797, 64], values 0..16 -> [0, 1]
    y = digits.target.astype(np.int64)
    train, test = stratified_split(y, TEST_FRACTION, SEED)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])
    print(f"wrote {OUT}: {len(train)} train, {len(test)} test images")


if __name__ == "__main__":
    main()
