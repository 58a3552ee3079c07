"""Checkpoints that resume bit-for-bit, load without executing code, and are never half-written.

A checkpoint holds everything the next step depends on: model and guide state, optimiser and
learning-rate schedule state, every random number generator (torch, Python, NumPy, and the
minibatch shuffler), the position in the current epoch, the history so far, the settings and a
*fingerprint* of the run (:mod:`pyro_invariance.infer.fingerprint`) that a resume must match.

Guarantees (tested in ``tests/infer/test_run_safety.py``):

* **Safe loading.** Files are read with ``torch.load(..., weights_only=True)``: the unpickler
  builds only tensors and plain containers, so a crafted file cannot run code. Every value the
  project writes is of that kind (RNG states are stored as tensors).
* **Integrity.** The payload carries a SHA-256 checksum of its canonical content
  (:func:`payload_digest`: every tensor's dtype, shape and bytes, every other value's ``repr``),
  verified on load: a flipped byte in tensor storage is refused, not loaded.
* **Atomic writes.** A checkpoint is written to a temporary file unique to the writer, flushed
  to disk (``fsync``) and renamed over the old one (``os.replace``): a crash, a full disk or a
  concurrent writer never leaves a truncated file at ``path``, and the previous checkpoint is
  kept whenever a write fails.
* **Reasons.** A file that cannot be read says why in one line: empty, truncated (its zip archive
  has no end: an incomplete copy), not a torch file at all, refused by the safe unpickler, or
  corrupt; a write that fails on a full disk says ``no space left on device`` even when the failure
  surfaces as torch's own zip-writer error (tested in ``tests/infer/test_checkpoint_io.py``).
* **Format version.** :data:`FORMAT` names the layout; other versions are refused with the reason.

On the CPU a resumed run is identical to an uninterrupted one. The CUDA RNG states are saved too;
for repeatable CUDA kernels see :func:`pyro_invariance.infer.training.make_deterministic`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "pyro_invariance.checkpoint/2"
REQUIRED = ("step", "model", "guide", "optimizer", "scheduler", "rng", "batches", "config", "history", "fingerprint")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, unwritable, or does not match the run."""


# ----------------------------------------------------------------------------------------------
# RNG states as tensors (loadable with weights_only=True)
# ----------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The global RNG states (torch, CUDA, Python ``random``, NumPy) as tensors and numbers."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "random": {"version": int(version), "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["random"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------
# Canonical digest of a payload
# ----------------------------------------------------------------------------------------------


def _update(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key, item in value.items():
            _update(h, key)
            _update(h, item)
    elif isinstance(value, (list, tuple)):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}".encode())
        for item in value:
            _update(h, item)
    else:
        h.update(f"V{type(value).__name__}:{value!r};".encode())


def payload_digest(payload: Any) -> str:
    """SHA-256 (hex) of ``payload``'s content: tensors by dtype, shape and bytes; other values by
    type and ``repr`` (exact for floats). Equal content gives an equal digest, whatever the file."""
    h = hashlib.sha256()
    _update(h, payload)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Writing and reading
# ----------------------------------------------------------------------------------------------


def atomic_write_bytes(path: str | os.PathLike, write: Any) -> None:
    """Call ``write(file)`` on a temporary file unique to this writer next to ``path``, flush it to
    disk and rename it over ``path``. On any failure the temporary file is removed and ``path`` is
    left as it was; ``OSError`` is reported as a one-line :class:`CheckpointError`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CheckpointError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        cause = _os_error(exc)
        if cause is not None:
            reason = "no space left on device" if cause.errno == errno.ENOSPC else (cause.strerror or str(cause))
            kept = "the previous file is kept" if path.exists() else "nothing was written"
            raise CheckpointError(f"could not write {str(path)!r}: {reason}; {kept}") from exc
        raise


def _os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc``: ``exc`` itself or one in its chain. torch's zip writer reports
    a failed write (a full disk) by raising its own ``RuntimeError`` ("enforce fail at
    inline_container.cc ... unexpected pos") while closing the archive, with the ``OSError`` as context."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, lambda f: f.write(text.encode("utf-8")))


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` with its format and checksum, atomically (see module docstring)."""
    record = {"format": FORMAT, "sha256": payload_digest(payload), **payload}
    atomic_write_bytes(path, lambda f: torch.save(record, f))


#: the first bytes of every torch file since torch 1.6 (a zip archive) and of a zip archive's end record
_ZIP_START, _ZIP_END = b"PK\x03\x04", b"PK\x05\x06"
#: the first bytes of a torch file in the format before 1.6 (a pickled magic number, protocol 2)
_LEGACY_START = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_ZIP_END_SPAN = 22 + 65_535  # the end record and the longest archive comment it may carry


def _damage(path: Path) -> str | None:
    """Why the file at ``path`` cannot be a whole torch file, read from its first and last bytes;
    ``None`` when it may be one. torch's own errors for these files are "Invalid argument",
    "EOFError" or the safe unpickler's refusal, which reads like an attack."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes): corrupt, an incomplete write or copy"
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_START))
        if head == _LEGACY_START:
            return None
        if head[: len(_ZIP_START)] != _ZIP_START[: len(head)]:
            return "is not a torch checkpoint file (corrupt, or another kind of file: torch files are zip archives)"
        f.seek(max(0, size - _ZIP_END_SPAN))
        tail = f.read()
    end = tail.rfind(_ZIP_END)
    if end < 0 or len(tail) - end < 22 + int.from_bytes(tail[end + 20 : end + 22], "little"):
        return f"is truncated ({size} bytes, the end of its zip archive is missing): corrupt, an incomplete copy"
    return None


def _load_failure(exc: Exception) -> str:
    """What made ``torch.load`` fail on a file that looks whole, as the end of a one-line sentence."""
    if "weights_only" in str(exc) or "Unsupported global" in str(exc):
        return "is unsafe: it holds objects that only a code-executing unpickler could build (refused)"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"is corrupt or not a torch file: {reason}"


def peek_step(path: str | os.PathLike) -> int | None:
    """The step stored in the checkpoint at ``path``, or ``None`` if it cannot be read."""
    try:
        return int(load_checkpoint(path)["step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and verify a checkpoint (format, checksum, fields); never executes code from the file.

    Raises:
        CheckpointError: missing, not a checkpoint, refused by the safe unpickler, another format
            version, checksum mismatch (corrupt), or missing fields — with the reason in one line.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a file")
    try:
        damage = _damage(path)  # before torch, whose errors (and warnings) for these files mislead
    except OSError as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    if damage is not None:
        raise CheckpointError(f"checkpoint {str(path)!r} {damage}")
    try:
        record = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for damaged or unsafe files
        raise CheckpointError(f"checkpoint {str(path)!r} {_load_failure(exc)}") from exc
    if not isinstance(record, dict) or not str(record.get("format", "")).startswith("pyro_invariance.checkpoint/"):
        raise CheckpointError(f"{str(path)!r} is not a pyro_invariance checkpoint (format {FORMAT})")
    if record["format"] != FORMAT:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format {record['format']!r}, this version reads {FORMAT!r} "
            "(older files carry no checksum or run fingerprint: start the run again)"
        )
    saved = record.pop("sha256", None)
    record.pop("format")
    if saved is None or payload_digest(record) != saved:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: its checksum does not match its content")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}")
    return record
