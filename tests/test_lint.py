"""Lint and format are checked, not hoped for: ``ruff check`` and ``ruff format --check`` pass on the
whole repository (the package, tests, benchmarks and research) with the settings of ``pyproject.toml``
(``[tool.ruff]``: line length 120; pycodestyle, Pyflakes, isort and pyupgrade rules; notebooks excluded).

On a failure the message is ruff's own report: the findings (``file:line:col: code message``) or the
diff that ``ruff format`` would apply. Fix them with ``ruff check --fix`` / ``ruff format`` or by hand.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff_command() -> list[str]:
    """How to run ruff from this interpreter's environment; ruff is a dev dependency, so an environment
    without it fails here rather than passing the lint check unseen."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    pytest.fail("ruff is not installed in this environment (it is a dev dependency: pip install -e '.[dev]')")


def run_ruff(*args: str) -> subprocess.CompletedProcess[str]:
    # --no-cache: the check must not write into the checkout; the repository's pyproject.toml is found from cwd
    command = [*ruff_command(), *args, "--no-cache", "."]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def assert_passes(result: subprocess.CompletedProcess[str]) -> None:
    """Exit status 0, else fail with ruff's own output (and nothing of this file's traceback)."""
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(result.args)} exited {result.returncode}:\n{result.stdout}{result.stderr}", pytrace=False
        )


def test_ruff_check_passes():
    assert_passes(run_ruff("check", "--output-format", "concise"))


def test_ruff_format_leaves_every_file_unchanged():
    assert_passes(run_ruff("format", "--check", "--diff"))
