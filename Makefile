# Two commands for a fresh machine: `make run` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup system-packages run demo test docs wheel-check bench check clean

setup: system-packages $(INSTALLED)

system-packages:
	@scripts/install-system-packages.sh

$(INSTALLED): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test,umockdev,dev,docs]'
	@touch $@

run: setup
	$(VENV)/bin/aio-dms run --duration 10

# Three steps. The ordinary suite, where a test that hangs fails by pytest-timeout's signal
# method and the run goes on; the fleet tests, on one local Ray cluster started for them (and a
# two-node one), ending only the processes they started; then the emulated-USB tests (real libusb
# against the simulated bridge served by umockdev) in a process of their own under
# umockdev-wrapper, where AIO_DMS_REQUIRE_UMOCKDEV=1 turns a missing emulation into failures and
# any skip into a failed run. The last two wait inside native code (Ray's core worker, libusb),
# where a signal may never be handled: a hang there ends the step by pytest-timeout's thread method.
test: setup
	$(PY) -m pytest --ignore=tests/umockdev --ignore=tests/fleet
	$(PY) -m pytest tests/fleet --timeout-method=thread
	AIO_DMS_REQUIRE_UMOCKDEV=1 umockdev-wrapper $(PY) -m pytest tests/umockdev --timeout=30 --timeout-method=thread

# The documentation site (mkdocs.yml, docs/; API pages from the docstrings) into site/. --strict:
# any warning fails the build, a broken link, anchor or cross-reference included.
docs: setup
	$(PY) -m mkdocs build --strict --site-dir site

# The built wheel as users install it, in fresh virtual environments (packages from PyPI): bare,
# the runtime core and the transports; with the dms extra, the DMS service, a user's pytest file on
# the aio_runtime plugin, and mypy over a user's code typed against the service; then the video,
# report and fleet extras added, with the installed size of each.
wheel-check: setup
	scripts/wheel-check/check.sh $(PY)

# As modules: benchmarks/copy.py is named after the protocol it measures, and run as a script from
# that folder it would stand in for the standard library's copy module.
bench: setup
	$(PY) -m benchmarks.waits
	$(PY) -m benchmarks.copy
	$(PY) -m benchmarks.warp
	$(PY) -m benchmarks.model
	$(PY) -m benchmarks.pipeline
	$(PY) -m benchmarks.zmq_memory
	$(PY) -m benchmarks.recovery
	$(PY) -m benchmarks.load
	$(PY) -m benchmarks.slow_host
	$(PY) -m benchmarks.soak
	$(PY) -m benchmarks.embed
	$(PY) -m benchmarks.segment
	$(PY) -m benchmarks.fleet
	$(PY) -m benchmarks.fleet_compare

check: setup
	$(PY) -m ruff check aio_runtime transports pipelines tests benchmarks examples scripts
	$(PY) -m mypy --strict aio_runtime transports pipelines

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
