#!/usr/bin/env bash
# graphc's CUDA half, measured in one command on a bare GPU machine that reaches no package index.
#
#   bash scripts/gpu_check.sh --wheels    # here, with PyPI: build wheelhouse/ (git-ignored) to carry
#   bash scripts/gpu_check.sh --dry-run   # here, no GPU: the plumbing (caps, skips, summary) on the CPU
#   bash scripts/gpu_check.sh             # there: the device command below
#
# The device command (one call; wheelhouse/ built first, and under the 64 MiB that travel):
#   run(command="bash scripts/gpu_check.sh", carry=["wheelhouse"], timeout_s=570)
#
# There it uses the image's python3 (GPU_CHECK_PYTHON to change): installs the carried wheels
# (graphc's requirements the image lacks or has at another version) into /tmp/gpu_site and graphc
# itself (built from this tree) into /tmp/gpu_graphc, both put first on PYTHONPATH; writes
# env.txt (nvidia-smi, pip list, graphc's unmet requirements, ort-cuda's probe). Then, each part
# under its own cap (GPU_CHECK_CAP_PROBE, _TESTS, _BENCH, _GRAPH; seconds) and all within
# GPU_CHECK_BUDGET (default 540 s) so one stuck part cannot eat the rest:
#   probe  scripts/gpu_probe.py: the features added since a GPU last ran, ort-cuda against ort-cpu
#   tests  pytest -m cuda over the test files that hold CUDA tests (-n 8 with xdist; stops after 5
#          failures, not -x: one lent run should show more than the first)
#   bench  scripts/bench_zoo.py --device cuda --models resnet18,gpt --batches 2,32 (JSON after each row)
#   graph  the same with --cuda-graph
# A part whose needs are missing is skipped with the reason (no ort-cuda: no probe, tests, bench or graph;
# no torch CUDA: no bench or graph). $OUT gets at most 8 files: summary.txt, env.txt, probe.txt,
# probe.json, tests.txt, bench.txt, bench_zoo.json, bench_zoo_graph.json; summary.txt is printed last.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
WHEELS=$ROOT/wheelhouse
# graphc's requirements that the machine's image lacks, or holds at a version outside graphc's
# range (onnx-ir 1.0.0), per /work/.library/device/KINDS.md; setuptools builds graphc (>=77) and
# typing_extensions is what pydantic-core wants. Pinned to the versions installed here.
CARRIED="onnx-ir pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi starlette
uvicorn httptools setuptools"
# Not carried: onnxruntime-gpu, whose cp312 wheel (1.31.1) is 244 MiB, 284 MB of it the CUDA provider
# whose kernels are compressed already (xz -9e leaves 20 MB of them 16-21 MB): no call carries it.

usage() { echo "usage: bash scripts/gpu_check.sh [--dry-run | --wheels]" >&2; exit 2; }
MODE=device
case "${1:-}" in
    "") ;;
    --dry-run) MODE=dry ;;
    --wheels) MODE=wheels ;;
    *) usage ;;
esac

