# Quick start: `make demo` (tune ResNet-50's first 3x3 conv on the local OpenCL
# device) and `make test`. Both create .venv and install the project into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python >= 3.11)"; exit 1; }
	@# Debian's PoCL (LLVM 15) runs our kernels ~10x faster than pip's PoCL 3.0-rc2;
	@# install it where we can (root + apt), else rely on pocl-binary-distribution.
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! [ -e /etc/OpenCL/vendors/pocl.icd ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd >/dev/null) \
		|| echo "note: apt-get could not install pocl-opencl-icd; using pip's PoCL"; \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# ResNet-50's first 3x3 conv (64 -> 64 channels, 56x56)
DEMO_ARGS := [["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],[1,1,1,1],[1,1],"float32"]

demo: $(STAMP)
	$(BIN)/tuner devices
	$(BIN)/tuner demo
	$(BIN)/tuner tune --target "opencl -model=pocl-cpu" --template conv2d_nchw.cuda \
		--args '$(DEMO_ARGS)' --trials 16

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) *.egg-info
