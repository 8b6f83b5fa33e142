"""Run onnx's own node test cases against a graphc backend and print pass/fail per op type.

    python scripts/node_suite.py numpy            # or ort-cpu, ort-cuda
    python scripts/node_suite.py numpy --op Conv --op Resize --show-failures

Cases are generated in memory by onnx (``load_model_tests(kind="node")``). A case is "skip"
when it is on ``graphc.backends.conformance.EXCLUDED`` (exotic dtypes, random ops, strings);
"fail" means wrong values or dtype, "error" means the backend raised (for the numpy backend
mostly: an op it does not implement).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from rich.console import Console
from rich.table import Table

from graphc.backends.conformance import backend_class, case_op_types, excluded, load_node_cases, run_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=["numpy", "ort-cpu", "ort-cuda"])
    parser.add_argument("--op", action="append", help="only these op types (repeatable)")
    parser.add_argument("--show-failures", action="store_true", help="list every failing case")
    args = parser.parse_args(argv)

    console = Console()
    start = time.perf_counter()
    backend = backend_class(args.backend)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    cases = load_node_cases()
    ops = case_op_types(cases)
    for case in cases:
        op = ops[case.name]
        if args.op and op not in args.op:
            continue
        if excluded(case.name, args.backend):
            counts[op]["skip"] += 1
            continue
        result = run_case(backend, case, op)
        counts[op][result.status] += 1
        if result.status != "pass":
            failures.append(result)

    table = Table(title=f"onnx node cases on graphc backend {args.backend!r}")
    # expanded cases (the op's function body in primitive ops) count for the op they expand
    for col in ("op type", "pass", "fail", "error", "skip"):
        table.add_column(col, justify="left" if col == "op type" else "right")
    totals: collections.Counter = collections.Counter()
    for op in sorted(counts):
        c = counts[op]
        totals.update(c)
        style = "green" if c["fail"] + c["error"] == 0 else ("red" if c["pass"] == 0 else "yellow")
        table.add_row(op, str(c["pass"]), str(c["fail"]), str(c["error"]), str(c["skip"]), style=style)
    table.add_section()
    table.add_row("TOTAL", *(str(totals[k]) for k in ("pass", "fail", "error", "skip")), style="bold")
    console.print(table)
    ran = totals["pass"] + totals["fail"] + totals["error"]
    console.print(f"{totals['pass']}/{ran} run cases pass ({totals['skip']} skipped as excluded) "
                  f"in {time.perf_counter() - start:.1f} s")
    if args.show_failures:
        for r in failures:
            console.print(f"[{'red' if r.status == 'error' else 'yellow'}]{r.status}[/] {r.name}: {r.message}",
                          markup=True, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
