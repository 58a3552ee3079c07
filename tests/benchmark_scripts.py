"""Benchmark scripts (``benchmarks/*.py``) imported by path for tests of their statistics and reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(stem: str) -> ModuleType:
    """``benchmarks/<stem>.py`` as the module ``<stem>_bench`` (registered in ``sys.modules``, so that
    its dataclasses and pickling work; the scripts add ``benchmarks/`` to ``sys.path`` themselves)."""
    spec = importlib.util.spec_from_file_location(f"{stem}_bench", BENCHMARKS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
