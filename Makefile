# etforge: both entry points create the pinned environment themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test setup clean

# Build and validate every cell of the default pipeline.yaml.
run: $(STAMP)
	$(BIN)/doit

# Run the test suite.
test: $(STAMP)
	$(BIN)/python -m pytest -q tests

setup: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt
	touch $(STAMP)

clean:
	rm -rf artifacts