# -- --wheels: the wheelhouse, built here -------------------------------------------------------
if [ "$MODE" = wheels ]; then
    PY=${GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
    rm -rf "$WHEELS" && mkdir -p "$WHEELS" || exit 1
    target=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    pins=$("$PY" -c 'import sys; from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' $CARRIED) || exit 1
    echo "pinned to this environment: $pins"
    "$PY" -m pip download -q "${target[@]}" -d "$WHEELS" $pins || exit 1
    du -b "$WHEELS"/* | sort -n
    total=$(( $(du -sb "$WHEELS" | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
    echo "wheelhouse plus tracked files: $((total / 1048576)) MiB of the 64 MiB a device call carries"
    echo "not carried: onnxruntime-gpu (244 MiB); ort-cuda runs only where the image's onnxruntime has CUDA"
    exit 0
fi

# -- the check -------------------------------------------------------------------------------------
if [ "$MODE" = dry ]; then
    PY=${GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
    OUT=${OUT:-$ROOT/out/gpu_check}
else
    PY=${GPU_CHECK_PYTHON:-python3}
    OUT=${OUT:?OUT: the folder whose files come back}
fi
mkdir -p "$OUT" || exit 1
BUDGET=${GPU_CHECK_BUDGET:-540}
RESERVE=10  # seconds kept for the summary
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - SECONDS - RESERVE)); }

# part NAME CAP LOG CMD...: CMD under `timeout` (its whole process group), capped by what is
# left of the budget; its output to LOG; one line to the summary: ok, FAILED rc, or TIMEOUT.
part() {
    local name=$1 cap=$2 log=$3 rc start
    shift 3
    if [ "$(left)" -lt 5 ]; then say "SKIP $name: $(left)s of the ${BUDGET}s budget left"; return 1; fi
    if [ "$(left)" -lt "$cap" ]; then cap=$(left); fi
    echo "== $name (cap ${cap}s): $*" | tee -a "$log"
    start=$SECONDS
    timeout -k 5 "$cap" "$@" >>"$log" 2>&1
    rc=$?
    case $rc in
        0) say "ok   $name: $((SECONDS - start))s" ;;
        124 | 137) say "TIMEOUT $name: stopped at its cap of ${cap}s" ;;
        *) say "FAILED $name: exit $rc after $((SECONDS - start))s (log: $(basename "$log"))" ;;
    esac
    return $rc
}

say "gpu_check ($MODE) $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET}s"
{
    echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi: not found"
    echo "== python"; command -v "$PY"; "$PY" -VV
    echo "== pip list"; "$PY" -m pip list 2>&1
} >"$OUT/env.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
say "gpu: ${gpu:-none (no nvidia-smi or no device)}"

# graphc and the carried wheels, first on PYTHONPATH (the image's own packages stay as they are)
if [ "$MODE" = dry ]; then
    say "SKIP install: --dry-run uses $PY as it is"
else
    site=/tmp/gpu_site
    rm -rf "$site" /tmp/gpu_graphc && mkdir -p "$site"
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        part install-wheels 60 "$OUT/env.txt" "$PY" -m pip install -q --no-index --no-deps --no-compile \
            --no-cache-dir --target "$site" "$WHEELS"/*.whl
    else
        say "SKIP install-wheels: no wheelhouse/ carried (bash scripts/gpu_check.sh --wheels here, carry it)"
    fi
    if [ -f "$WHEELS/ort-gpu.tar.xz" ]; then
        part install-ort-gpu 60 "$OUT/env.txt" tar -C "$site" -xJf "$WHEELS/ort-gpu.tar.xz"
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    part install-graphc 90 "$OUT/env.txt" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
        --no-compile --target /tmp/gpu_graphc .
    export PYTHONPATH=/tmp/gpu_graphc:$PYTHONPATH
fi

facts=$(timeout 120 "$PY" scripts/gpu_env.py 2>&1)
echo "$facts" >>"$OUT/env.txt"
echo "$facts" | grep -v '=' | tee -a "$SUMMARY"
flag() { echo "$facts" | sed -n "s/^$1=//p"; }
ORT_CUDA=$(flag ORT_CUDA) TORCH_CUDA=$(flag TORCH_CUDA) XDIST=$(flag XDIST)

# probe: on ort-cuda, or (--dry-run) its CPU form, ort-cpu against numpy
if [ "$ORT_CUDA" = 1 ] || [ "$MODE" = dry ]; then
    probe=(); [ "$MODE" = dry ] && probe=(--cpu)
    part probe "${GPU_CHECK_CAP_PROBE:-90}" "$OUT/probe.txt" "$PY" scripts/gpu_probe.py "${probe[@]}" \
        --json "$OUT/probe.json"
    grep -E '^(PASS|FAIL|SKIP) ' "$OUT/probe.txt" | sed 's/^/  /' >>"$SUMMARY"
else
    say "SKIP probe: ort-cuda unusable (see above)"
fi

# tests: those marked cuda, from the files that hold them
if [ "$ORT_CUDA" = 1 ] || [ "$MODE" = dry ]; then
    mapfile -t files < <(grep -lE 'mark\.cuda|on_cuda|CUDA_MARKS|backend_params' tests/test_*.py)
    xdist=(-p no:xdist -o addopts=); [ "$XDIST" = 1 ] && xdist=(-n "${GPU_CHECK_WORKERS:-8}")
    part tests "${GPU_CHECK_CAP_TESTS:-180}" "$OUT/tests.txt" "$PY" -m pytest -m cuda --maxfail=5 -q -rfE \
        -p no:cacheprovider "${xdist[@]}" "${files[@]}"
    grep -E '^(FAILED|ERROR) |(passed|failed|skipped|deselected|error)s? in ' "$OUT/tests.txt" | tail -8 |
        sed 's/^/  /' >>"$SUMMARY"
    [ "$ORT_CUDA" = 1 ] || say "  (--dry-run without ort-cuda: every CUDA test skips)"
else
    say "SKIP tests: ort-cuda unusable (see above): every CUDA test would skip"
    if echo "$facts" | grep -q "no CUDA provider in this onnxruntime build"; then
        say "  (onnxruntime-gpu's wheel, 244 MiB, is past the 64 MiB a call carries: the image's onnxruntime must have it)"
    fi
fi

# bench: graphc's train step on ort-cuda against PyTorch on cuda, then with CUDA graphs
bench=(scripts/bench_zoo.py --device cuda --models resnet18,gpt --batches 2,32 --rounds 3)
for mode in bench graph; do
    if [ "$ORT_CUDA" != 1 ] || [ "$TORCH_CUDA" != 1 ]; then
        say "SKIP $mode: needs ort-cuda (usable: ${ORT_CUDA:-0}) and torch CUDA (usable: ${TORCH_CUDA:-0})"
        continue
    fi
    if [ "$mode" = bench ]; then
        part bench "${GPU_CHECK_CAP_BENCH:-150}" "$OUT/bench.txt" "$PY" "${bench[@]}" --json "$OUT/bench_zoo.json"
    else
        part graph "${GPU_CHECK_CAP_GRAPH:-150}" "$OUT/bench.txt" "$PY" "${bench[@]}" --cuda-graph \
            --json "$OUT/bench_zoo_graph.json"
    fi
done
[ -f "$OUT/bench.txt" ] && grep -E '^(== |[a-z0-9_]+ batch [0-9]+: )' "$OUT/bench.txt" | sed 's/^/  /' >>"$SUMMARY"

say "done in ${SECONDS}s; files: $(cd "$OUT" && ls | tr '\n' ' ')"
echo "================ summary"
cat "$SUMMARY"
