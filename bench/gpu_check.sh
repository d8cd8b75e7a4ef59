#!/usr/bin/env bash
# The CUDA path's first meeting with a GPU (issue 15), in one run of under 8 minutes on an
# H200: devices, the launch-limit configs, recovery after a fatal kernel, short-kernel
# timing, a 200-trial embedded tuning of a ResNet-50 3x3 conv, and a tuned ResNet-50
# build against onnxruntime's CUDA provider or PyTorch+cuDNN. Writes one table.
#
#   bench/gpu_check.sh              # on the GPU machine (pycuda's wheel carried there)
#   bench/gpu_check.sh --dry-run    # anywhere: every step up to the first that needs a GPU
#
# Fetches nothing: what the GPU machine lacks travels in .whl/ (made here by
# bench/gpu_wheels.sh: the project's wheels and pycuda's source, which step 'install'
# builds there against its CUDA); with no .whl/, pycuda must already import.
# Env: DRY_RUN=1 (as --dry-run), PYTHON (default .venv/bin/python, else python3),
# GPU_CHECK_OUT (default $OUT/gpu_check when $OUT is set, else /tmp/gpu_check),
# DEVICE (default cuda:0), TRIALS (default 200), BUDGET_S (default 470: each step's
# limit is cut to what is left of it, and a step with under 10 s left is skipped).
set -u
cd "$(dirname "$0")/.."

DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        *) echo "usage: bench/gpu_check.sh [--dry-run]" >&2; exit 64 ;;
    esac
done
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
DEVICE=${DEVICE:-cuda:0}
TRIALS=${TRIALS:-200}
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-470} ))
DIR=${GPU_CHECK_OUT:-${OUT:+$OUT/gpu_check}}
DIR=${DIR:-/tmp/gpu_check}
mkdir -p "$DIR"
TABLE="$DIR/table.md"
DB="sqlite:///$DIR/tune.db"
RESNET_3X3='[["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],[1,1,1,1],[1,1],"float32"]'
export PYTHONUNBUFFERED=1
rm -f "$DIR/tune.db" "$DIR/tune.db.tokens.json"
printf '| step | result | seconds | summary |\n| --- | --- | --- | --- |\n' >"$TABLE"
FAILED=0

TUNER=("$PYTHON" -m cli.main)  # `tuner`, from this checkout

# step NAME LIMIT_S CMD...: runs CMD under a time limit (cut to the budget left), its
# output in $DIR/NAME.log, and adds a table row (the summary is CMD's last line, or its
# last that matches the regex $PICK when the caller sets it).
step() {
    local name=$1 limit=$2 start rc summary left
    shift 2
    echo "== $name"
    left=$(( DEADLINE - $(date +%s) ))
    if [ "$left" -lt 10 ]; then
        echo "skipped: the ${BUDGET_S:-470} s budget is spent"
        printf '| %s | SKIPPED | 0 | the budget is spent |\n' "$name" >>"$TABLE"
        FAILED=1
        return 1
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$DIR/$name.log" 2>&1
    rc=$?
    cat "$DIR/$name.log"
    summary=$(grep -E "${PICK:-[^[:space:]]}" "$DIR/$name.log" | tail -n 1 | tr '|' '/' |
        cut -c1-200)
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && summary="timed out after ${limit} s; $summary"
    if [ "$rc" -eq 0 ]; then local result=ok; else local result="FAIL ($rc)"; FAILED=1; fi
    printf '| %s | %s | %s | %s |\n' "$name" "$result" "$(( $(date +%s) - start ))" \
        "$summary" >>"$TABLE"
    return "$rc"
}

finish() {
    echo
    echo "== table ($TABLE)"
    cat "$TABLE"
    exit "$1"
}

# the table, then one line of specs and targets (the table's summary)
# The carried wheels into a site folder of their own (never the image's environment);
# pycuda links the driver's libcuda and builds with the image's nvcc
if [ -d .whl ] && [ "$DRY_RUN" != 1 ]; then
    SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
    step install 240 bash -c 'set -e
        "$1" -m pip install -q --no-index --no-deps --no-compile --target "$2" .whl/*.whl
        LIBRARY_PATH="/usr/local/nvidia/lib64:/usr/local/cuda/lib64/stubs:${LIBRARY_PATH:-}" \
            "$1" -m pip install -q --no-index --no-deps --no-build-isolation \
            --target "$2" .whl/pycuda-*.tar.gz
        echo "installed $(ls .whl | wc -l) carried packages into $2"' _ "$PYTHON" "$SITE" ||
        finish 1
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

step devices 30 bash -c 'set -o pipefail; "$@" devices && "$@" devices --json |
    "$1" -c "import json, sys; print(\", \".join(d[\"spec\"] + \" \" + d[\"target\"]
                                          for d in json.load(sys.stdin)))"' _ "${TUNER[@]}"
step plan 60 "$PYTHON" -m bench.gpu_check plan "$DIR" || finish 1

# Everything from here needs a CUDA GPU through pycuda.
if [ "$DRY_RUN" = 1 ]; then
    echo "DRY RUN: stopping at step 'cuda', the first that needs a GPU (pycuda and $DEVICE)"
    printf '| cuda | dry run | 0 | stopped: the steps from here need a GPU |\n' >>"$TABLE"
    finish "$FAILED"
fi
step cuda 30 "$PYTHON" -m bench.gpu_check cuda || {
    echo "stopping: the CUDA steps need pycuda and a GPU (nothing is installed by this script)"
    finish 1
}
step limits 60 "$PYTHON" -m bench.gpu_check limits "$DEVICE"
step recovery 60 "$PYTHON" -m bench.gpu_check recovery "$DEVICE"
step timing 45 "$PYTHON" -m bench.gpu_check timing "$DEVICE"
PICK=' done: ' step tune 200 "${TUNER[@]}" tune --target cuda --device "$DEVICE" \
    --template conv2d_nchw.cuda --args "$RESNET_3X3" --trials "$TRIALS" --database-url "$DB"
# ResNet-50 with the tuned conv's best config (template defaults elsewhere)
PICK='^latency:' step compile 90 "${TUNER[@]}" compile "$DIR/resnet50.onnx" --target cuda \
    --device "$DEVICE" --database-url "$DB" --benchmark
step baseline 45 "$PYTHON" -m bench.gpu_check baseline "$DIR/resnet50.onnx"
finish "$FAILED"
