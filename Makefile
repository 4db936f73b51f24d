# etforge: both entry points create the pinned environment themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test setup clean

# Build and validate every cell of the default pipeline.yaml.
run: $(STAMP)
	$(BIN)/doit

# Run the test suite (installs Debian's chromium for the report test if missing).
test: $(STAMP)
	./.ci/install-chromium.sh
	$(BIN)/python -m pytest -q tests

setup: $(STAMP)

# requirements-nodeps.txt: OpenVINO/Arm backend packages whose metadata pins an
# older numpy/jsonschema/flatbuffers than the toolchain; installed second, without
# their dependencies (which requirements.txt pins), so they cannot move torch or numpy.
$(STAMP): requirements.txt requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

clean:
	rm -rf artifacts
