# Two commands on a fresh machine with Python 3.11:
#   make demo   offline CPU smoke run of the benchmark workflow; prints the report and results paths
#   make test   the test suite
# `make help` (or `make` alone) lists every target with its line: the `## ` comment on the target's own line.
.DEFAULT_GOAL := help
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
INPUTS ?= inputs/smoke.yaml
FRONTIER_INPUTS ?= inputs/frontier_smoke.yaml
KERNEL_INPUTS ?= inputs/kernels_smoke.yaml
# Read once (:=), so that every line of a target names the same directory.
ifndef RUN_DIR
RUN_DIR := runs/$(shell date +%Y%m%d-%H%M%S)
endif
# Every package at the version pinned in the lockfile (`make lock` writes it from pyproject.toml).
LOCK := requirements.lock
TORCH_VERSION := $(shell sed -n 's/^torch==//p' $(LOCK))
export FLYTECTL_CONFIG := $(CURDIR)/flyte-local.yaml
# `VERBOSE=1 make run` (or `make run VERBOSE=1`): the commands as they run and pyflyte's full output (the workflow's
# outputs printed as flytekit prints them), in place of the summary a run ends with.
ifneq ($(VERBOSE),)
export FINETUNE_BENCH_VERBOSE := 1
endif
Q := $(if $(VERBOSE),,@)

.PHONY: help demo test test-all run plan migrate frontier kernels install install-dev lint lock docs example-report clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, alone: where a CPU build of the pinned version is at hand (a local wheel) it is taken, and the
# lockfile's `torch==` pin is then already met; otherwise pip fetches the pinned version from the registry.
# Then every locked package, then the project itself without resolving anything again.
$(VENV)/.installed: $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -r $(LOCK)
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The lockfile includes the dev tools (pytest, ruff).
$(VENV)/.installed-dev: $(VENV)/.installed
	touch $@

install: $(VENV)/.installed ## create .venv with the locked packages and the project
install-dev: $(VENV)/.installed-dev ## the same, with the dev tools (pytest, ruff)

# Each target with a `## ` comment on its line, and that comment.
help: ## list the targets
	@awk 'BEGIN { FS = ":[^#]*## " } /^[a-z][a-z-]*:.*## / { printf "  make %-11s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo "Variables: INPUTS=<inputs file> (run, plan, migrate), RUN_ARGS, PLAN_ARGS, OUT, FRONTIER_INPUTS, KERNEL_INPUTS,"
	@echo "RUN_DIR (default runs/<timestamp>), VERBOSE=1 (the commands and pyflyte's full output), PYTHON (python3.11)."

# A run that fails before it writes anything leaves no empty runs/<timestamp>/ behind (one that wrote its report
# keeps it: the report says what failed). A run writes report.html and results.csv; a dry run (`dry_run: true`)
# plan.html and plan.csv.
run: $(VENV)/.installed ## the benchmark workflow on INPUTS (default inputs/smoke.yaml), outputs in runs/<timestamp>/
	@mkdir -p $(RUN_DIR)
	$(Q)FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) $(BIN)/pyflyte run workflows/benchmark.py benchmarking_experiment --inputs-file $(INPUTS) $(RUN_ARGS) \
	  || { status=$$?; rmdir $(RUN_DIR) 2>/dev/null; exit $$status; }
	@test -f $(RUN_DIR)/report.html && test -f $(RUN_DIR)/results.csv || test -f $(RUN_DIR)/plan.csv

# The demo keeps its runs in this checkout's own results store (runs/.results): a fresh clone's first demo measures
# every run, and a second one reuses them and says so.
demo: ## the offline CPU smoke run (inputs/smoke.yaml; about 3 minutes the first time, install included); ends with the report and results paths
	@$(MAKE) --no-print-directory run INPUTS=inputs/smoke.yaml RUN_ARGS="--results_store $(CURDIR)/runs/.results"

# A dry run: validates INPUTS and prints what the memory model predicts, nothing downloaded or trained. A benchmark
# inputs file: per condition the peak memory and its parts, whether it fits the GPU, the step time; GPU-hours and
# cost. A memory-frontier inputs file (one with arms / batch_size_search / seq_length_search / probes): each
# search's predicted frontier.
#   make plan INPUTS=inputs/phi3_alpaca.yaml PLAN_ARGS="--gpu_kind H100 --gpu_hour_price 3.5"
# The GPU is the inputs file's (its `accelerator` or `gpu_kind`), else PLAN_ARGS' `--gpu_kind`, else an H100, which the
# plan then says it assumed.
PLAN_ARGS ?=
PLAN_DEFAULT_GPU := H100
PLAN_GPU = $(if $(or $(findstring --gpu_kind,$(PLAN_ARGS)),$(shell grep -lE '^(accelerator|gpu_kind):' $(INPUTS) 2>/dev/null)),,--gpu_kind $(PLAN_DEFAULT_GPU))
PLAN_WORKFLOW = $(if $(shell grep -lE '^(arms|batch_size_search|seq_length_search|probes):' $(INPUTS)),workflows/frontier.py memory_frontier,workflows/benchmark.py benchmarking_experiment)
plan: $(VENV)/.installed ## a dry run of INPUTS: predicted memory, fits or not, GPU-hours; nothing trained
	@if grep -qE '^sweep:' $(INPUTS); then \
	  echo "$(INPUTS) is a kernel-benchmark inputs file: it has no dry run (each point takes seconds; see docs/kernels.md)"; \
	  exit 2; fi
	@mkdir -p $(RUN_DIR)
	@$(if $(PLAN_GPU),echo "planning for an $(PLAN_DEFAULT_GPU): $(INPUTS) names no accelerator or gpu_kind (PLAN_ARGS=\"--gpu_kind KIND\" for another GPU)")
	$(Q)FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) $(BIN)/pyflyte run $(PLAN_WORKFLOW) \
	  --inputs-file $(INPUTS) --dry_run $(PLAN_GPU) $(PLAN_ARGS) > $(RUN_DIR)/plan.log 2>&1; status=$$?; \
	  cat $(RUN_DIR)/plan.log; exit $$status

