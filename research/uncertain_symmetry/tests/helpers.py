"""Helpers of the research tests: the scripts imported by path, a small fitted-guide setup, and tiny IDX
image files."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from pyro_invariance import guides
from pyro_invariance.diagnostics.reference import entry
from pyro_invariance.infer.training import set_up_guide

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(stem: str) -> ModuleType:
    """``scripts/<stem>.py`` as the module ``<stem>_bench`` (registered in ``sys.modules``, so that its
    dataclasses and pickling work; the scripts add ``scripts/`` and the repository root to ``sys.path``
    themselves)."""
    spec = importlib.util.spec_from_file_location(f"{stem}_bench", SCRIPTS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def basis_lambda_conditional(**guide_kw: Any) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """``(model, guide, x, y)``: the ``basis-regression-lambda`` reference model and data with a set-up
    symmetry-conditional guide (``guide_kw`` passed to it)."""
    model, x, y = entry("basis-regression-lambda").build()
    guide = guides.get("symmetry-conditional", model, **guide_kw)
    set_up_guide(model, guide, x[:2], y[:2], num_data=x.shape[0])
    return model, guide, x, y


def write_mnist_like(folder: Path, n_train: int = 20, n_test: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Tiny random 28×28 uint8 IDX files with MNIST's file names (uncompressed); returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():  # IDX: zero, type code 0x08 (uint8), rank, big-endian sizes, the bytes
        header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
        (folder / stem).write_bytes(header + array.tobytes())
    return arrays
