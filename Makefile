# One entry point for everything. Run `make help` for the list.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
SCALE ?= cpu
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: help install book html chapters runs reproduce gpu-dry test test-wheel test-pages-native test-pages-portable test-browser test-workflow browser bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(VENV)/.installed: requirements.txt requirements.lock pyproject.toml lib/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(PY) -m pip install --quiet --no-deps -e ./lib -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (manifold-muon)" >/dev/null
	touch $@

# The book's static assets: MathJax from the npm package pinned in package-lock.json, copied into the book's
# own _static (SVG output: no web fonts), so that no page loads a script, font or stylesheet from another host.
MATHJAX := book/_static/mathjax
$(MATHJAX)/tex-svg-full.js: package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf $(MATHJAX) && mkdir -p $(MATHJAX)
	cp -r node_modules/mathjax/LICENSE node_modules/mathjax/es5/tex-svg-full.js node_modules/mathjax/es5/a11y \
		node_modules/mathjax/es5/adaptors node_modules/mathjax/es5/input node_modules/mathjax/es5/output \
		node_modules/mathjax/es5/sre node_modules/mathjax/es5/ui $(MATHJAX)/
	touch $@

install: $(VENV)/.installed $(MATHJAX)/tex-svg-full.js  ## create .venv with the pinned dependencies and the three packages of lib/ in editable mode; copy MathJax into book/_static

runs: install  ## execute the run notebooks whose outputs are missing or stale (SCALE=cpu)
	$(PY) -m manifold_muon_book.pipeline runs --scale $(SCALE)

chapters: install  ## sync .md -> .ipynb and execute the chapters that are stale
	$(PY) -m manifold_muon_book.pipeline chapters

book: runs chapters  ## build the HTML book offline (warnings are errors)
	$(MAKE) --no-print-directory html

html: install  ## build the HTML from the stored notebooks only, executing nothing (what make test and CI publish)
	$(BIN)/jupyter-book build . --warningiserror --keep-going --quiet
	@echo "Open the book: file://$(CURDIR)/_build/html/index.html"

reproduce: install  ## re-execute every run notebook at SCALE (default cpu), then build the book; a GPU scale is refused without CUDA unless ALLOW_CPU=1
	$(PY) -m manifold_muon_book.pipeline runs --scale $(SCALE) --force $(if $(ALLOW_CPU),--allow-cpu)
	$(MAKE) book SCALE=$(SCALE)

gpu-dry: install  ## every run notebook's GPU path (bf16 autocast, torch.compile, micro-batches) on the CPU, a few steps (runs/_smoke/)
	$(PY) -m manifold_muon_book.pipeline runs --scale gpu-dry

# nbval re-executes every page and compares its outputs with the stored ones (figures: checked to exist).
# The executed pages (a failed execution leaves chapters/*.failed.ipynb for reading; it is not a page)
PAGES = $(filter-out %.failed.ipynb,$(wildcard chapters/*.ipynb)) book/claims.ipynb
NBVAL = $(PY) -m pytest --nbval $(PAGES) -p manifold_muon_book.nbval_figures \
	--nbval-sanitize-with chapters/nbval_sanitize.cfg -p no:cacheprovider
# A second numerics personality: MKL's conditional-reproducibility mode and torch's generic CPU kernels take
# other code paths, as another CPU would. The stored outputs must pass under both.
PORTABLE_ENV = MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default

test: install browser  ## lib tests, the wheel, nbval on the pages (two numerics personalities), smoke and gpu-dry runs, quick benchmarks, the book in a browser
	$(PY) -m pytest tests
	$(MAKE) --no-print-directory test-wheel
	$(MAKE) --no-print-directory -j2 --output-sync=target test-pages-native test-pages-portable
	$(PY) -m manifold_muon_book.pipeline smoke
	$(MAKE) --no-print-directory gpu-dry
	$(PY) -m manifold_muon_book.bench --quick --out runs/_smoke/bench
	$(MAKE) --no-print-directory test-workflow test-browser

WHEEL_DIR := build/wheel
test-wheel: install  ## build the optimizer library's wheel, install it alone in a fresh virtualenv, run its README example
	rm -rf $(WHEEL_DIR) lib/build lib/*.egg-info
	$(PY) -m pip wheel --no-deps --no-build-isolation --quiet -w $(WHEEL_DIR) ./lib
	rm -rf lib/build lib/*.egg-info
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/pip install --quiet $(WHEEL_DIR)/manifold_muon-*.whl -c requirements.lock
	cd $(WHEEL_DIR) && venv/bin/python $(CURDIR)/tests/wheel_smoke.py $(CURDIR)/lib/manifold_muon/README.md

test-pages-native: install  ## nbval on every page, as this CPU computes
	$(NBVAL)

test-pages-portable: install  ## nbval on every page under the second numerics personality
	$(PORTABLE_ENV) $(NBVAL)

# The browser test: Debian's chromium (installed with apt-get when missing; never a browser download at run
# time) opens every page of the built book from file://, refusing every request to another host.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:  ## install Debian's chromium for the browser test if it is missing
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

test-browser: install browser  ## build the HTML book, then open every page in headless Chromium offline (screenshots: build/browser/)
	$(MAKE) --no-print-directory html
	$(PY) -m manifold_muon_book.browser_check _build/html --out build/browser

test-workflow: install  ## check the GitHub Actions workflows and CITATION.cff against their schemas (offline)
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/check-jsonschema --builtin-schema vendor.citation-file-format CITATION.cff

bench: install  ## micro-benchmarks, written under runs/bench/
	$(PY) -m manifold_muon_book.bench

clean:  ## remove the build, caches and the virtual environment
	rm -rf _build build .pytest_cache .hypothesis runs/_smoke $(VENV) node_modules $(MATHJAX)
	find . -name __pycache__ -prune -exec rm -rf {} +