# An inputs file written for the Union tutorial's workflow (use_liger, dataset, bf16, num_train_epochs, ...) converted
# to this project's settings, written to OUT (default: beside it, <name>.migrated.yaml); prints what it changed, what
# it left out and what it could not convert. Then `make plan INPUTS=<the converted file>`.
#   make migrate INPUTS=phi3_inputs.yaml OUT=inputs/phi3_mine.yaml
migrate: $(VENV)/.installed ## convert the Union tutorial's INPUTS file to this project's settings (OUT=)
	@$(BIN)/python -m finetune_bench.inputs.migrate $(INPUTS) $(if $(OUT),--out $(OUT))

# The memory-frontier workflow (default: its CPU smoke inputs, with a fake memory limit so that the
# frontiers fall below the caps); `make frontier FRONTIER_INPUTS=inputs/frontier_llama1b_2048.yaml` on a GPU.
frontier: $(VENV)/.installed ## the memory-frontier workflow on FRONTIER_INPUTS (default: its CPU smoke inputs)
	@mkdir -p $(RUN_DIR)
	$(Q)FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) \
	  $(if $(findstring frontier_smoke,$(FRONTIER_INPUTS)),FINETUNE_BENCH_FAKE_MEMORY_TOKENS=64) \
	  $(BIN)/pyflyte run workflows/frontier.py memory_frontier --inputs-file $(FRONTIER_INPUTS) \
	  || { status=$$?; rmdir $(RUN_DIR) 2>/dev/null; exit $$status; }

# The kernel benchmark (each Liger kernel against its reference), on its CPU smoke inputs by default.
kernels: $(VENV)/.installed ## the kernel benchmark on KERNEL_INPUTS (default: its CPU smoke inputs)
	@mkdir -p $(RUN_DIR)
	$(Q)FINETUNE_BENCH_EXPORT_DIR=$(abspath $(RUN_DIR)) $(BIN)/pyflyte run workflows/kernels.py kernel_benchmark --inputs-file $(KERNEL_INPUTS) \
	  || { status=$$?; rmdir $(RUN_DIR) 2>/dev/null; exit $$status; }

test: $(VENV)/.installed-dev ## the test suite (about 12 minutes on 2 cores; slow checks: make test-all)
	$(BIN)/pytest -q

# Includes the slow end-to-end checks (several minutes on a CPU).
test-all: $(VENV)/.installed-dev ## the test suite with the tests marked slow
	$(BIN)/pytest -q -m ''

lint: $(VENV)/.installed-dev ## ruff check and ruff format --check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Refresh the lockfile from pyproject.toml: every dependency (dev tools included) resolved and pinned. torch
# and triton are pinned to the pair the images' CUDA build of torch needs (torch's CUDA wheel requires that
# exact triton); a local CPU build of torch resolves with a `+cpu` label, dropped so the pin fits both builds.
LOCK_TORCH ?= 2.13.0
LOCK_TRITON ?= 3.7.1
lock: $(BIN)/python ## refresh requirements.lock from pyproject.toml
	$(BIN)/pip install -q pip-tools
	printf 'torch==$(LOCK_TORCH)\ntriton==$(LOCK_TRITON)\n' > $(VENV)/lock-constraints.txt
	CUSTOM_COMPILE_COMMAND='make lock' $(BIN)/pip-compile -q --extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
	  --constraint $(VENV)/lock-constraints.txt --output-file $(LOCK) pyproject.toml
	sed -i 's/^torch==\([^+ ]*\)+cpu/torch==\1/' $(LOCK)

# Regenerate the settings reference (docs/settings.md) from the settings' declarations.
# The GPU example report in docs/examples/ (stored runs of inputs/padded_llama1b_shapes.yaml with 20 steps on one H200),
# rendered again by the current renderer: its report.html and, where a Chromium is at hand, top.png.
EXAMPLE := docs/examples/variable-length-llama1b-h200
example-report: $(VENV)/.installed ## render the GPU example report in docs/examples/ again from its stored runs
	$(BIN)/python scripts/example_report.py $(EXAMPLE) --fine-tune-epochs 1 \
	  --title "Variable-length data, Llama-3.2-1B on one H200: liger and packing against the baseline"

docs: $(VENV)/.installed ## regenerate docs/settings.md from the settings' field comments
	PYTHONPATH=$(CURDIR) $(BIN)/python scripts/settings_reference.py

clean: ## remove runs/ (every run's outputs and the demo's results store) and .pytest_cache
	rm -rf runs .pytest_cache
