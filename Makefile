# Two commands on a fresh machine with Python 3.11:
#   make demo   offline CPU smoke run of the benchmark workflow; prints the report and results paths
#   make test   the test suite
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
INPUTS ?= inputs/smoke.yaml
TORCH_VERSION ?= 2.13.0
RUN_DIR ?= runs/$(shell date +%Y%m%d-%H%M%S)
export FLYTECTL_CONFIG := $(CURDIR)/flyte-local.yaml

.PHONY: demo test test-all run install install-dev lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: with no torch present, a dependency range would pull the newest CUDA build.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==$(TORCH_VERSION) || $(BIN)/pip install -q torch
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: $(VENV)/.installed
	@mkdir -p $(RUN_DIR)
	FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) $(BIN)/pyflyte run workflows/benchmark.py benchmarking_experiment --inputs-file $(INPUTS)
	@test -f $(RUN_DIR)/report.html && test -f $(RUN_DIR)/results.csv
	@echo "report: $(abspath $(RUN_DIR))/report.html"
	@echo "results: $(abspath $(RUN_DIR))/results.csv"

demo:
	@$(MAKE) --no-print-directory run INPUTS=inputs/smoke.yaml

# The memory-frontier workflow (default: its CPU smoke inputs, with a fake memory limit).
frontier: $(VENV)/.installed
	@mkdir -p $(RUN_DIR)
	FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) \
	  $(if $(findstring frontier_smoke,$(or $(INPUTS),frontier_smoke)),FINETUNE_BENCH_FAKE_MEMORY_TOKENS=64) \
	  $(BIN)/pyflyte run workflows/frontier.py memory_frontier --inputs-file $(or $(INPUTS),inputs/frontier_smoke.yaml)
	@echo "report: $(abspath $(RUN_DIR))/frontier_report.html"

test: $(VENV)/.installed-dev
	$(BIN)/pytest -q

# Includes the slow end-to-end checks (several minutes on a CPU).
test-all: $(VENV)/.installed-dev
	$(BIN)/pytest -q -m ''

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf runs .pytest_cache
