"""Checkpoint files that cannot be written or read say why in one line: a full disk (on a real small
file system, and through torch's own zip writer), an empty or truncated file, a file that is not a
torch file at all (``docs/reliability.md``)."""

from __future__ import annotations

import errno
import io
import pickle
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

import pyro_invariance.infer.checkpoint as ck
from pyro_invariance.cli import main
from pyro_invariance.infer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

torch.set_num_threads(1)


def _payload(numbers: int, step: int = 1) -> dict[str, Any]:
    """A checkpoint payload of every required field, with ``numbers`` float32 weights (4 bytes each)."""
    payload: dict[str, Any] = {key: {} for key in ck.REQUIRED}
    payload["step"], payload["model"] = step, {"w": torch.arange(numbers, dtype=torch.float32)}
    return payload


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 64 KiB file system (tmpfs), where torch's writer meets ENOSPC; skipped where mounting
    is not allowed (not root, no ``mount``, a container without CAP_SYS_ADMIN)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small file system")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 64 KiB tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False, capture_output=True)


def test_a_real_full_disk_keeps_the_previous_checkpoint_and_says_so(small_disk):
    path = small_disk / "c.pt"
    with pytest.raises(CheckpointError, match=r"^could not write .*: no space left on device; nothing was written$"):
        save_checkpoint(path, _payload(40_000))  # 160 kB on a 64 KiB disk
    assert list(small_disk.iterdir()) == []  # no temp file left
    save_checkpoint(path, _payload(2_000, step=3))
    with pytest.raises(
        CheckpointError, match=r"^could not write .*: no space left on device; the previous file is kept$"
    ):
        save_checkpoint(path, _payload(20_000, step=6))
    assert load_checkpoint(path)["step"] == 3
    assert [p.name for p in small_disk.iterdir()] == ["c.pt"]


class _FullAfter(io.RawIOBase):
    """A writable file that fails with ENOSPC once ``room`` bytes are written, as a full disk does."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)


def test_enospc_inside_torchs_zip_writer_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    """The write fails inside torch's own writer, which then raises its C++ ``enforce fail ...
    unexpected pos`` error while closing the archive: the message still names the full disk."""
    path = tmp_path / "c.pt"
    save_checkpoint(path, _payload(100, step=3))
    real_save = torch.save
    monkeypatch.setattr(ck.torch, "save", lambda obj, f: real_save(obj, _FullAfter(f, 1_000)))
    with pytest.raises(CheckpointError, match=r"no space left on device; the previous file is kept$") as info:
        save_checkpoint(path, _payload(5_000, step=6))
    assert "enforce fail" not in str(info.value) and len(str(info.value).splitlines()) == 1
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def _saved(tmp_path: Path) -> bytes:
    save_checkpoint(tmp_path / "whole.pt", _payload(3_000))
    return (tmp_path / "whole.pt").read_bytes()


@pytest.mark.parametrize("keep", [1, 10, 100, 0.5, -22, -1])
def test_a_truncated_checkpoint_is_called_truncated(tmp_path, keep):
    raw = _saved(tmp_path)
    cut = raw[: int(len(raw) * keep) if isinstance(keep, float) else keep]
    (tmp_path / "c.pt").write_bytes(cut)
    with pytest.raises(
        CheckpointError, match=rf"is truncated \({len(cut)} bytes, the end of its zip archive is missing\)"
    ):
        load_checkpoint(tmp_path / "c.pt")


def test_an_empty_checkpoint_is_called_empty(tmp_path):
    (tmp_path / "c.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        load_checkpoint(tmp_path / "c.pt")


@pytest.mark.parametrize(
    "content",
    [
        random.Random(0).randbytes(3_000),  # starts with neither torch format's bytes
        b"\x80" + random.Random(1).randbytes(3_000),  # a pickle opcode, then noise
        pickle.dumps({"step": 1}),  # a plain pickle, not written by torch
        b"step=3\nloss=0.5\n",
    ],
    ids=["random", "pickle-opcode-then-noise", "plain-pickle", "text"],
)
def test_a_file_that_is_not_a_torch_file_is_called_so(tmp_path, content):
    (tmp_path / "c.pt").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"is not a torch checkpoint file") as info:
        load_checkpoint(tmp_path / "c.pt")
    assert "code-executing" not in str(info.value)


def test_evaluate_names_a_truncated_checkpoint_in_one_line(tmp_path, capsys):
    raw = _saved(tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(raw[: len(raw) // 2])
    assert main(["evaluate", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is truncated" in err and "Errno" not in err and len(err.splitlines()) == 1
