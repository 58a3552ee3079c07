"""How alive a layer-wise network is where a fit starts, and how its training NLL moves.

Why: in the F-FC + CONV + GCONV Table 3 run (``benchmarks/results/layerwise_table3_ffc.md``) 4 of 6 Laplace fits
on transformed data (and the MAP fits of the same seeds) ended at the constant prediction. A network whose
blocks pass almost no signal at the start has logits that hardly depend on the image; its likelihood gradient
is then small against the prior's pull towards 0, which shrinks the weights further. These functions measure
both ends of that story on the fits' own code path (:func:`pyro_invariance.fit`, MAP guide):

* :func:`start_activity`: per block, the standard deviation of the block's output over a set of images and
  of the logits' across images (mean over classes), at the fit's start — read by a callback after one step of
  learning rate 1e-9, so the weights are the start's to about 1e-9;
* :func:`map_trace`: the same numbers and the mean training NLL (nats) on those images at chosen steps of a MAP
  fit at the given settings (ln 10 ≈ 2.303 is the constant prediction on 10 balanced classes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from pyro import poutine
from torch import Tensor, nn

import pyro_invariance

_BLOCK = re.compile(r"(^|\.)blocks\.\d+$")
#: the learning rate of the one step that reads the start (Adam moves a weight by about this much)
START_LR = 1e-9


def _observed_logits(model: nn.Module, guide: Any, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """The observed site's logits ``(B, C)`` and log-likelihood ``(B,)`` at the guide's point."""
    with torch.no_grad():
        guide_trace = poutine.trace(guide).get_trace(x, y)
        trace = poutine.trace(poutine.replay(model, guide_trace)).get_trace(x, y)
    site = next(s for s in trace.nodes.values() if s["type"] == "sample" and s["is_observed"])
    fn = site["fn"]
    while not hasattr(fn, "logits"):  # unwrap Independent / masked wrappers
        fn = fn.base_dist
    return fn.logits, fn.log_prob(site["value"])


def _read_point(model: nn.Module, guide: Any, x: Tensor, y: Tensor) -> dict[str, Any]:
    """At the guide's point: per block the output's sd and share of active (> 0) ReLU outputs, the logits' sd
    across images (mean over classes) and the mean NLL."""
    blocks = [m for name, m in model.named_modules() if _BLOCK.search(name)]
    sds: list[float] = []
    active: list[float] = []

    def record(_m: nn.Module, _i: Any, out: Tensor) -> None:
        sds.append(float(out.std()))
        active.append(float((out > 0).float().mean()))

    hooks = [b.register_forward_hook(record) for b in blocks]
    try:
        logits, log_lik = _observed_logits(model, guide, x, y)
    finally:
        for h in hooks:
            h.remove()
    return {"blocks": sds, "active": active, "logit_sd": float(logits.std(0).mean()), "nll": -float(log_lik.mean())}


def start_activity(model: nn.Module, data: Any, seed: int, images: int = 500) -> dict[str, Any]:
    """:func:`_read_point` (``blocks``, ``active``, ``logit_sd``, ``nll``) at the start of ``fit(model, "map", data,
    seed=seed)`` on the first ``images`` training images: the one point of a :func:`map_trace` of one step at
    :data:`START_LR`. ``logit_sd`` 0: the prediction does not depend on the image."""
    (point,) = map_trace(model, data, seed, steps=1, lr=START_LR, at=lambda _: True, images=images)
    return {k: v for k, v in point.items() if k != "step"}


def map_trace(
    model: nn.Module, data: Any, seed: int, steps: int, lr: float, at: Callable[[int], bool], images: int = 500
) -> list[dict[str, Any]]:
    """``[{"step", **_read_point}]`` on the first ``images`` training images after every step where ``at(step)``
    of ``fit(model, "map", data, steps=steps, batch_size=128, seed=seed, lr=lr)``."""
    x, y = data.x_train[:images], data.y_train[:images]
    trace: list[dict[str, Any]] = []

    def read(step: int, model: nn.Module, guide: Any) -> None:
        if at(step):
            trace.append({"step": step, **_read_point(model, guide, x, y)})

    fit_kw = {"batch_size": 128, "seed": seed, "progress": False, "lr": lr}
    pyro_invariance.fit(model, "map", data, steps=steps, callbacks=[read], **fit_kw)
    return trace
