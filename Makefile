# Replays: `make demo` runs the demo, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install node demo test lint check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installs again only when pyproject.toml changed (the stamp records the last install), so
# two `make test` at once (CI runs SQLite and PostgreSQL side by side) never reinstall under
# each other.
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The pinned agent CLIs (claude, codex, gemini, opencode, pi) and ccusage, used by the tests
# and fixtures, as the lock file says. Not `npm ci`: it refuses a lock without an entry for
# every platform's optional package (opencode-ai lists twelve; the registry CI reaches answers
# 404 for all but Linux's), where `npm install --no-save` installs the lock as it is.
node: tests/node/node_modules/.installed
tests/node/node_modules/.installed: tests/node/package.json tests/node/package-lock.json
	cd tests/node && rm -rf node_modules && npm install --no-save --no-audit --no-fund --loglevel=error
	touch $@

demo: install
	$(BIN)/python manage.py migrate --no-input
	$(BIN)/python manage.py setup_demo --url http://$(HOST):$(PORT)/
	@echo "Starting the django-q2 cluster and the web server on http://$(HOST):$(PORT)/ (Ctrl-C stops both)"
	@$(BIN)/python manage.py qcluster & cluster=$$!; \
	trap 'kill $$cluster 2>/dev/null; wait $$cluster 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py runserver --noreload $(HOST):$(PORT)

test: install node
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check replays replaysite tests

clean:
	rm -rf $(VENV) tests/node/node_modules
