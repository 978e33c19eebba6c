# Two set-up-and-go commands: `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
export SAM_CLI_TELEMETRY := 0
VENV := .venv
BIN := $(VENV)/bin
SAM_VENV := .venv-sam
PY39_VENV := .venv39
PY313_VENV := .venv313

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
	@echo "make unit    the pure tests only (tests/unit, hypothesis profile dev: under a minute)"
	@echo "make fuzz    the pure tests and the fuzz at full depth (hypothesis profile deep)"
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

# The node publisher's own test environments: Amazon Linux 2023's Python 3.9 and the Lambda runtime's 3.13.
NODE_TEST_DEPS := 'pytest==8.3.5' 'boto3' 'nvidia-ml-py==13.615.71' 'prometheus_client==0.26.0' 'grpcio>=1.62' 'protobuf>=5.26'
define node_venv
$(1)/bin/.installed:
	@test -n "$(2)" || { echo "error: no Python $(3) interpreter found (the node publisher is tested on $(3)); install one, e.g. 'pyenv install $(3)'"; exit 1; }
	$(2) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q $(NODE_TEST_DEPS)
	@touch $$@
endef
$(eval $(call node_venv,$(PY39_VENV),$(PY39),3.9))
$(eval $(call node_venv,$(PY313_VENV),$(PY313),3.13))

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

# hypothesis profiles (tests/profiles.py): dev (`make unit`, a tenth of the examples, a twentieth of the
# fuzz), ci (`make test`: 100 examples a property, half the fuzz), deep (`make fuzz`: five times ci's, the
# whole fuzz: 86k inputs). `make fuzz` runs the adapters' fuzz first: the pure fuzz's last test writes
# both's counts to .pytest-fuzz.json. It also runs the removal path's state machine at depth (250 examples
# of 10 steps on moto server; ci: 50).
.PHONY: fuzz
fuzz: venv
	HYPOTHESIS_PROFILE=deep $(BIN)/pytest -q -p no:cacheprovider tests/adapters/test_fuzz_adapter_inputs.py \
	  tests/integration/test_removal_state_machine.py tests/unit

# The pure tests only (tests/unit: no adapter, server or process; tests/unit/test_unit_suite.py checks it).
.PHONY: unit
unit: venv
	HYPOTHESIS_PROFILE=dev $(BIN)/pytest -q -p no:cacheprovider tests/unit

# Coverage of the shipped packages over the suite; the figure is quoted in the README. Beside it, on the
# second core, a side session with its own moto server runs what adds no coverage: the e2e rehearsal and
# the quick bench (both subprocesses), then the crash-point sweep (tests/crash: ~1,000 fault-injected runs,
# run without coverage). Its log lands in .pytest-side.log. The e2e rehearsal's AWS calls reach the main
# session's IAM conformance test through .pytest-rehearsal-calls.jsonl (written whole, at its end; the
# test replays the rehearsal itself if the side session has not written it yet).
.PHONY: pytest
pytest: venv
	@rm -f .pytest-rehearsal-calls.jsonl; \
	HYPOTHESIS_PROFILE=ci GPUFLEET_KEEP_REHEARSAL_CALLS=1 $(BIN)/pytest -q -p no:cacheprovider tests/e2e tests/test_bench_quick.py tests/crash > .pytest-side.log 2>&1 & side=$$!; \
	HYPOTHESIS_PROFILE=ci GPUFLEET_KEEP_REHEARSAL_CALLS=1 GPUFLEET_REQUIRE_SAM_BUILD=1 $(BIN)/pytest tests --ignore=tests/crash --ignore=tests/e2e \
	  --deselect tests/test_bench_quick.py::test_every_benchmark_runs_in_quick_mode --durations=12 --cov=gpufleet --cov=gpufleet_tools \
	  --cov=gpufleet_node --cov-report=term:skip-covered --cov-report=json:.coverage.json; main=$$?; \
	wait $$side; sided=$$?; echo "--- e2e rehearsal, quick bench, crash points (their own session) ---"; tail -n 25 .pytest-side.log; \
	test $$main -eq 0 -a $$sided -eq 0
	@$(BIN)/python -c 'import json; print("coverage of gpufleet, gpufleet_tools and gpufleet_node (side session not counted): %.1f%%" % json.load(open(".coverage.json"))["totals"]["percent_covered"])'

.PHONY: test-node
test-node: $(PY39_VENV)/bin/.installed $(PY313_VENV)/bin/.installed
	for v in $(PY39_VENV) $(PY313_VENV); do \
	  (cd tests/node && PYTHONPATH=../../layers/node ../../$$v/bin/python -m pytest -q -p no:cacheprovider .) || exit 1; \
	done

.PHONY: test
test: lint typecheck sam-validate sam-build pytest test-node

.PHONY: bench
bench: venv
	$(BIN)/python -m bench

.PHONY: clean
clean:
	rm -rf $(VENV) $(SAM_VENV) $(PY39_VENV) $(PY313_VENV) .aws-sam demo-out bench/out
