# One entry point for everything. Run `make help` for the list.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
SCALE ?= cpu
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: help install book chapters runs reproduce test test-wheel test-pages-native test-pages-portable bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(VENV)/.installed: requirements.txt requirements.lock pyproject.toml lib/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(PY) -m pip install --quiet --no-deps -e lib -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (manifold-muon)" >/dev/null
	touch $@

install: $(VENV)/.installed  ## create .venv with the pinned dependencies and the three packages of lib/ in editable mode

runs: install  ## execute the run notebooks whose outputs are missing or stale (SCALE=cpu)
	$(PY) -m manifold_muon_book.pipeline runs --scale $(SCALE)

chapters: install  ## sync .md -> .ipynb and execute the chapters that are stale
	$(PY) -m manifold_muon_book.pipeline chapters

book: runs chapters  ## build the HTML book offline (warnings are errors)
	$(BIN)/jupyter-book build . --warningiserror --keep-going --quiet
	@echo "Open the book: file://$(CURDIR)/_build/html/index.html"

reproduce: install  ## re-execute every run notebook at SCALE (default cpu), then build the book
	$(PY) -m manifold_muon_book.pipeline runs --scale $(SCALE) --force
	$(MAKE) book SCALE=$(SCALE)

# nbval re-executes every page and compares its outputs with the stored ones (figures: checked to exist).
NBVAL = $(PY) -m pytest --nbval chapters/*.ipynb book/claims.ipynb -p manifold_muon_book.nbval_figures \
	--nbval-sanitize-with chapters/nbval_sanitize.cfg -p no:cacheprovider
# A second numerics personality: MKL's conditional-reproducibility mode and torch's generic CPU kernels take
# other code paths, as another CPU would. The stored outputs must pass under both.
PORTABLE_ENV = MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default

test: install  ## lib tests, the wheel, nbval on the pages (two numerics personalities), smoke runs, quick benchmarks
	$(PY) -m pytest tests
	$(MAKE) --no-print-directory test-wheel
	$(MAKE) --no-print-directory -j2 --output-sync=target test-pages-native test-pages-portable
	$(PY) -m manifold_muon_book.pipeline smoke
	$(PY) -m manifold_muon_book.bench --quick --out runs/_smoke/bench

WHEEL_DIR := build/wheel
test-wheel: install  ## build the optimizer library's wheel, install it alone in a fresh virtualenv, run its README example
	rm -rf $(WHEEL_DIR) lib/build lib/*.egg-info
	$(PY) -m pip wheel --no-deps --no-build-isolation --quiet -w $(WHEEL_DIR) lib
	rm -rf lib/build lib/*.egg-info
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/pip install --quiet $(WHEEL_DIR)/manifold_muon-*.whl -c requirements.lock
	cd $(WHEEL_DIR) && venv/bin/python $(CURDIR)/tests/wheel_smoke.py $(CURDIR)/lib/manifold_muon/README.md

test-pages-native: install  ## nbval on every page, as this CPU computes
	$(NBVAL)

test-pages-portable: install  ## nbval on every page under the second numerics personality
	$(PORTABLE_ENV) $(NBVAL)

bench: install  ## micro-benchmarks, written under runs/bench/
	$(PY) -m manifold_muon_book.bench

clean:  ## remove the build, caches and the virtual environment
	rm -rf _build build .pytest_cache .hypothesis runs/_smoke $(VENV)
	find . -name __pycache__ -prune -exec rm -rf {} +
