# Two commands do all the set-up on a fresh machine:
#   make demo   the example project end to end (SQLite, no broker server)
#   make test   install what the tests need into .venv and run them
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv test lint docs demo demo-setup demo-check browser sandbox bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy billing_integration
	$(PY) manage.py makemigrations --check --dry-run billing_integration
	$(MAKE) --no-print-directory docs
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The documentation site (docs/*.md through Sphinx and MyST): warnings are errors, nitpicky,
# offline. Open var/docs-html/index.html.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html -d var/docs-doctrees docs var/docs-html

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# --- the demo (example project): everything on embedded defaults (SQLite file, filesystem
# broker, database cache); no server needed. Ports: make demo DEMO_WEB_PORT=8001 ...
DEMO_HOST         ?= 127.0.0.1
DEMO_WEB_PORT     ?= 8000
DEMO_SANDBOX_PORT ?= 8100
DEMO_SANDBOX      := http://$(DEMO_HOST):$(DEMO_SANDBOX_PORT)
DEMO_ENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" DEMO_HOST=$(DEMO_HOST) \
	DEMO_WEB_PORT=$(DEMO_WEB_PORT) DEMO_SANDBOX_PORT=$(DEMO_SANDBOX_PORT) \
	BILLING_BASE_URL=$(DEMO_SANDBOX) BILLING_AUTH_URL=$(DEMO_SANDBOX)/auth \
	BILLING_CHECKOUT_URL=$(DEMO_SANDBOX)

demo-setup: $(STAMP)
	$(DEMO_ENV) $(PY) manage.py migrate --noinput -v 0
	$(DEMO_ENV) $(PY) manage.py createcachetable
	$(DEMO_ENV) $(PY) manage.py billing_demo_seed

demo: demo-setup
	@echo ""
	@echo "  Acme Cloud (example project)  http://$(DEMO_HOST):$(DEMO_WEB_PORT)/"
	@echo "    pricing                     http://$(DEMO_HOST):$(DEMO_WEB_PORT)/pricing/"
	@echo "    members only                http://$(DEMO_HOST):$(DEMO_WEB_PORT)/members/"
	@echo "    billing page                http://$(DEMO_HOST):$(DEMO_WEB_PORT)/account/"
	@echo "    reports (feature reports)   http://$(DEMO_HOST):$(DEMO_WEB_PORT)/reports/"
	@echo "    admin                       http://$(DEMO_HOST):$(DEMO_WEB_PORT)/admin/"
	@echo "  Billing sandbox dashboard     $(DEMO_SANDBOX)/_sandbox/"
	@echo "  Logins (demo only)            admin / admin (superuser), demo / demo"
	@echo "  Test phone numbers            0700000001 succeeds, 0700000002 declined"
	@echo "  Stop with Ctrl-C."
	@echo ""
	$(DEMO_ENV) $(VENV)/bin/honcho -e example_project/demo.env -f Procfile start

# Start the stack on free ports in var/demo-check/, check it end to end over HTTP, stop it.
demo-check: $(STAMP)
	$(PY) example_project/demo_check.py

# The browser test (Debian's chromium; skipped with a reason when /usr/bin/chromium is absent).
browser: $(STAMP)
	$(VENV)/bin/pytest tests/browser $(PYTEST_ARGS)

sandbox: $(STAMP)
	$(PY) manage.py billing_sandbox --port 8100

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf var test-artifacts .pytest_cache
