# Two commands on a fresh machine: `make demo` runs the demo, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFORMANCE := .venv-sglang
DEPLOY := .venv-deploy

.PHONY: demo test environments check lint types unit soak conformance-env deploy-env clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# SGLang's own protocol models, in an environment of their own (sglang pins openai).
$(CONFORMANCE)/.installed: tests/conformance/requirements.txt
	$(PYTHON) -m venv $(CONFORMANCE)
	$(CONFORMANCE)/bin/pip install --quiet --upgrade pip
	$(CONFORMANCE)/bin/pip install --quiet --no-deps -r tests/conformance/requirements.txt
	touch $@

conformance-env: $(CONFORMANCE)/.installed

# SGLang's argument parser for the launch scripts in deploy/ (tests/test_deploy.py): it needs
# torch, which pip takes as the CPU wheel, and no CUDA, GPU or model.
$(DEPLOY)/.installed: tests/deploy/requirements.txt
	$(PYTHON) -m venv $(DEPLOY)
	$(DEPLOY)/bin/pip install --quiet --upgrade pip
	$(DEPLOY)/bin/pip install --quiet --no-deps -r tests/deploy/requirements.txt
	touch $@

deploy-env: $(DEPLOY)/.installed

demo: $(BIN)/.installed
	$(BIN)/specroute demo

# The three environments install side by side (each its own pip), then every check runs.
test:
	$(MAKE) -j3 environments
	$(MAKE) check

environments: $(BIN)/.installed $(CONFORMANCE)/.installed $(DEPLOY)/.installed

check: lint types unit

lint: $(BIN)/.installed
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# mypy cannot follow the package-dir mapping (the editable install resolves it with an
# import hook), so it reads the package through a tree of links laid out as installed.
TYPED := build/typecheck/specroute
types: $(BIN)/.installed
	rm -rf $(TYPED) && mkdir -p $(TYPED)
	ln -s $(CURDIR)/specroute/*.py $(TYPED)/
	for d in bench emulator policies profiler router; do ln -s $(CURDIR)/$$d $(TYPED)/$$d; done
	$(BIN)/mypy

unit: $(BIN)/.installed $(CONFORMANCE)/.installed $(DEPLOY)/.installed
	$(BIN)/pytest

# 100,000 requests through one router, memory and descriptors sampled (about 2 minutes)
soak: $(BIN)/.installed
	$(BIN)/specroute bench soak --requests 100000 --out soak.json

clean:
	rm -rf $(VENV) $(CONFORMANCE) $(DEPLOY) build .mypy_cache .ruff_cache .pytest_cache
