"""Third-party ONNX files shipped in PyPI wheels, through graphc: load, numpy-vs-onnxruntime
parity, ``gc.optimize -O3`` (its outputs against the original's on onnxruntime) and node counts
against onnxsim and onnxslim (``rivals.py``; nodes inside If/Loop bodies included).

The wheels are downloaded with pip into a temporary folder (``pip download --no-deps``), the
models read from them and nothing is kept; ``--wheels DIR`` reuses wheels already there.
PaddleOCR's classifier is also committed (tests/data/third_party, Apache-2.0) for the suite.

    .venv/bin/python scripts/third_party_sweep.py [--wheels DIR]

Prints one row per model: parity, -O3 error, node counts (original / gc / onnxsim / onnxslim).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import rivals

import graphc as gc

RNG = np.random.default_rng(0)


def _audio(_model) -> dict[str, np.ndarray]:
    """silero VAD: one 512-sample chunk at 16 kHz, a zero state."""
    return {"input": RNG.standard_normal((1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


def _image(height: int, width: int):
    def feeds(model) -> dict[str, np.ndarray]:
        return {model.inputs[0].name: RNG.standard_normal((2, 3, height, width)).astype(np.float32)}
    return feeds


# name -> (wheel requirement, path inside the wheel, feeds for the model, license)
MODELS = {
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", _audio, "MIT"),
    "silero_vad_16k_op15": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx", _audio, "MIT"),
    "paddleocr_cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                      _image(48, 192), "Apache-2.0"),
    "paddleocr_det_v4": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                         _image(64, 64), "Apache-2.0"),
}


def wheel(requirement: str, folder: Path) -> Path:
    """The wheel of ``requirement`` in ``folder``, downloaded there by pip when missing."""
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", str(folder), requirement], check=True)
        found = sorted(folder.glob(f"{stem}-*.whl"))
    return found[-1]


def _max_error(a: dict, b: dict) -> float:
    return max(float(np.abs(np.asarray(a[k], np.float64) - b[k]).max()) for k in a)


def row(name: str, folder: Path) -> str:
    requirement, member, make_feeds, _ = MODELS[name]
    with zipfile.ZipFile(wheel(requirement, folder)) as archive:
        proto = onnx.load_from_string(archive.read(member))
    model = gc.load(proto)
    feeds = make_feeds(model)
    on_ort = gc.Session(model, backend="ort-cpu").run(feeds)
    parity = _max_error(gc.Session(model, backend="numpy").run(feeds), on_ort)
    optimized = _max_error(gc.Session(gc.optimize(proto, 3), backend="ort-cpu").run(feeds), on_ort)
    counts = rivals.node_counts(proto)
    cells = [name, f"{parity:.1e}", f"{optimized:.1e}", str(rivals.count_nodes(proto.graph)),
             *(str(counts.get(tool, "-")) for tool in ("gc", "onnxsim", "onnxslim"))]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, help="a folder of wheels to reuse (and download into)")
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    args = parser.parse_args()
    print("| model | parity (numpy vs ort) | -O3 max error | nodes | gc -O3 | onnxsim | onnxslim |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.wheels or Path(scratch)
        for name in args.only:
            try:
                print(row(name, folder), flush=True)
            except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
                print(f"| {name} | ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:120]} |", flush=True)


if __name__ == "__main__":
    main()
