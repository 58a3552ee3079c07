"""The Sphinx documentation builds with warnings as errors (the same build as `make docs`).

Every docstring is rendered here, so bad reStructuredText or a cross-reference to a name that
does not exist fails this test (conf.py sets ``nitpicky``; see ``_resolve_existing`` there).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("myst_nb", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]


def _all_modules() -> list[str]:
    package = importlib.import_module("pyro_invariance")
    names = ["pyro_invariance"]
    for info in pkgutil.walk_packages(package.__path__, prefix="pyro_invariance."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"sphinx-build failed ({proc.returncode}):\n{proc.stderr[-6000:]}"

    for page in ("index", "methods", "tutorials", "api/index"):
        assert (out / f"{page}.html").is_file(), page
    rendered = sorted(p.stem for p in (out / "tutorials").glob("*.html"))
    notebooks = sorted(p.stem for p in (ROOT / "tutorials").glob("*.ipynb"))
    assert rendered == notebooks

    # Every public module has an entry (the api-module directive finds them itself).
    modindex = (out / "py-modindex.html").read_text(encoding="utf-8")
    missing = [name for name in _all_modules() if f">{name}<" not in modindex]
    assert not missing, f"modules without an API entry: {missing}"
