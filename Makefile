# Two commands on a fresh machine: `make demo` and `make test`. Everything else is here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
CONFIG ?= config/smoke.yaml
PROFILE ?= profiles/local
STAMP := $(VENV)/.installed

.PHONY: demo demo-advise results test test-tools venv lint typecheck workflow-lint unit report clean

# TORCH=cuda (default): torch's PyPI build (CUDA; ~6 GB with its NVIDIA wheels). TORCH=cpu: the
# CPU wheels of the same versions from PyTorch's index, no CUDA wheels (README, "Install").
TORCH ?= cuda
TORCH_INDEX_cuda :=
TORCH_INDEX_cpu := --index-url https://download.pytorch.org/whl/cpu
ifeq ($(filter cpu cuda,$(TORCH)),)
$(error TORCH=$(TORCH): expected cpu or cuda)
endif

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch/torchvision first, at the lock's versions (torch==2.14.1, torchvision==0.29.1: the only
	# pair that imports together on these machines), from the index TORCH chooses.
	$(BIN)/pip install --quiet -c constraints.txt $(TORCH_INDEX_$(TORCH)) torch torchvision
	# Everything else at the lock's exact versions (constraints.txt); pyproject.toml has ranges.
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	# tests/test_hta.py: HolisticTraceAnalysis without its declared dependencies (jupyterlab,
	# pytest, pydot: unused by the analyses the test runs), plus plotly, which it imports.
	$(BIN)/pip install --quiet --no-deps -c constraints.txt HolisticTraceAnalysis plotly narwhals
	touch $@

venv: $(STAMP)

# The spec rule's command carries the run's whole spec as JSON (~1.3 KB a run): on the console
# it is cut to its output path; Snakemake's log (.snakemake/log/) keeps every command whole.
SHORT_SPECS := sed -u -E "s/^(Shell command: [^ ]*( -m codl.cli)? ?write-spec )'.*' (--out [^ ]+).*/\1SPEC_JSON \3 (whole in .snakemake\/log\/)/"

## demo: set up, run config/smoke.yaml through the local profile, build the report, then say
## which runs had their CPUs busy with other processes (codl.analysis.load). Each config's
## tables, figures and report go to its own result set, results/<name>/ (`codl plan --result-set`).
demo: $(STAMP)
	set -o pipefail; $(BIN)/snakemake --profile $(PROFILE) --configfile $(CONFIG) 2>&1 | $(SHORT_SPECS)
	set -e; out=$$($(BIN)/codl plan --result-set $(CONFIG)); \
	$(BIN)/snakemake --profile $(PROFILE) --configfile $(CONFIG) --report $$out/report.html; \
	echo; \
	echo "figures: $$(ls $$out/figures/*.png | tr '\n' ' ')"; \
	echo "tables:  $$out/tables/runs.csv $$out/tables/comparison.csv"; \
	echo "report:  $$out/report.html"; \
	$(BIN)/python -m codl.steps.background $$out

## demo-advise: the advisor's CPU loop (config/loop-cpu.yaml: a worker sweep, the fit, the
## advice), then `codl advise results/loop-cpu` on its tables as a user types it.
demo-advise: $(STAMP)
	$(MAKE) demo CONFIG=config/loop-cpu.yaml
	$(BIN)/codl advise $$($(BIN)/codl plan --result-set config/loop-cpu.yaml) --boot 50

## results: rebuild every committed result set's tables and figures from what it commits
## (codl regenerate --write: through the functions the workflow's rules call), then show what
## changed. `codl regenerate` alone only compares, as the test does.
results: $(STAMP)
	$(BIN)/codl regenerate --write
	git status --short -- results

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts workflow/scripts
	$(BIN)/ruff format --check src tests benchmarks scripts workflow/scripts

typecheck: $(STAMP)
	$(BIN)/mypy

workflow-lint: $(STAMP)
	$(BIN)/snakefmt --check workflow/Snakefile workflow/rules
	@# Each config defines other rules (the advisor's and share rules are conditional).
	for c in config/smoke.yaml config/config.yaml config/loop-cpu.yaml config/share-cpu.yaml \
	    config/calibrate-h200-light.yaml; do \
	  $(BIN)/snakemake --lint --configfile $$c || exit 1; \
	done

## test: environment + lint + type check + the full test suite.
test: lint typecheck workflow-lint test-tools
	$(BIN)/pytest -q

# What tests run beside Python, from Debian's packages where the machine lets us install them:
# h5dump reads a converted trace (tests/test_convert.py), Chromium opens the report
# (tests/test_report_browser.py; under CI=true a missing browser fails that test, not skips it).
# The Slurm test cluster is installed by its own tests (tests/slurm/cluster.sh).
TEST_TOOLS := h5dump:hdf5-tools chromium:chromium
test-tools:
	@missing=""; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing$$missing (Debian packages) for the tests"; \
	    { apt-get install -y -qq $$missing || { apt-get update -qq && apt-get install -y -qq $$missing; }; } >/dev/null 2>&1 \
	      || echo "could not install$$missing: the tests that need them skip"; \
	  else echo "not installed:$$missing (needs root and apt-get): the tests that need them skip"; fi; \
	fi

## clean: what the workflow made here (runs, result sets, data sets, logs), never a committed
## result set: under results/ it removes only what git does not track.
clean:
	@git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { \
	  echo "make clean: not a git checkout: cannot tell committed results from made ones; remove them by hand" >&2; exit 2; }
	git clean -fdxq -- results
	rm -rf resources logs .snakemake
