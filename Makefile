# Every target creates or updates the local virtual environment by itself, so the two
# README commands work on a fresh machine with only Python 3 and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/memtop --demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python bench/run.py

lint: $(STAMP)
	$(BIN)/ruff check protocol agent tui tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
