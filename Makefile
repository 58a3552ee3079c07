# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# ArviZ 1.x needs Python >= 3.12, for which no torch wheel is on the project's machines: a second,
# torch-free environment tests pyro_invariance/diagnostics/arviz_compat.py there (tests/diagnostics/test_arviz_compat.py).
# Its interpreter: python3.12 / python3.13 if they run (a pyenv shim may not), else pyenv's versions.
PY312 = $(shell for p in python3.12 python3.13 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v "$$p"; break; }; done)
VENV1  := .venv-arviz1
STAMP1 := $(VENV1)/.installed
ARVIZ1_DEPS := "arviz>=1" numpy scipy pytest matplotlib

.PHONY: demo data test test-arviz1 test-slow test-all research-test bench bench-quick references install docs clean

# pyproject.toml gives version ranges; constraints.txt pins the exact versions that resolve offline
# here (torch and torchvision from the local wheel store).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,tutorials,docs]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# Offline 28×28 images (Fashion-MNIST) from Debian's dataset-fashion-mnist, for the tests and tables
# that read real files; needs root (CI) or sudo.
FASHION_DIR := /usr/share/datasets/fashion-mnist
data:
	@if [ -d $(FASHION_DIR) ]; then echo "data: $(FASHION_DIR) present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	else echo "data: run 'sudo apt-get install dataset-fashion-mnist' for $(FASHION_DIR)"; exit 1; fi

demo: $(STAMP)
	$(BIN)/pyro-invariance demo --out results/demo --overwrite

# The ArviZ 1.x tests run first (≈1 min to install on first use, seconds after), when a Python
# >= 3.12 exists; the main suite's summary is the last line. The suite runs in TEST_WORKERS processes
# (pytest-xdist; one torch thread each, tests/conftest.py), one test file per worker at a time so that
# a module's fixtures run once; the 15 slowest tests are listed, to keep the suite within 10 minutes.
TEST_WORKERS ?= 2
test: $(STAMP)
	@if [ -n "$(PY312)" ]; then $(MAKE) --no-print-directory test-arviz1; \
	else echo "make test: NOT RUN: the ArviZ 1.x tests (no Python >= 3.12 found); install one, then make test-arviz1"; fi
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=15

$(STAMP1):
	@test -n "$(PY312)" || { echo "test-arviz1: no Python >= 3.12 found (python3.12, python3.13, pyenv versions)"; exit 1; }
	test -x $(VENV1)/bin/python || $(PY312) -m venv $(VENV1)
	$(VENV1)/bin/pip install -q --upgrade pip
	$(VENV1)/bin/pip install -q $(ARVIZ1_DEPS)
	touch $(STAMP1)

# ArviZ 1.x (xarray.DataTree) side of arviz_compat, without torch.
test-arviz1: $(STAMP1)
	$(VENV1)/bin/python -m pytest -q tests/diagnostics/test_arviz_compat.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

# The research in research/ (outside the package and the default suite): its own tests.
research-test: $(STAMP)
	$(BIN)/python -m pytest -q research/

# NUTS reference posteriors (pyro_invariance/diagnostics/reference/posteriors/): regenerate, then check R-hat / ESS.
references: $(STAMP)
	$(BIN)/python -m pyro_invariance.diagnostics.reference regenerate
	$(BIN)/python -m pyro_invariance.diagnostics.reference check

# Benchmarks write their markdown tables under benchmarks/results/.
bench: $(STAMP)
	$(BIN)/python benchmarks/timing.py --section step,guides,import
	$(BIN)/python benchmarks/invariant_mlp_tables.py
	$(BIN)/python benchmarks/noether_tables.py
	$(BIN)/python benchmarks/threebody_recipe.py
	$(BIN)/python benchmarks/eta_learning.py
	$(BIN)/python benchmarks/kepler_noether.py
	$(BIN)/python benchmarks/kepler_noether.py --recipe warm
	$(BIN)/python benchmarks/full_rank_defaults.py
	$(BIN)/python benchmarks/guide_convergence.py
	$(BIN)/python benchmarks/guide_comparison.py --model basis-regression
	$(BIN)/python benchmarks/guide_comparison.py --model invariant-mlp
	$(BIN)/python benchmarks/guide_comparison.py --model symmetrised-hnn
	$(BIN)/python benchmarks/layerwise_tables.py --table 1
	$(BIN)/python benchmarks/layerwise_tables.py --table 1 --base fashion-mnist --size 16
	$(BIN)/python benchmarks/layerwise_tables.py --table 2
	$(BIN)/python benchmarks/layerwise_tables.py --table 3
	$(BIN)/python benchmarks/layerwise_tables.py --table 2 --laplace-curvature kfac
	$(BIN)/python benchmarks/layerwise_tables.py --table 3 --laplace-curvature kfac
	$(BIN)/python benchmarks/layerwise_tables.py --table seeds
	$(BIN)/python benchmarks/layerwise_tables.py --table cost --alpha 2
	$(BIN)/python benchmarks/layerwise_kfac.py --variants fc+conv,conv,fc,f-fc+conv
	$(BIN)/python benchmarks/guide_comparison.py --model layerwise-fc+conv

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/timing.py --section step,guides --quick
	$(BIN)/python benchmarks/invariant_mlp_tables.py --quick
	$(BIN)/python benchmarks/layerwise_tables.py --table 1 --quick
	$(BIN)/python benchmarks/layerwise_kfac.py --quick --seeds 0 --variants fc+conv --methods 'Laplace KFAC (gradient)' --starts equivariant

# API reference, method notes and the tutorials (not executed) as HTML in docs/_build/html;
# warnings are errors (tests/test_docs.py runs the same build).
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

clean:
	rm -rf $(VENV) $(VENV1) results .pytest_cache docs/_build docs/jupyter_execute docs/api/generated
