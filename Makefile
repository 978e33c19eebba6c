# Two set-up-and-go commands: `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
export SAM_CLI_TELEMETRY := 0
VENV := .venv
BIN := $(VENV)/bin
SAM_VENV := .venv-sam
PY39_VENV := .venv39

# Interpreters are found explicitly: pyenv's shims refuse versions that are not selected.
find_python = $(firstword $(foreach c,$(shell command -v python$(1) 2>/dev/null) \
  $(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1)) /usr/bin/python$(1) /usr/local/bin/python$(1),\
  $(if $(shell $(c) -c 'import sys; print(sys.version_info[:2] == tuple(map(int, "$(1)".split("."))))' 2>/dev/null | grep -x True),$(c))))
PY313 := $(call find_python,3.13)
PY39 := $(call find_python,3.9)

.PHONY: help
help:
	@echo "make demo    local rehearsal of the whole system on moto (no AWS account)"
	@echo "make test    everything CI checks"
	@echo "make bench   benchmarks (results go to bench/README.md by hand)"

$(BIN)/.installed: pyproject.toml layers/gpufleet/requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpufleet needs Python >= 3.11 for local tooling (found %s); set PYTHON=/path/to/python3.11+" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

$(SAM_VENV)/bin/.installed:
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install -q --upgrade pip
	$(SAM_VENV)/bin/python -m pip install -q 'aws-sam-cli==1.170.0'
	@touch $@

$(PY39_VENV)/bin/.installed:
	@test -n "$(PY39)" || { echo "error: no Python 3.9 interpreter found (the node publisher must run on Amazon Linux 2023's python3.9); install one, e.g. 'pyenv install 3.9'"; exit 1; }
	$(PY39) -m venv $(PY39_VENV)
	$(PY39_VENV)/bin/python -m pip install -q --upgrade pip
	$(PY39_VENV)/bin/python -m pip install -q 'pytest==8.3.5' 'boto3' 'nvidia-ml-py'
	@touch $@

.PHONY: venv
venv: $(BIN)/.installed

.PHONY: demo
demo: venv
	$(BIN)/python -m rehearsal

.PHONY: lint
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: typecheck
typecheck: venv
	$(BIN)/mypy

.PHONY: sam-validate
sam-validate: $(SAM_VENV)/bin/.installed
	SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam validate --lint --region us-east-1

.PHONY: sam-build
sam-build: $(SAM_VENV)/bin/.installed
	@test -n "$(PY313)" || { echo "error: no python3.13 interpreter found; sam build needs it for the Lambda runtime python3.13 (install one, e.g. 'pyenv install 3.13')"; exit 1; }
	SAM_CLI_TELEMETRY=0 PATH="$(dir $(PY313)):$$PATH" $(SAM_VENV)/bin/sam build

.PHONY: pytest
pytest: venv
	GPUFLEET_REQUIRE_SAM_BUILD=1 $(BIN)/pytest tests

.PHONY: test-node39
test-node39: $(PY39_VENV)/bin/.installed
	cd tests/node && PYTHONPATH=../../layers/node ../../$(PY39_VENV)/bin/python -m pytest -q -p no:cacheprovider .

.PHONY: test
test: lint typecheck sam-validate sam-build pytest test-node39

.PHONY: bench
bench: venv
	$(BIN)/python -m bench

.PHONY: clean
clean:
	rm -rf $(VENV) $(SAM_VENV) $(PY39_VENV) .aws-sam demo-out bench/out
