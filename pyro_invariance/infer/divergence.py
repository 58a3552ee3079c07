"""Naming what went wrong when training diverges (non-finite values, invalid distribution
parameters), and checking that a state is finite before it is written to a checkpoint."""

from __future__ import annotations

from typing import Any

import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from torch import nn


def _module_problems(owner: str, module: Any) -> str | None:
    """The first non-finite parameter, or constrained parameter outside its constraint (e.g. a
    positive scale that underflowed to 0), of ``module``."""
    if not isinstance(module, nn.Module):
        return None
    for name, p in module.named_parameters():
        if not torch.isfinite(p).all():
            return f"{owner} parameter '{name}' is non-finite"
    for prefix, sub in module.named_modules():
        for pname, (constraint, _) in getattr(sub, "_pyro_params", {}).items():
            value = getattr(sub, pname).detach()
            if not bool(constraint.check(value).all()):
                full = f"{prefix}.{pname}" if prefix else pname
                return f"{owner} parameter '{full}' left its constraint {constraint} (min {float(value.min()):.3g})"
    return None


class _LastSite(Messenger):
    """Remembers the name of the last sample site reached."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        self.name = msg["name"]


def _first_line(exc: BaseException, limit: int = 240) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def locate_problem(model: Any, guide: Any, args: tuple, kwargs: dict) -> str | None:
    """Name the first parameter, site value or log-density that is invalid; ``None`` if none is."""
    with torch.no_grad():
        for owner, module in (("model", model), ("guide", guide)):
            found = _module_problems(owner, module)
            if found:
                return found
        last = _LastSite()
        owner = "guide"
        try:
            with last:
                guide_tr = poutine.trace(guide).get_trace(*args, **kwargs)
            owner, last.name = "model", None
            with last:
                model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(*args, **kwargs)
        except (ValueError, RuntimeError) as exc:
            after = f" after site '{last.name}'" if last.name else ""
            return f"building a distribution in the {owner}{after} failed: {_first_line(exc)}"
        for owner, tr in (("guide", guide_tr), ("model", model_tr)):
            for name, site in tr.nodes.items():
                if site["type"] != "sample":
                    continue
                if not torch.isfinite(site["value"]).all():
                    return f"{owner} site '{name}' has a non-finite value"
                lp = site["fn"].log_prob(site["value"])
                if not torch.isfinite(lp).all():
                    return f"{owner} site '{name}' has a non-finite log-density"
    return None


def first_invalid_state(model: Any, guide: Any, optimizer: torch.optim.Optimizer) -> str | None:
    """The first non-finite floating tensor in model, guide or optimiser state, or constrained
    parameter outside its constraint (a scale at 0); ``None`` if the state is fit to be saved."""
    for owner, module in (("model", model), ("guide", guide)):
        found = _module_problems(owner, module)
        if found:
            return found
    for owner, module in (("model", model), ("guide", guide)):
        if not isinstance(module, nn.Module):
            continue
        for name, t in module.state_dict().items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{owner} '{name}'"
    for state in optimizer.state.values():
        for key, t in state.items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"optimizer state '{key}'"
    return None


def first_non_finite_gradient(model: Any, guide: Any) -> str | None:
    """The first parameter of model or guide whose gradient (after a backward pass) is not finite."""
    for owner, module in (("model", model), ("guide", guide)):
        if not isinstance(module, nn.Module):
            continue
        for name, p in module.named_parameters():
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return f"{owner} parameter '{name}' has a non-finite gradient"
    return None
