#!/usr/bin/env bash
# The CUDA path's first meeting with a GPU (issue 15), in one run of under 9 minutes on an
# H200: devices, the launch-limit configs, recovery after a fatal kernel, short-kernel
# timing, a 200-trial embedded tuning of a ResNet-50 3x3 conv, and a tuned ResNet-50
# build against onnxruntime's CUDA provider or PyTorch+cuDNN. Writes one table.
#
#   bench/gpu_check.sh              # on the GPU machine (pycuda's wheel carried there)
#   bench/gpu_check.sh --dry-run    # anywhere: every step up to the first that needs a GPU
#
# Fetches nothing: what the GPU machine lacks travels in .whl/ (made here by
# bench/gpu_wheels.sh: the project's wheels and pycuda's source, which step 'install'
# builds there against its CUDA). .whl/ is git-ignored: the device tool's run must name
# it, run(command="bench/gpu_check.sh", carry=[".whl"]); with no .whl/ there, pycuda
# must already import. The whole run, install included, keeps within BUDGET_S (540 s:
# the device tool allows 600 s a command); the install takes at most INSTALL_S (240 s).
# Env: DRY_RUN=1 (as --dry-run), PYTHON (default .venv/bin/python, else python3),
# GPU_CHECK_OUT (default $OUT/gpu_check when $OUT is set, else /tmp/gpu_check),
# DEVICE (default cuda:0), TRIALS (default 200), BUDGET_S (default 540: each step's
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
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))
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
        echo "skipped: the ${BUDGET_S:-540} s budget is spent"
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

# The carried wheels into a site folder of their own (never the image's environment),
# and pycuda built from its carried source against the machine's CUDA: configured
# without cuRAND (nothing here uses it, and its library would need to be on the loader
# path), compiled on every core, used in place (at most INSTALL_S of the budget).
if [ -d .whl ] && [ "$DRY_RUN" != 1 ]; then
    SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
    step install "${INSTALL_S:-240}" bash -c 'set -e
        python=$1 site=$2
        include=$("$python" -c "import sysconfig; print(sysconfig.get_paths()[\"include\"])")
        [ -f "$include/Python.h" ] || { echo "no Python.h in $include: pycuda cannot build"; exit 1; }
        command -v g++ >/dev/null || { echo "no g++: pycuda cannot build"; exit 1; }
        nvcc=$(command -v nvcc) || { echo "no nvcc on PATH: pycuda cannot build"; exit 1; }
        "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
            .whl/*.whl
        rm -rf "$site/pycuda-src" && mkdir -p "$site/pycuda-src"
        tar -xzf .whl/pycuda-*.tar.gz -C "$site/pycuda-src" --strip-components=1
        cd "$site/pycuda-src"
        root=""  # where cuda.h is: nvcc may be a wrapper script outside the toolkit
        for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(dirname "$(dirname "$(readlink -f "$nvcc")")")" \
                /usr/local/cuda; do
            [ -n "$dir" ] && [ -f "$dir/include/cuda.h" ] && { root=$dir; break; }
        done
        [ -n "$root" ] || { echo "no CUDA toolkit with include/cuda.h found"; exit 1; }
        "$python" configure.py --cuda-root="$root" --no-cuda-enable-curand >/dev/null
        # setuptools first: Python 3.12 has no distutils of its own
        LIBRARY_PATH="/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}" \
            PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "import runpy, sys, setuptools
sys.argv = [\"setup.py\", *sys.argv[1:]]
runpy.run_path(\"setup.py\", run_name=\"__main__\")" -q build_ext --inplace -j "$(nproc)"
        echo "installed $(ls "$OLDPWD/.whl" | wc -l) carried packages into $site, pycuda built"
        ' _ "$PYTHON" "$SITE" || finish 1
    export PYTHONPATH="$SITE:$SITE/pycuda-src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# the table, then one line of specs and targets (the table's summary)
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
