# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-all bench bench-quick install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[dev,tutorials]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pyro-invariance demo --out results/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

# Benchmarks write their markdown tables under benchmarks/results/.
bench: $(STAMP)
	$(BIN)/python benchmarks/step_time.py
	$(BIN)/python benchmarks/invariant_mlp_tables.py
	$(BIN)/python benchmarks/noether_tables.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/step_time.py --quick
	$(BIN)/python benchmarks/invariant_mlp_tables.py --quick

clean:
	rm -rf $(VENV) results .pytest_cache
