"""Benchmark-script tests: one torch thread (the machines are shared), and ``benchmarks/`` on ``sys.path`` so that
the scripts import as modules (``import full_rank_defaults``) and find ``_common`` as they do when run."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1]
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

torch.set_num_threads(1)
