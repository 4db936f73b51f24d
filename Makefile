# etforge: both entry points create the pinned environment themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-all lint setup clean

# Build and validate every cell of the default pipeline.yaml on two workers, then
# benchmark (alone, so timings are not skewed by parallel exports), write the
# manifests and the report. The second doit re-runs failures and sets the exit code.
# First the aarch64 targets (docs/targets.md): where they cannot be installed (no apt, not
# root) setup says what is missing in one line and the CPU cells keep their host verdicts.
run: $(STAMP)
	-$(BIN)/etforge setup-targets
	$(BIN)/etforge -n 2 -P process export sizegate validate target || true
	$(BIN)/etforge

# Run the test suite on three workers (each test file stays on one worker, so its shared
# fixtures are built once; a third worker fills the cores while the others wait on their
# doit subprocesses), the longest modules first (tests/conftest.py LONGEST_FIRST; xdist's
# own reorder by test count is turned off); installs Debian's chromium for the report test.
test: $(STAMP)
	./.ci/install-chromium.sh
	./.ci/install-vulkan.sh
	./.ci/install-aarch64.sh
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder -m "not slow" tests

# Also the `slow` tests: S3 repeats of the shared-cache scenarios, three more kill points and
# other repeats of fault paths the default run covers, the checkpoint LLM's rebuild, OpenVINO
# byte reproducibility across processes; and 12 randomized fault cases instead of 2.
test-all: $(STAMP)
	./.ci/install-chromium.sh
	./.ci/install-vulkan.sh
	./.ci/install-aarch64.sh
	ETFORGE_FAULT_CASES=12 $(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder tests

# ruff (lint and format) and mypy on the package: what CI checks before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The environment, and what judges CPU cells on aarch64 cores under qemu-user (docs/targets.md):
# Debian's qemu-user and cross compiler, the aarch64 executorch wheel, the cross-built runner.
setup: $(STAMP)
	$(BIN)/etforge setup-targets

# requirements-nodeps.txt: OpenVINO/Arm backend packages whose metadata pins an
# older numpy/jsonschema/flatbuffers than the toolchain; installed second, without
# their dependencies (which requirements.txt pins), so they cannot move torch or numpy.
# etforge itself is installed editable, without dependencies (requirements.txt pins them all).
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

clean:
	rm -rf artifacts
