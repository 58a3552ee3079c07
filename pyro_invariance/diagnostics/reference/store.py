"""Stored references: the draws and metadata of an entry, written and read back with checks.

Each reference is two files in :data:`REFERENCE_DIR` (package data)::

    posteriors/<name>.npz    float32 draws per site, (chain, draw, *site shape)
    posteriors/<name>.json   sampler settings, seed, R-hat / ESS, wall time, data settings and
                             fingerprint (:func:`data_fingerprint`), versions, date

:func:`save_reference` writes them and :func:`load_reference` reads them back, checking that the
two files agree.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pyro_invariance.diagnostics.reference.entries import ReferenceEntry, entry

__all__ = [
    "FORMAT_VERSION",
    "REFERENCE_DIR",
    "Reference",
    "ReferenceFileError",
    "data_fingerprint",
    "load_reference",
    "reference_paths",
    "save_reference",
]

#: Where the stored references live (package data).
REFERENCE_DIR = Path(__file__).resolve().parent / "posteriors"
#: File format version written into the metadata.
FORMAT_VERSION = 1


class ReferenceFileError(ValueError):
    """A stored reference is missing, corrupt or inconsistent with its metadata."""


@dataclass(eq=False)
class Reference:
    """Reference draws and their metadata.

    Attributes:
        name: the entry name.
        draws: site → float array ``(chain, draw, *site shape)``.
        metadata: the JSON record (see the module docstring).
    """

    name: str
    draws: dict[str, np.ndarray]
    metadata: dict[str, Any]

    @property
    def entry(self) -> ReferenceEntry:
        return entry(self.name)

    @property
    def sites(self) -> list[str]:
        return list(self.draws)

    @property
    def num_chains(self) -> int:
        return int(next(iter(self.draws.values())).shape[0])

    @property
    def num_draws(self) -> int:
        """Draws per chain."""
        return int(next(iter(self.draws.values())).shape[1])

    def flat(self, chains: Sequence[int] | None = None) -> np.ndarray:
        """All scalars side by side: ``(chains·draws, D)`` in site order (float64)."""
        parts = []
        for value in self.draws.values():
            v = value if chains is None else value[list(chains)]
            parts.append(v.reshape(v.shape[0] * v.shape[1], -1).astype(np.float64))
        return np.concatenate(parts, axis=1)

    def mean(self) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64).mean(axis=(0, 1)) for k, v in self.draws.items()}

    def var(self) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64).var(axis=(0, 1), ddof=1) for k, v in self.draws.items()}


def data_fingerprint(x: Tensor, y: Tensor) -> str:
    """sha256 of the data (float32 / int64 bytes): tells whether the data regenerate identically."""
    h = hashlib.sha256()
    for t in (x, y):
        a = t.detach().cpu()
        a = a.to(torch.float32) if a.is_floating_point() else a.to(torch.int64)
        h.update(str(tuple(a.shape)).encode())
        h.update(a.contiguous().numpy().tobytes())
    return h.hexdigest()


def reference_paths(name: str, directory: str | Path | None = None) -> tuple[Path, Path]:
    """``(<name>.npz, <name>.json)`` in ``directory`` (default :data:`REFERENCE_DIR`)."""
    d = Path(directory) if directory is not None else REFERENCE_DIR
    return d / f"{name}.npz", d / f"{name}.json"


def save_reference(reference: Reference, directory: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``<name>.npz`` (compressed float32 draws) and ``<name>.json`` into ``directory``
    (default :data:`REFERENCE_DIR`); returns both paths."""
    npz, meta = reference_paths(reference.name, directory)
    npz.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in reference.draws.items()}
    np.savez_compressed(npz, **arrays)
    meta.write_text(json.dumps(reference.metadata, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return npz, meta


def load_reference(name: str, directory: str | Path | None = None) -> Reference:
    """Stored draws and metadata of reference ``name`` (from ``directory``, default the package's).

    Raises:
        UnknownNameError: ``name`` is not in the catalogue (the message lists the known names).
        FileNotFoundError: a file is missing (the message says how to regenerate it).
        ReferenceFileError: a file is corrupt, or draws and metadata disagree.
    """
    e = entry(name)
    npz, meta = reference_paths(e.name, directory)
    regen = f"regenerate it with `python -m pyro_invariance.diagnostics.reference regenerate --name {e.name}`"
    for p in (npz, meta):
        if not p.is_file():
            raise FileNotFoundError(f"reference {e.name!r}: {p} does not exist; {regen}")
    metadata = _read_metadata(e.name, meta, regen)
    try:
        with np.load(npz, allow_pickle=False) as f:
            draws = {k: np.asarray(f[k]) for k in f.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as exc:
        raise ReferenceFileError(
            f"reference {e.name!r}: cannot read {npz} ({type(exc).__name__}: {exc}); {regen}"
        ) from None
    _check_draws(e.name, draws, metadata, f"{npz}", f"{meta}", regen)
    ordered = {k: draws[k] for k in metadata["sites"]}
    return Reference(e.name, ordered, metadata)


def _read_metadata(name: str, meta: Path, regen: str) -> dict[str, Any]:
    """The JSON record, with ``sites`` and ``diagnostics``; :class:`ReferenceFileError` otherwise."""
    try:
        metadata = json.loads(meta.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReferenceFileError(f"reference {name!r}: {meta} is not valid JSON ({exc}); {regen}") from None
    if not isinstance(metadata, dict) or "sites" not in metadata or "diagnostics" not in metadata:
        raise ReferenceFileError(f"reference {name!r}: {meta} lacks 'sites' / 'diagnostics'; {regen}")
    return metadata


def _check_draws(
    name: str, draws: dict[str, np.ndarray], metadata: dict[str, Any], npz: str, meta: str, regen: str
) -> None:
    """The draws hold the metadata's sites, with its shapes, finite floats only."""
    expected = {k: tuple(v) for k, v in metadata["sites"].items()}
    if set(draws) != set(expected):
        raise ReferenceFileError(
            f"reference {name!r}: {npz} holds sites {sorted(draws)} but {meta} lists {sorted(expected)}; {regen}"
        )
    chains, per_chain = metadata.get("num_chains"), metadata.get("draws_per_chain")
    for k in expected:
        shape = draws[k].shape
        if shape[2:] != expected[k] or (chains and shape[0] != chains) or (per_chain and shape[1] != per_chain):
            raise ReferenceFileError(
                f"reference {name!r}: site {k!r} has shape {shape}, metadata says "
                f"({chains}, {per_chain}, {', '.join(map(str, expected[k]))}); {regen}"
            )
        if not np.issubdtype(draws[k].dtype, np.floating) or not np.isfinite(draws[k]).all():
            raise ReferenceFileError(f"reference {name!r}: site {k!r} holds non-finite or non-float values; {regen}")
