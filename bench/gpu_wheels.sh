#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what bench/gpu_check.sh installs on a GPU machine that
# cannot reach the network: the project's dependencies and theirs as wheels for that
# machine's Python (3.12, manylinux x86-64), and pycuda's source, which builds there
# against its CUDA (pycuda publishes no wheels). What the GPU image already holds
# (numpy, scipy, onnx, onnxruntime, httpx, typer, rich, ...) is left out, to stay well
# inside the 64 MiB that travel; gpu_check.sh installs .whl/ with --no-index.
#
#   bench/gpu_wheels.sh            # here, where pip reaches PyPI
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
# packages the H200 image holds (the device tool's KINDS.md), by normalised name
IMAGE_HAS="numpy scipy onnx onnxruntime protobuf httpx httpcore anyio idna certifi sniffio
typer click rich markdown_it_py mdurl pygments shellingham typing_extensions packaging
sympy mpmath flatbuffers markupsafe pyyaml prometheus_client uvloop setuptools wheel
coloredlogs humanfriendly ml_dtypes"
rm -rf .whl
mkdir -p .whl
mapfile -t REQUIREMENTS < <("$PYTHON" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith("pocl-binary")))')
"$PYTHON" -m pip download --quiet --dest .whl --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 "${REQUIREMENTS[@]}"
for name in $IMAGE_HAS; do
    rm -f .whl/"$name"-*.whl .whl/"${name//_/-}"-*.whl
done
# pycuda: the source, built on the GPU machine (nvcc and CUDA's headers are there);
# --no-build-isolation: pip reads its metadata here with this Python's setuptools
"$PYTHON" -m pip download --quiet --no-deps --dest .whl --no-binary=:all: \
    --no-build-isolation "pycuda>=2025.1.2"
ls .whl
du -sh .whl
