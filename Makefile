# Every target creates or updates the local virtual environment by itself, so the two
# README commands work on a fresh machine with only Python 3 and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# .[dev] (the tests, lint, benchmarks; it includes .[tui]) and .[tui] (what memtop --demo runs
# on): `make demo` on a fresh machine installs no dev tools.
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
# `make bundle`: dist/memagent-VERSION-linux-ARCH-pyXY.tar.gz for $(PYTHON)'s version and this
# machine (README, "On a box"); BUNDLE_FLAGS e.g. --python-version 3.10 --platform manylinux2014_aarch64.
DIST   ?= dist
BUNDLE_FLAGS ?=
# `make lint` warns of a source module past this many lines (a warning: complexity is the
# rule, ruff's C901 in pyproject.toml).
LONG_MODULE ?= 600

.PHONY: demo test test-fast test-under-load bench lint clean venv bundle

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[tui]'
	touch $(RUN_STAMP)

demo: $(RUN_STAMP)
	$(BIN)/memtop --demo

bundle:
	$(PYTHON) packaging/build_bundle.py --out $(DIST) $(BUNDLE_FLAGS)

test: $(STAMP)
	$(BIN)/python -m pytest tests

# The contributor's loop: every test that starts no process (tests/tiers.py), in seconds.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not e2e" -q tests

# The check of the check: the whole suite with two CPU hogs on the box (tests/load/).
test-under-load: $(STAMP)
	tests/load/run_under_load.sh $(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python bench/run.py

lint: $(STAMP)
	$(BIN)/ruff check protocol agent tui tests bench packaging
	$(BIN)/mypy
	$(BIN)/mypy packaging/build_bundle.py packaging/wheel_closure.py
	$(BIN)/lint-imports --no-cache
	@# Long modules: a warning, never a failure (docs/architecture.md, "Size and complexity").
	@find protocol agent tui -name '*.py' -exec wc -l {} + | sort -k2 | \
		awk '$$2 != "total" && $$1 > $(LONG_MODULE) \
			{ print "warning: " $$2 " has " $$1 " lines (> $(LONG_MODULE)): split it along its seams" }'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
