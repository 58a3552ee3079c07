"""The investigation's notebook (``research/uncertain_symmetry/notebook.ipynb``) runs top to bottom at
smoke-test size, as the library's tutorials do (``tests/test_tutorials.py``): read into memory, executed
with nbclient on the ``python3`` kernel with ``CI=1`` (its setup cell's ``smoke_test``) in a temporary
working directory, the file itself never modified. The kernel finds the research package through
``PYTHONPATH`` (the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebook.ipynb"
ROOT = Path(__file__).resolve().parents[3]
CELL_TIMEOUT_S = 600


def test_notebook_setup_follows_pyro_conventions() -> None:
    """The first code cell: ``smoke_test = ("CI" in os.environ)``, a seed, a version assert."""
    notebook = nbformat.reads(NOTEBOOK.read_text(encoding="utf-8"), as_version=4)
    setup = next(c.source for c in notebook.cells if c.cell_type == "code")
    assert 'smoke_test = ("CI" in os.environ)' in setup
    assert "pyro.set_rng_seed(" in setup
    assert "assert pyro.__version__.startswith(" in setup and "pi.__version__" in setup


def test_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # conftest's Agg: the kernel picks Jupyter's inline backend
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    original = NOTEBOOK.read_bytes()
    notebook = nbformat.reads(original.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{NOTEBOOK.name}: a cell raised\n{exc}")
    assert NOTEBOOK.read_bytes() == original, f"{NOTEBOOK.name} was modified by the test"
