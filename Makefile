# Quick start: `make demo` (tune ResNet-50's layers on the local OpenCL device, build
# the model with the tuned configs, run and time it) and `make test`. Both create .venv
# and install the project into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python >= 3.11)"; exit 1; }
	@# Debian's PoCL (LLVM 15) runs our kernels ~10x faster than pip's PoCL 3.0-rc2;
	@# install it where we can (root + apt), else rely on pocl-binary-distribution.
	@# Debian's Chromium runs the dashboard's browser tests (Playwright drives it; no
	@# browser download): without it those tests skip, saying so.
	@pkgs=""; \
	[ -e /etc/OpenCL/vendors/pocl.icd ] || pkgs="$$pkgs pocl-opencl-icd"; \
	command -v chromium >/dev/null || pkgs="$$pkgs chromium"; \
	if [ -n "$$pkgs" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq || true; \
		for pkg in $$pkgs; do \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg >/dev/null \
			|| echo "note: apt-get could not install $$pkg (pocl-opencl-icd: pip's PoCL is used; chromium: the browser tests skip)"; \
		done; \
	elif ! command -v chromium >/dev/null; then \
		echo "note: no chromium: the dashboard's browser tests will skip (install it, or set TUNER_CHROMIUM)"; \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# ResNet-50's first 3x3 conv (64 -> 64 channels, 56x56)
DEMO_ARGS := [["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],[1,1,1,1],[1,1],"float32"]

# ResNet-50 as the onnx package ships it (light_resnet50.onnx): tune each of its 28
# conv2d/dense tasks a little, then build it with the best records and time it.
DEMO_TARGET := opencl -model=pocl-cpu
DEMO_MODEL = $$($(BIN)/python -c 'from compiler.frontend.samples import light_path; print(light_path("resnet50"))')

demo: $(STAMP)
	$(BIN)/tuner devices
	$(BIN)/tuner demo
	$(BIN)/tuner tune --target "$(DEMO_TARGET)" --template conv2d_nchw.cuda \
		--args '$(DEMO_ARGS)' --trials 16
	$(BIN)/tuner tune $(DEMO_MODEL) --target "$(DEMO_TARGET)" --trials 4
	$(BIN)/tuner compile $(DEMO_MODEL) --target "$(DEMO_TARGET)" --benchmark

# Two passes: the tests in parallel, one worker per CPU (up to TEST_WORKERS), each taking
# a file at a time (its module's servers and fixtures start once); then, alone, the few
# `serial` ones, which bound wall-clock time or the database server's work. --durations:
# the slowest tests, where the time went. (--no-loadscope-reorder: conftest.py's order,
# longest files first, not xdist's by test count.) Both passes run; the target fails if
# either did.
TEST_WORKERS ?= 4
test: $(STAMP)
	status=0; \
	$(BIN)/python -m pytest -n logical --maxprocesses $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder -m "not serial" --durations=30 || status=1; \
	$(BIN)/python -m pytest -m serial --durations=5 || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) *.egg-info
