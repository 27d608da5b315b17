# Two commands for a fresh machine: `make run` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup system-packages run demo test bench check clean

setup: system-packages $(INSTALLED)

system-packages:
	@scripts/install-system-packages.sh

$(INSTALLED): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]'
	@touch $@

run: setup
	$(VENV)/bin/aio-dms demo

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) benchmarks/waits.py

check: setup
	$(PY) -m ruff check aio_runtime transports pipelines tests benchmarks
	$(PY) -m mypy --strict aio_runtime transports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
