# redisbus — every workflow goes through here. `make` alone lists the targets.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help demo test test-fast bench lint typecheck format unasync docs docs-serve soak all clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -n "$(PY)" || { echo "need python3.11 on PATH (or make PY=/path/to/python3.11)"; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(PY) is older than 3.11"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade 'pip>=25.1'
	$(BIN)/pip install -q -e '.[testing,mcp,hermes,a2a,console,otel]' --group dev
	@touch $(STAMP)

demo: $(STAMP)  ## run the anime-production demo (embedded Redis unless REDISBUS_URL is set)
	$(BIN)/redisbus demo

test: $(STAMP)  ## run the whole test suite against real Redis servers the fixtures start
	$(BIN)/python -m tests.run

soak: $(STAMP)  ## the model-based test for ten minutes (REDISBUS_SOAK_S=seconds), then the soak tests
	REDISBUS_SOAK=1 $(BIN)/python -m pytest tests/test_model_based.py -q -s -p no:cacheprovider
	REDISBUS_SOAK=1 $(BIN)/python -m pytest tests/test_model_lifecycle.py -q -s -p no:cacheprovider
	$(BIN)/python -m pytest -m soak -q -s -p no:cacheprovider

bench: $(STAMP)  ## benchmarks beside their baselines; writes bench/results.json
	$(BIN)/python -m bench

lint: $(STAMP)  ## ruff check + format check + generated sync face up to date
	$(BIN)/ruff check redisbus tests bench grafana deploy scripts
	$(BIN)/ruff format --check redisbus tests bench grafana deploy scripts
	$(BIN)/python scripts/unasync.py --check

unasync: $(STAMP)  ## regenerate the sync face (redisbus/_sync) from the async one (redisbus/_async)
	$(BIN)/python scripts/unasync.py

typecheck: $(STAMP)  ## mypy --strict on the package
	$(BIN)/mypy

format: $(STAMP)  ## apply ruff formatting
	$(BIN)/ruff format redisbus tests bench scripts
	$(BIN)/ruff check --fix redisbus tests bench scripts

docs: $(STAMP)  ## build the docs site into site/ (reference pages generated from the code)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)  ## the docs site on http://127.0.0.1:8000, rebuilt on change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

all: lint typecheck test  ## lint, types, tests

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist site *.egg-info
