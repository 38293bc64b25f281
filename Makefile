# composespawner: two commands on a fresh machine.
#   make demo   install into .venv and start the hub at http://127.0.0.1:8000
#   make test   install test tools, then lint, type-check and run the test suite

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CHP := node_modules/.bin/configurable-http-proxy
CHROMIUM ?= /usr/bin/chromium
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint typecheck pytest bench install install-test notebook-account clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The stamp files make re-runs instant while setup.py and the pins are unchanged.
$(VENV)/.installed: $(BIN)/python setup.py constraints.txt
	$(PIP) install -c constraints.txt -e '.[notebook]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py constraints.txt
	$(PIP) install -c constraints.txt -e '.[test,notebook]'
	touch $@

$(CHP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

install: $(VENV)/.installed $(CHP)

# As root, the demo's notebooks run as an unprivileged account (composespawner-nb),
# which must be able to run this venv's Python: a Python under /root (pyenv) needs
# an ACL that lets that account alone enter the closed folders on the way.
notebook-account: $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ]; then \
	  id -u composespawner-nb >/dev/null 2>&1 || useradd --system --user-group --no-create-home \
	    --home-dir /nonexistent --shell /usr/sbin/nologin composespawner-nb; \
	  closed=$$($(BIN)/python -c 'import sys; from pathlib import Path; \
	    from composespawner.accounts import closed_dirs; \
	    print(*closed_dirs(Path(sys.executable).resolve()))'); \
	  if [ -n "$$closed" ]; then \
	    command -v setfacl >/dev/null || (apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null); \
	    for dir in $$closed; do setfacl -m u:composespawner-nb:x "$$dir"; done; \
	  fi; \
	fi

install-test: $(VENV)/.installed-test $(CHP) $(CHROMIUM) notebook-account

demo: install notebook-account
	$(BIN)/composespawner demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

pytest: install-test
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: install-test
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules .demo .demo-homes test-artifacts
