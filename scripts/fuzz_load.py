"""Fuzz the model loader at the command line: ``graphc inspect`` over N mutated model files.

    .venv/bin/python scripts/fuzz_load.py --count 4000 --seed 0

Each file is a mutation (truncation, bit flips, random external-data keys and values on any
tensor: graph, Constant, If branch, function, sparse initializer) of a model whose folder also
holds a symlink and a hard link to a sentinel outside it. The CLI runs in-process (its
console-script entry), so an exception escaping it is what a user would see as a traceback.
Outcomes are counted: loaded (exit 0), one-line error (exit 2), anything else (other exit
codes, tracebacks, multi-line errors), and opens of the sentinel (must be 0).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import random
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from model_fuzz import SEEDS, OpenAudit, mutate, sentinel_ids, write_seed  # noqa: E402

from graphc.cli import main  # noqa: E402


def run_inspect(path: Path) -> tuple[str, str]:
    """(outcome, detail) of ``graphc inspect PATH``."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main(["inspect", str(path)])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - this is what the fuzzer looks for
        return "traceback", traceback.format_exc().strip().splitlines()[-1]
    text = err.getvalue().strip()
    if code == 0:
        return "loaded", ""
    if code == 2 and len(text.splitlines()) == 1 and "Traceback" not in text:
        return "one-line error (exit 2)", text
    return f"exit {code}, {len(text.splitlines())} lines", text[-300:]


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    audit = OpenAudit.get()
    outcomes: collections.Counter[str] = collections.Counter()
    examples: dict[str, str] = {}
    messages: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        seeds = [write_seed(Path(tmp) / kind, kind) for kind in SEEDS]
        originals = [path.read_bytes() for path in seeds]
        audit.watch = set().union(*(sentinel_ids(Path(tmp) / kind) for kind in SEEDS))
        for i in range(args.count):
            k = i % len(seeds)
            seeds[k].write_bytes(mutate(originals[k], rng, seeds[k].parent.parent))
            outcome, detail = run_inspect(seeds[k])
            outcomes[outcome] += 1
            if outcome.startswith("one-line"):
                messages[detail.split(":", 3)[-1].strip()[:60]] += 1
            elif outcome != "loaded":
                examples.setdefault(outcome + ": " + detail[:160], f"case {i} ({SEEDS[k]})")
        audit.watch = set()
    elapsed = time.perf_counter() - start
    print(f"{args.count} fuzzed model files in {elapsed:.0f} s (seed {args.seed})")
    for outcome, n in outcomes.most_common():
        print(f"  {outcome:<28} {n}")
    print(f"  opens of the sentinel outside the folder: {len(audit.hits)}")
    for example, where in examples.items():
        print(f"  e.g. {where}: {example}")
    print("most frequent one-line errors:")
    for message, n in messages.most_common(12):
        print(f"  {n:5}  {message}")
    bad = sum(n for o, n in outcomes.items() if o not in ("loaded", "one-line error (exit 2)")) + len(audit.hits)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main_())
