"""One writer per run: an exclusive, advisory lock next to a run's checkpoint.

Two processes that train into the same checkpoint would overwrite each other's work. ``fit`` and
the CLI hold :class:`RunLock` for as long as they write a run; a second writer is refused at once
with a one-line :class:`RunLockedError` that names the lock file and the holder's process id.

The lock is ``fcntl.flock`` on ``<path>.lock`` (POSIX): the kernel releases it when the holder
exits, however it exits (``SIGKILL`` included), so a crash never leaves a stale lock. A run that
ends (finished, failed, interrupted or refused) removes the file while it still holds the lock, so
a run folder does not keep a file naming a process that is gone; a writer that locked a file just
removed that way notices (the path no longer names its file) and locks the new one. Where
``fcntl`` is missing (Windows) the lock file is created exclusively and removed on release; a
crash there leaves it behind, and the message says to delete it. Locks are re-entrant within one
process (the CLI locks a run, then ``fit`` locks the same checkpoint).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_HELD: dict[str, tuple[int, int]] = {}  # resolved lock path -> (fd, depth), this process
_GUARD = threading.Lock()


class RunLockedError(RuntimeError):
    """Another process is writing the same run."""


class RunLock:
    """Context manager: ``with RunLock(checkpoint_path): ...`` (see module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.target = Path(path)
        self.lock_path = self.target.with_name(self.target.name + ".lock")
        self._key = str(self.lock_path.resolve())

    def acquire(self) -> None:
        with _GUARD:
            if self._key in _HELD:
                fd, depth = _HELD[self._key]
                _HELD[self._key] = (fd, depth + 1)
                return
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._lock_posix() if fcntl is not None else self._lock_exclusive_file()
            _HELD[self._key] = (fd, 1)

    def _refuse(self, holder: str) -> RunLockedError:
        return RunLockedError(
            f"run {str(self.target)!r} is being written by another process{holder} "
            f"(lock {str(self.lock_path)!r}); wait for it or use another output path"
        )

    def _lock_posix(self) -> int:
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise self._refuse(f" (pid {holder})" if holder else "") from None
            if self._names(fd):
                break
            os.close(fd)  # the previous holder removed this file between our open and flock: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _names(self, fd: int) -> bool:
        """Whether :attr:`lock_path` is still the file open as ``fd``."""
        try:
            at_path = os.stat(self.lock_path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def _lock_exclusive_file(self) -> int:  # pragma: no cover - Windows
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise self._refuse(" (or a crashed one: delete the lock file if no run is active)") from None
        os.write(fd, str(os.getpid()).encode())
        return fd

    def release(self) -> None:
        with _GUARD:
            fd, depth = _HELD.get(self._key, (-1, 0))
            if depth > 1:
                _HELD[self._key] = (fd, depth - 1)
                return
            _HELD.pop(self._key, None)
            if fd < 0:
                return
            if fcntl is not None:
                try:  # removed while still locked, so no other writer can hold this file then
                    if self._names(fd):
                        self.lock_path.unlink()
                except OSError:
                    pass  # a folder gone or read-only: the file stays, and the kernel still frees the lock
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            else:  # pragma: no cover - Windows
                os.close(fd)
                self.lock_path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
