# Run `make help` for the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The suite starts a few hundred Python processes of this tree (profiler run, coordinator): let them keep
# their bytecode (__pycache__, git-ignored) instead of compiling every module again (~0.3 CPU-s each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup test test-unit test-integration demo demo-flink lint import-contract bench clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: ## install system packages, kernel headers link, venv and package (idempotent)
	@bash scripts/setup.sh

test: setup ## set up, then run the whole suite (unit + integration, real eBPF/JVM/sshd/Spark)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-unit: setup ## fast tests without privileges
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup ## real eBPF, JVMs, sshd and Spark
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

demo: setup ## profile a local Spark Structured Streaming YSB pipeline for 60 s and write the report
	$(VENV)/bin/coordinator demo --duration 60

demo-flink: setup ## the same YSB pipeline on a local Flink cluster, profiled for 60 s
	$(VENV)/bin/coordinator demo --spe flink --duration 60

lint: setup ## ruff, mypy and the import contract on both packages
	$(VENV)/bin/ruff check profiler coordinator tests bench
	$(VENV)/bin/mypy profiler coordinator
	@$(MAKE) -s import-contract

import-contract: ## the layers of both packages ([tool.importlinter] in pyproject.toml), without the set-up
	$(VENV)/bin/lint-imports --no-cache

bench: setup ## run every benchmark under bench/ (results go to docs/benchmarks.md by hand)
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean: ## remove build products (keeps the venv)
	rm -rf build dist *.egg-info runs
