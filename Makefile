# Keel: `make demo` shows a run end to end; `make test` is what CI runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench mutate clean bubblewrap chromium

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

test: lint bubblewrap chromium
	$(BIN)/pytest -q

# The sandbox tests need bubblewrap: installed here when we can (root with apt-get).
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap \
	  >/dev/null; } || echo "bubblewrap is not installed: the sandbox tests will be skipped \
	(install it: sudo apt-get install bubblewrap, or dnf/pacman install bubblewrap)"

# The web console's browser tests drive the system Chromium (never a downloaded one).
chromium:
	@[ -x /usr/bin/chromium ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  >/dev/null; } || echo "chromium is not installed at /usr/bin/chromium: the web console's \
	browser tests (tests/browser) will be skipped (install it: sudo apt-get install chromium)"

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/store.py
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/tasks.py
	$(BIN)/python bench/workers.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/models.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/mcp_tools.py
	$(BIN)/python bench/stats.py

# Mutation testing of the modules [tool.mutmut] in pyproject.toml names (core/, loop/decide.py,
# policy/, the stores' append and claim paths): writes bench/mutation/report.md (per module:
# mutants, killed, survivors, equivalent ones with their reasons from
# bench/mutation/equivalent/MODULE.toml) and bench/mutation/results.txt (mutmut's own listing).
# mutants/ keeps the verdicts: a changed function's mutants are tried again, and so are
# the last run's survivors, with the current tests (and the survivors of functions that
# only run on import, in fresh processes). A fresh run: rm -rf mutants first.
MUTATE_CHILDREN ?= 2

# mutmut copies a changed .py file into mutants/ again, never a changed data file (the SQL
# queries, the migrations): those are copied here, or the mutants run against stale SQL.
mutate: $(STAMP)
	@[ ! -d mutants ] || $(BIN)/python bench/mutation/report.py --reset
	@[ ! -d mutants ] || (cd src && find . -type f ! -name '*.py' ! -name '*.pyc' \
	  -exec cp -p --parents {} ../mutants/src/ \;)
	nice -n 10 $(BIN)/mutmut run --max-children $(MUTATE_CHILDREN)
	nice -n 10 $(BIN)/python bench/mutation/report.py --fresh
	$(BIN)/mutmut results > bench/mutation/results.txt
	$(BIN)/python bench/mutation/report.py

clean:
	rm -rf $(VENV) .keel .mypy_cache .pytest_cache .ruff_cache mutants
