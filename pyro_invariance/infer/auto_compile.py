"""What ``fit``'s default ``compile="auto"`` runs: the captured graph or eager Pyro.

A training step of a small model is bound by Pyro's Python machinery (messengers, distribution
objects, trace bookkeeping), not by its tensor operations. ``compile="capture"``
(:class:`~pyro_invariance.infer.fast_step.CapturedLoss`) replays the loss from a graph of those
operations and computes the same numbers; capturing costs seconds once (tracing the program and
checking the replay against the eager ELBO). ``"auto"`` takes it where it is safe and pays back:

* the model declares :attr:`~pyro_invariance.models.base.CatalogueModel.capturable` (every catalogue
  model does; a user's own model or plain function is run eagerly unless its class says so) and the
  guide is an ``nn.Module`` (a catalogue guide or a Pyro autoguide, whose Python state is its
  parameters);
* one process, one shard, Pyro's validation on the first step only (what ``"capture"`` needs);
* this call runs at least :data:`AUTO_CAPTURE_STEPS` steps, so the capture's cost is repaid
  (``benchmarks/results/gpu_step_time_cpu_overhead.md``: on a 2-core CPU the invariant MLP's step at
  B = 32, S = 4, H = 64 takes 1.24× a hand-written twin's with it, 1.55× without);
* the captured loss and gradients equal the eager ELBO's **to the bit** (else the run stays eager,
  so ``"auto"`` never changes a number of ``"off"``; a model that cannot be traced runs eagerly too).

It decides silently: ``FitResult.step_stats["compile"]`` says what ran and ``step_stats["auto"]``
why, where it is not the graph. ``compile="off"`` always runs eager Pyro.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pyro_invariance.infer.config import FitConfig
from pyro_invariance.models.base import capturable

__all__ = ["AUTO_CAPTURE_STEPS", "resolve_compile"]

#: fewest steps of a ``fit`` call for which ``compile="auto"`` captures the loss: tracing and
#: checking take about as long as 100–500 eager steps of the small models whose steps it speeds up
AUTO_CAPTURE_STEPS = 500


def resolve_compile(cfg: FitConfig, model: Any, guide: Any, steps: int) -> tuple[str, str | None]:
    """The compile mode a call of ``steps`` steps runs with, and why ``"auto"`` chose eager (else ``None``).

    Args:
        cfg: the run's settings (``cfg.compile`` other than ``"auto"`` is returned as given).
        model: the Pyro model (see :func:`~pyro_invariance.models.base.capturable`).
        guide: the guide.
        steps: the steps this call runs (``until_step`` or ``cfg.steps``, minus a resumed start).
    """
    if cfg.compile != "auto":
        return cfg.compile, None
    reason = None
    if not capturable(model):
        reason = "the model does not declare itself capturable"
    elif not isinstance(guide, nn.Module):
        reason = "the guide is not an nn.Module"
    elif cfg.shards > 1 or cfg.strategy != "single" or cfg.validation != "first-step":
        reason = "capture needs one process, one shard and validation='first-step'"
    elif steps < AUTO_CAPTURE_STEPS:
        reason = f"{steps} steps in this call, fewer than {AUTO_CAPTURE_STEPS}: capturing would not pay back"
    return ("off", reason) if reason else ("capture", None)
