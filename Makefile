# Keel: `make demo` shows a run end to end; `make test` is what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/keel demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy --strict src

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/store.py
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/tasks.py
	$(BIN)/python bench/workers.py

clean:
	rm -rf $(VENV) .keel .mypy_cache .pytest_cache .ruff_cache
