"""Checkpoints that let training resume bit-for-bit.

On the CPU a resumed run is identical to an uninterrupted one (tested). The CUDA RNG states are
saved too; a 20-step InvariantMLP run resumed at step 9 on an H200 matched bit-for-bit, but some
CUDA kernels (``grid_sample``'s backward) accumulate with atomics and are not guaranteed to.

A checkpoint holds everything the next step depends on: model and guide state, optimiser and
learning-rate schedule state, every random number generator (torch, Python, NumPy, and the
minibatch shuffler), the position in the current epoch, the history so far, and the settings
(a resumed run must use the same ones).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "pyro_invariance.checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, or does not match the model/guide/settings."""


def rng_state() -> dict[str, Any]:
    """The global RNG states (torch, Python ``random``, NumPy) in a loadable form."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "random": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": FORMAT, **payload}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint; a missing, truncated or foreign file raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        # Checkpoints hold Python RNG state and settings, not only tensors: load only your own files.
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises many types for damaged files
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or not a torch file: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a pyro_invariance checkpoint (format {FORMAT})")
    missing = {"step", "model", "guide", "optimizer", "scheduler", "rng", "config", "history"} - set(payload)
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {sorted(missing)}")
    return payload
