"""Rescue points: after a divergence, a checkpoint that a resume with lower learning rates continues from.

A checkpoint whose values are finite can still be past saving: a few steps before a blow-up the
parameters may already sit where some minibatches give an infinite loss or gradient, and a resume
from there diverges again at the same step, whatever the learning rate. So ``fit`` keeps, in host
memory, the state at the start of the call and the states of its newest checkpoints (thinned so
that they reach further back as the run goes on, :data:`KEEP` in all), and when the run diverges at
step ``b`` it re-runs each kept state, newest first, with 10× lower learning rates
(:func:`rate_plans`) through step ``b + FRESH_STEPS``: every step's loss, gradients and new state
must be finite. The first state that passes is the rescue point; it is written to the checkpoint
path (replacing a newer, doomed checkpoint; no other file is written) and named in the error with
the resume that was checked. The re-runs use the state's own
random streams and minibatches (those a resume sees), so the resume repeats them bit-for-bit on
the CPU; the check costs at most :func:`check_budget` steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: states kept for a rescue: the start of the call and the newest checkpoints (thinned)
KEEP = 8
#: steps checked past the diverging one (fresh minibatches a resume meets next)
FRESH_STEPS = 5
#: how much lower the checked learning rates are
RATE_FACTOR = 10.0


class Diverged(FloatingPointError):
    """A divergence found at ``step`` (``what`` names it); ``fit`` turns it into the message that
    names the rescue point."""

    def __init__(self, what: str, step: int) -> None:
        super().__init__(what)
        self.what, self.step = what, step


def copied_state(obj: Any, device: str | torch.device | None = None) -> Any:
    """A copy of a (nested) state: tensors copied to ``device`` (``None``: where they are), containers
    rebuilt, the rest deep-copied."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone() if device is None else obj.detach().to(device, copy=True)
    if isinstance(obj, dict):
        return {k: copied_state(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copied_state(v, device) for v in obj)
    return copy.deepcopy(obj)


def host_copy(obj: Any) -> Any:
    """A copy of a (nested) checkpoint payload with every tensor on the CPU (as a resume loads it)."""
    return copied_state(obj, "cpu")


class RescuePoints:
    """The kept states (checkpoint payloads, on the CPU), oldest first, and ``written``: the step of
    the checkpoint file's content (``None``: none written). ``enabled=False`` keeps no state."""

    def __init__(self, enabled: bool, keep: int = KEEP) -> None:
        self.enabled, self.keep = enabled, keep
        self.states: list[dict[str, Any]] = []
        self.written: int | None = None

    def add(self, payload: dict[str, Any]) -> None:
        """Keep a copy of ``payload`` (the newest state; an older one may be dropped, :func:`_thinned`)."""
        if not self.enabled:
            return
        self.states.append(host_copy(payload))
        if len(self.states) > self.keep:
            del self.states[_thinned(self.states)]

    def newest_first(self) -> list[dict[str, Any]]:
        return self.states[::-1]


def _thinned(states: list[dict[str, Any]]) -> int:
    """The index to drop: not the oldest (the start) nor the newest; the one whose removal leaves the
    smallest gap relative to its age, so that the kept steps thin out with age (gaps growing about
    fourfold: e.g. steps 0, 64, 92, 98, 100)."""
    steps = [int(s["step"]) for s in states]

    def crowding(j: int) -> tuple[float, int]:
        return (steps[j + 1] - steps[j - 1]) / (steps[-1] - steps[j + 1] + 1), j

    return min(range(1, len(steps) - 1), key=crowding)


def rate_plans(cfg: Any) -> list[dict[str, float]]:
    """The learning-rate changes a rescue is checked with: ``lr`` 10× lower (the guide's means and
    scales, and the model's point estimates unless ``model_lr`` is set), then every rate 10× lower.
    The rates are rounded to 6 significant digits, as the message prints them: the resume a user
    types is the one that was checked."""
    first = {"lr": _lowered(cfg.lr)}
    every = {
        k: _lowered(getattr(cfg, k)) for k in ("lr", "eta_lr", "model_lr", "factor_lr") if getattr(cfg, k) is not None
    }
    return [first] if every == first else [first, every]


def _lowered(rate: float) -> float:
    return float(f"{rate / RATE_FACTOR:.6g}")


def check_budget(bad_step: int, newest_step: int) -> int:
    """The most steps the check re-runs in all: four times the steps since the newest kept state
    (at least 100), so that finding the rescue point costs about as much as a few checkpoint intervals."""
    return max(100, 4 * (bad_step - newest_step))


@dataclass
class Outcome:
    """What the search found: ``payload`` and ``plan`` of the rescue point (``None``: none passed),
    the checked range's last step ``end``, the states that failed (step, problem) and whether
    older states were left unchecked (the budget)."""

    payload: dict[str, Any] | None
    plan: dict[str, float] | None
    end: int
    failed: list[tuple[int, str]]
    unchecked: bool


def search(
    points: RescuePoints,
    plans: list[dict[str, float]],
    bad_step: int,
    last_step: int,
    attempt: Callable[[dict[str, Any], dict[str, float], int], str | None],
) -> Outcome:
    """Try each of ``plans`` in turn on the kept states, newest first: ``attempt(payload, plan, end)``
    re-runs the steps after the payload's through ``end`` and returns the first problem or ``None``.
    The first plan (``lr`` alone) is tried on every state before the next: the fewest changes win."""
    end = min(bad_step + FRESH_STEPS, last_step)
    states = [s for s in points.newest_first() if int(s["step"]) < bad_step]
    budget = check_budget(bad_step, int(states[0]["step"])) if states else 0
    spent, failed = 0, {}
    for plan in plans:
        for payload in states:
            step = int(payload["step"])
            if spent + (end - step) > budget:
                return _outcome(None, None, end, failed, unchecked=True)
            spent += end - step
            problem = attempt(payload, plan, end)
            if problem is None:
                return _outcome(payload, plan, end, failed, unchecked=False)
            failed.setdefault(step, problem)
    return _outcome(None, None, end, failed, unchecked=False)


def _outcome(
    payload: dict[str, Any] | None, plan: dict[str, float] | None, end: int, failed: dict[int, str], unchecked: bool
) -> Outcome:
    """An :class:`Outcome` whose failures are the states newer than the rescue point, newest first."""
    after = -1 if payload is None else int(payload["step"])
    return Outcome(
        payload, plan, end, sorted(((s, p) for s, p in failed.items() if s > after), reverse=True), unchecked
    )


def resume_hint(plan: dict[str, float]) -> str:
    """``fit(...)`` and CLI arguments that resume with ``plan``'s learning rates."""
    call = ", ".join(f"{k}={v:g}" for k, v in plan.items())
    cli = " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in plan.items())
    return (
        f"fit(..., resume=True, allow_changes={list(plan)}, {call}); "
        f"CLI: --resume --allow-change {','.join(plan)} {cli}"
    )


def describe_failures(failed: list[tuple[int, str]]) -> str:
    """``"steps 6, 5 and 4, 10x lower rates diverge again: non-finite loss (inf) at step 7 ..."``: the
    states that failed and the newest one's problem (shortened)."""
    steps = [str(step) for step, _ in failed]
    listed = steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + " and " + steps[-1]
    return f"step{'s' if len(steps) > 1 else ''} {listed}, 10x lower rates diverge again: {_short(failed[0][1])}"


def one_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _short(text: str, limit: int = 90) -> str:
    text = text.split("; ")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
