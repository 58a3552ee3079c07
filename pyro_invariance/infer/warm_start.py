"""Start a fit where another one ended: the reference's 3-body recipe trains a plain HNN first and
starts every row (HNN, learned symmetry, oracle) from it (docs/methods.md §4).

:func:`warm_start` copies, from a finished run (a :class:`~pyro_invariance.infer.training.FitResult`
or a checkpoint file, read with ``weights_only=True``):

* the model's point estimates and buffers with the same name and shape (biases, input scale,
  noise and prior variances) — never the learned symmetry parameters (``model.symmetry_parameters()``):
  the symmetric rows keep their own start (an HNN source has no symmetry state to copy);
* the guide's means: every guide entry whose name marks a location (``loc``, ``locs.``) and whose
  shape matches. Scales and covariance factors keep the target guide's own initialisation
  (``init_scale``), as the reference sets the initial posterior scale separately.

The target guide's parameters must exist: pass the training ``data`` and a guide that has none yet
is set up on its first two rows (as ``fit`` would set it up), or call the guide once yourself.
Returns the names copied; a name in the source that has no counterpart is skipped and listed in
``skipped``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.infer.checkpoint import load_checkpoint
from pyro_invariance.infer.training import set_up_guide
from pyro_invariance.models.base import CatalogueModel

__all__ = ["WarmStart", "set_up_guide_on", "warm_start"]


@dataclass
class WarmStart:
    """What :func:`warm_start` copied (``model``, ``guide``) and left out (``skipped``)."""

    model: list[str] = field(default_factory=list)
    guide: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _is_location(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "locs" or "loc" in parts[-1].replace("_unconstrained", "").split("_")


def _states(source: Any) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    if isinstance(source, (str, os.PathLike)):
        state = load_checkpoint(source)
        return state["model"], state["guide"]
    model, guide = getattr(source, "model", None), getattr(source, "guide", None)
    if not isinstance(model, nn.Module) or not isinstance(guide, nn.Module):
        raise TypeError(f"warm_start needs a FitResult or a checkpoint path, got {type(source).__name__}")
    return model.state_dict(), guide.state_dict()


def set_up_guide_on(model: nn.Module, guide: nn.Module, data: Any) -> None:
    """:func:`~pyro_invariance.infer.training.set_up_guide` on the first two training rows of ``data``
    (a dataset or ``(x, y)``, checked and converted for ``model``)."""
    x, y = train_arrays(data, model)
    set_up_guide(model, guide, x[:2], y[:2], num_data=x.shape[0])


@torch.no_grad()
def warm_start(model: nn.Module, guide: nn.Module, source: Any, data: Any = None) -> WarmStart:
    """Copy the point estimates and guide means of ``source`` into ``model`` and ``guide`` (module
    docstring); with ``data``, a guide without parameters is first set up on it (:func:`set_up_guide_on`)."""
    if not any(True for _ in guide.parameters()) and data is not None:
        with torch.enable_grad():
            set_up_guide_on(model, guide, data)
    if not any(True for _ in guide.parameters()):
        raise ValueError(
            "the guide has no parameters yet: pass the training data (warm_start(model, guide, source, "
            "data)) or call the guide once before warm_start"
        )
    src_model, src_guide = _states(source)
    symmetry = {id(p) for p in model.symmetry_parameters()} if isinstance(model, CatalogueModel) else set()
    report = WarmStart()
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, value in src_model.items():
        target = own.get(name)
        if target is None or id(target) in symmetry or target.shape != value.shape:
            report.skipped.append(f"model.{name}")
            continue
        target.copy_(value.to(target))
        report.model.append(name)
    own_guide = dict(guide.named_parameters()) | dict(guide.named_buffers())
    for name, value in src_guide.items():
        target = own_guide.get(name)
        if target is None or not _is_location(name) or target.shape != value.shape:
            report.skipped.append(f"guide.{name}")
            continue
        target.copy_(value.to(target))
        report.guide.append(name)
    if not report.guide:
        raise ValueError(
            "no guide mean matched by name and shape: are source and target the same guide on the same network?"
        )
    return report
