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

.PHONY: demo demo-images test lint typecheck pytest bench install install-test notebook-account locks stacks labextension kube-apiserver images clean

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

DEBOOTSTRAP := /usr/sbin/debootstrap
$(DEBOOTSTRAP):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null

$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

# Debian packages whose services the tests start themselves, never apt: a policy-rc.d
# keeps apt from starting them (container images have one; one is put in place for the
# install if not).
APT_WITHOUT_SERVICES = set -e; added=; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
	  printf '\#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; added=1; \
	fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
	if [ -n "$$added" ]; then rm -f /usr/sbin/policy-rc.d; fi

# OpenSSH's server, for the tests' simulated compute hosts (an sshd each on its own
# loopback address, started and stopped by the tests), never as a service listening
# on every address.
SSHD := /usr/sbin/sshd
$(SSHD):
	$(call APT_WITHOUT_SERVICES,openssh-server)

install: $(VENV)/.installed $(CHP)

# As root, the demo's notebooks run as an unprivileged account (composespawner-nb),
# which must reach this venv's Python and this checkout (the kit merge runs from it):
# a checkout in root's home, or a Python under it (pyenv), needs an ACL that lets
# that account alone enter the closed folders on the way (setfacl, Debian's acl).
notebook-account: $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ]; then \
	  command -v setfacl >/dev/null || (apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null); \
	  $(BIN)/composespawner notebook-account; \
	fi

# The OpenID Connect provider the login tests run (panva's oidc-provider).
OIDC_PROVIDER := tests/support/oidc_provider/node_modules/.installed
$(OIDC_PROVIDER): tests/support/oidc_provider/package.json tests/support/oidc_provider/package-lock.json
	cd tests/support/oidc_provider && npm ci --no-audit --no-fund --loglevel=error
	touch $@

install-test: $(VENV)/.installed-test $(CHP) $(CHROMIUM) $(DEBOOTSTRAP) $(SSHD) $(OIDC_PROVIDER) notebook-account

demo: install notebook-account labextension demo-images
	$(BIN)/composespawner demo

# Where it can (as root: podman and debootstrap come from Debian), the demo's notebooks
# run in containers of their own from the stacks' images, built here the first time
# (minutes) and cached after: the default stack's before the hub starts, the others in
# the background (the hub reads the record at each start: they join when built, and a
# build cut short by Ctrl-C goes on in its own session). Elsewhere, or where the build
# fails, they run as local processes, and `composespawner demo` says why.
DEFAULT_STACK := pytorch
demo-images:
	@if [ "$$(id -u)" = 0 ]; then \
	  if $(MAKE) --no-print-directory images IMAGES_OF="--stack $(DEFAULT_STACK)"; then \
	    setsid flock --nonblock $(IMAGES_LOCK) $(BIN)/python -m harness.images \
	      >$(CACHE_DIR)/images-background.log 2>&1 </dev/null & \
	    echo "make demo: the other stacks' images build in the background ($(CACHE_DIR)/images-background.log)"; \
	  else echo "make demo: the stacks' images could not be built (above): notebooks run as processes"; fi; fi

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# The stacks' environments, built once per lock and kept in /var/cache (~/.cache
# when not root): every server in the tests runs on one, and a first build takes
# minutes that no single test should wait for.
stacks: $(VENV)/.installed labextension
	$(BIN)/composespawner build-stacks -f hub_config/jupyterhub_config.py

# The stacks' CPU notebook images (harness/images.py): a Debian base made with debootstrap
# (no base image can be pulled here), each stack's Dockerfile built on it with rootful
# podman and runc, the network off and the lock's wheels mounted, then pushed by digest
# to docker-registry on 127.0.0.1:5000. Kept in ~/.cache/composespawner by their inputs:
# minutes the first time, seconds after. apt must not start a registry of its own.
PODMAN := /usr/bin/podman
$(PODMAN):
	$(call APT_WITHOUT_SERVICES,podman buildah runc docker-registry)

# One build at a time (the demo's background one, a test run's): they share the cache.
CACHE_DIR := $(HOME)/.cache/composespawner
IMAGES_LOCK := $(CACHE_DIR)/images.lock
images: $(VENV)/.installed $(PODMAN) $(DEBOOTSTRAP) labextension
	mkdir -p $(CACHE_DIR)
	flock $(IMAGES_LOCK) $(BIN)/python -m harness.images $(IMAGES_OF)

# The real kube-apiserver (v1.20.2) tests/kubernetes runs against, built once into
# ~/.cache from Debian's source package: minutes the first time, instant after
# (../shared/tools/kube-apiserver/README.md).
kube-apiserver:
	bash ../shared/tools/kube-apiserver/build.sh >/dev/null

# The JupyterLab extension every stack's notebooks get (labextension/build.sh): npm ci,
# tsc and JupyterLab's builder the first time (a minute or two), cached in
# ~/.cache/composespawner/labextension-<hash of lock and sources> and instant after.
labextension: $(VENV)/.installed
	bash labextension/build.sh $(VENV)

pytest: install-test labextension stacks kube-apiserver images
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: install-test
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# Pin each stack anew from its .in files (images/STACK/requirements-{gpu,cpu}.lock):
# the GPU lock first, then the CPU lock held to the GPU lock's versions, so the two
# differ only in accelerator wheels. CPU_WHEELS is where PyTorch's CPU builds are
# (https://download.pytorch.org/whl/cpu/torch/ off this network).
STACKS := pytorch tensorflow
CPU_WHEELS ?= /opt/wheels
LOCK = ../../$(BIN)/uv pip compile --quiet --no-header --generate-hashes \
	--python-version 3.11 --python-platform x86_64-manylinux_2_28
locks: $(VENV)/.installed-test
	$(PIP) install -c constraints.txt uv
	for stack in $(STACKS); do \
	  (cd images/$$stack && $(LOCK) gpu.in -o requirements-gpu.lock && \
	   $(LOCK) --find-links $(CPU_WHEELS) -c requirements-gpu.lock cpu.in \
	     -o requirements-cpu.lock) || exit 1; \
	done

clean:
	rm -rf $(VENV) node_modules .demo .demo-homes test-artifacts
