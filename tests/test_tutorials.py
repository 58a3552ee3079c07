"""Every notebook in ``tutorials/`` runs top to bottom at smoke-test size.

Each ``tutorials/*.ipynb`` (found by glob, so new tutorials are covered without editing this file) is
read into memory and executed with nbclient on the ``python3`` kernel, with ``CI=1`` (Pyro's tutorial
convention: each notebook's setup cell sets ``smoke_test = ("CI" in os.environ)`` and shrinks every
size; it also seeds Pyro and asserts the Pyro version), in a temporary working directory: the notebook
file is never modified and the files a notebook writes (under ``results/``) land in the temporary
directory. Any cell that raises fails the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("jupyter_client.kernelspec")

TUTORIALS_DIR = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS_DIR.glob("*.ipynb"))
KERNEL = "python3"
CELL_TIMEOUT_S = 600  # per cell; at smoke-test size a whole notebook takes well under a minute


def test_tutorials_exist() -> None:
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_setup_follows_pyro_conventions(path: Path) -> None:
    """The first code cell: ``smoke_test = ("CI" in os.environ)``, a seed, a version assert."""
    notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    setup = next(c.source for c in notebook.cells if c.cell_type == "code")
    assert 'smoke_test = ("CI" in os.environ)' in setup
    assert "pyro.set_rng_seed(" in setup
    assert "assert pyro.__version__.startswith(" in setup and "pi.__version__" in setup
    assert "PYRO_INVARIANCE_TUTORIAL_SMALL" not in path.read_text(encoding="utf-8")


def _check_kernel() -> None:
    """Fail clearly when the ``python3`` kernel is not this environment's interpreter."""
    try:
        spec = kernelspec.KernelSpecManager().get_kernel_spec(KERNEL)
    except kernelspec.NoSuchKernel:
        pytest.fail(f"no Jupyter kernel {KERNEL!r}; run `{sys.executable} -m ipykernel install --sys-prefix`")
    exe = Path(spec.argv[0])
    if exe.name.startswith("python") and exe.is_absolute():
        here, there = Path(sys.prefix).resolve(), exe.resolve().parent.parent
        if here != there and Path(sys.executable).resolve() != exe.resolve():
            pytest.fail(
                f"kernel {KERNEL!r} runs {exe}, not this environment ({sys.prefix}); "
                f"run `{sys.executable} -m ipykernel install --sys-prefix` or remove the other kernelspec "
                f"({spec.resource_dir})"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_kernel()
    # The kernel process inherits this environment: CI=1 is Pyro's smoke-test switch.
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # conftest's Agg: the kernel picks Jupyter's inline backend
    original = path.read_bytes()
    notebook = nbformat.reads(original.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell raised\n{exc}")
    assert path.read_bytes() == original, f"{path.name} was modified by the test"
