# Two commands on a fresh machine: `make demo` and `make test`. Everything else is here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
CONFIG ?= config/smoke.yaml
PROFILE ?= profiles/local
STAMP := $(VENV)/.installed

.PHONY: demo demo-advise test venv lint typecheck workflow-lint unit report clean

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
SHORT_SPECS := sed -u -E "s/^(Shell command: codl write-spec )'.*' (--out [^ ]+).*/\1SPEC_JSON \2 (whole in .snakemake\/log\/)/"

## demo: set up, run config/smoke.yaml through the local profile, build the report, then say
## which runs had their CPUs busy with other processes (codl.analysis.load).
demo: $(STAMP)
	set -o pipefail; $(BIN)/snakemake --profile $(PROFILE) --configfile $(CONFIG) 2>&1 | $(SHORT_SPECS)
	$(BIN)/snakemake --profile $(PROFILE) --configfile $(CONFIG) --report results/report.html
	@echo
	@echo "figures: $$(ls results/figures/*.png | tr '\n' ' ')"
	@echo "tables:  results/tables/runs.csv results/tables/comparison.csv"
	@echo "report:  results/report.html"
	@$(BIN)/python -m codl.steps.background results

## demo-advise: the advisor's CPU loop (config/loop-cpu.yaml: a worker sweep, the fit, the
## advice), then `codl advise results` on its tables as a user types it.
demo-advise: $(STAMP)
	$(MAKE) demo CONFIG=config/loop-cpu.yaml
	$(BIN)/codl advise results --boot 50

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
test: lint typecheck workflow-lint
	@# h5dump reads a converted trace in tests/test_convert.py (skipped without it): Debian's
	@# hdf5-tools where the machine lets us install it.
	@command -v h5dump >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && { apt-get install -y -qq hdf5-tools || { apt-get update -qq && apt-get install -y -qq hdf5-tools; }; } >/dev/null 2>&1; } \
	  || echo "h5dump not installed"
	$(BIN)/pytest -q

clean:
	rm -rf results resources logs .snakemake
