# Two commands do all the set-up on a fresh machine:
#   make demo   the example project end to end (SQLite, no broker server)
#   make test   install what the tests need into .venv and run them
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv test lint demo sandbox bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) manage.py makemigrations --check --dry-run billing_integration
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

sandbox: $(STAMP)
	$(PY) manage.py billing_sandbox --port 8100

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf var test-artifacts .pytest_cache
