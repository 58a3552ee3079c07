"""Stopping a run cleanly: SIGINT (Ctrl-C) and SIGTERM end ``fit`` at a step boundary.

While :class:`StopSignals` is active (``fit`` enters it), the first SIGINT or SIGTERM only sets a
flag; ``fit`` finishes the current step, writes its checkpoint (when it has a ``checkpoint_path``)
and raises :class:`FitInterrupted`, whose message names the step and the checkpoint, e.g.
``interrupted at step 417; checkpoint at results/run/checkpoint.pt``. Resuming from that
checkpoint continues the run bit-for-bit. A second signal interrupts at once (the handler in
force before ``fit`` is back). Signal handlers can only be set in the main thread; elsewhere
signals behave as usual.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class FitInterrupted(KeyboardInterrupt):
    """``fit`` stopped at a step boundary because of a signal.

    Attributes:
        step: the last completed step (the checkpoint holds it).
        checkpoint: the checkpoint path, or ``None`` when the run had none.
        signum: the signal number (``signal.SIGINT`` or ``signal.SIGTERM``).
    """

    def __init__(self, step: int, checkpoint: Any, signum: int) -> None:
        self.step, self.checkpoint, self.signum = step, checkpoint, signum
        where = (
            f"checkpoint at {checkpoint}" if checkpoint is not None else "no checkpoint_path, so the progress is lost"
        )
        super().__init__(f"interrupted at step {step}; {where}")

    def __str__(self) -> str:
        return str(self.args[0])


class StopSignals:
    """Context manager turning the first SIGINT/SIGTERM into :attr:`signum` (see module docstring)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._restore()  # a second signal takes the previous (usually immediate) route

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._restore()
