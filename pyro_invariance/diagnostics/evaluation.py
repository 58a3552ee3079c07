"""Held-out metrics of a fitted model, by its task: :func:`evaluate`, the one entry point.

:func:`evaluate` computes the metrics of the model's task (:func:`task_for`, :mod:`pyro_invariance.tasks`)
with that task's metric function (:data:`METRICS`): :func:`classification_metrics` (accuracy, test
NLL, ELBO per datum), :func:`regression_metrics` (RMSE, NLL, exact log evidence) or
:func:`pyro_invariance.diagnostics.hnn_metrics.evaluate_hnn` (the talk's HNN columns). All of them
draw from the tasks' one posterior-predictive loop (:func:`~pyro_invariance.tasks.posterior_predictive`).

Every entry point accepts a dataset object or a plain pair ``(x, y)`` (as ``fit`` does), checks its
arguments and converts the data once for the model (:func:`pyro_invariance.data.arrays.test_arrays`:
numpy arrays and any real dtype are accepted, labels are range-checked), and runs under a fixed
``seed`` (:func:`~pyro_invariance.tasks.seeded_rng`) so that two calls give the same numbers without
touching the caller's RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import Tensor

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import test_arrays, train_arrays
from pyro_invariance.diagnostics.hnn_metrics import evaluate_hnn
from pyro_invariance.guides.base import check_guide_for
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.infer.training import FitResult
from pyro_invariance.models.base import CatalogueModel
from pyro_invariance.tasks import (
    CLASSIFICATION,
    REGRESSION,
    Task,
    evaluation_device,
    posterior_predictive,
    seeded_rng,
)
from pyro_invariance.validation import (
    check_device,
    check_positive_int,
    check_seed,
    coerce_labels,
    num_classes_of,
    num_data_kwargs,
)


@pyro_scope()
@torch.no_grad()
def elbo_per_datum(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    num_particles: int = 8,
    meanfield: bool = True,
    batch_size: int = 4096,
) -> float:
    """ELBO / N on ``(x, y)``, averaged over ``num_particles`` draws.

    Rows are processed in chunks of ``batch_size`` (memory grows as chunk × S × H): each chunk's
    loss is an unbiased estimate of the full-data ELBO (likelihood scaled by N/B_c, KL counted once),
    and their average weighted by B_c/N is the estimate returned.
    """
    check_positive_int("num_particles", num_particles)
    check_positive_int("batch_size", batch_size)
    elbo = (TraceMeanField_ELBO if meanfield else Trace_ELBO)(num_particles=num_particles)
    n = x.shape[0]
    kwargs = num_data_kwargs(model, n)
    chunk = batch_size if kwargs else n  # a model without num_data scores the rows it gets as the data set
    total = 0.0
    for i in range(0, n, chunk):
        xb, yb = x[i : i + chunk], y[i : i + chunk]
        total += xb.shape[0] / n * float(elbo.loss(model, guide, xb, yb, **kwargs))
    return -total / n


@pyro_scope()
def evaluate(
    result: Any,
    data: Any,
    *,
    num_samples: int = 16,
    device: str | torch.device | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[str, float]:
    """Held-out metrics of a fitted model, as its task defines them (:func:`task_for`, :data:`METRICS`).

    Args:
        result: a :class:`~pyro_invariance.infer.training.FitResult` or a pair ``(model, guide)``.
        data: a dataset (held-out split ``x_test``/``y_test``, training split for the ELBO) or a pair
            ``(x, y)`` used for every number. Converted and checked once for the model.
        num_samples: guide draws in the posterior predictive.
        device: where to evaluate (default: the model's device).
        seed: seeds the guide and symmetry draws: the same call gives the same numbers, and the
            caller's RNG state is left as it was.
        options: the task's own settings: ``num_particles``, ``batch_size`` (classification);
            ``num_particles``, ``rollout_steps``, ``max_test`` (dynamics).

    Returns:
        classification: ``{"accuracy", "nll", "elbo_per_datum"}`` (:func:`classification_metrics`);
        regression: ``{"rmse", "nll"[, "log_evidence_per_datum"]}`` (:func:`regression_metrics`);
        dynamics: the talk's columns (:func:`~pyro_invariance.diagnostics.hnn_metrics.evaluate_hnn`).
    """
    check_positive_int("num_samples", num_samples)
    check_seed(seed)
    if device is not None:
        device = check_device(device)
    model, guide = (result.model, result.guide) if isinstance(result, FitResult) else result
    check_guide_for(model, guide)
    metrics = METRICS[task_for(model, data).name]
    return metrics(model, guide, data, num_samples=num_samples, device=device, seed=seed, **options)


@pyro_scope()
def classification_metrics(
    model: Any,
    guide: Any,
    data: Any,
    *,
    num_samples: int = 16,
    num_particles: int = 8,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Accuracy and NLL of the posterior predictive on the held-out split, ELBO/N on training data.

    The predictive is the mixture ``p(y|x) ≈ (1/S) Σ_s softmax(f_s(x))_y``, ``θ_s ~ q``
    (:func:`~pyro_invariance.tasks.posterior_predictive`; paper 003, Eq. 9).

    Args:
        model, guide: a classification model (its forward returns logits ``(B, C)``) and its guide.
        data: a dataset (held-out split = ``x_test``/``y_test``; ELBO on ``x_train``) or a pair
            ``(x, y)`` used for all three numbers. Converted and checked once for the model
            (:mod:`pyro_invariance.data.arrays`): ``x`` of any real dtype (numpy arrays too) becomes
            the model's floating dtype — integer ``x`` as-is unless the dataset has an
            ``input_scale`` — labels become int64 and must lie in ``[0, num_classes)``.
        num_samples: guide draws S averaged in the posterior predictive.
        num_particles: particles of the ELBO estimate.
        batch_size: rows per chunk.
        device: where to evaluate (default: the model's device).
        seed: seeds the guide and symmetry draws (:func:`~pyro_invariance.tasks.seeded_rng`): the
            same call gives the same numbers, and the caller's RNG state is left as it was.

    Returns:
        ``{"accuracy", "nll", "elbo_per_datum"}``; NLL in nats per test example.

    Raises:
        ValueError: ``num_samples``, ``num_particles`` or ``batch_size`` not a positive integer,
            ``seed`` not an integer in ``0 … 2**32 − 1``, a ``device`` this machine does not have, or bad
            data (one line naming ``x`` or ``y``).
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("num_particles", num_particles)
    check_positive_int("batch_size", batch_size)
    check_seed(seed)
    dev = evaluation_device(device, model)
    x_test, y_test = (t.to(dev) for t in test_arrays(data, model))
    x_train, y_train = (t.to(dev) for t in train_arrays(data, model))
    with eval_mode(model), seeded_rng(seed, dev):
        logits = posterior_predictive(model, guide, x_test, num_samples, batch_size)
        if num_classes_of(model) is None:  # a model without num_classes: check against its logits
            y_test = coerce_labels(y_test, logits.shape[-1])
        log_probs = torch.log_softmax(logits, dim=-1)  # (K, N, C)
        mixture = torch.logsumexp(log_probs, dim=0) - math.log(num_samples)  # (N, C)
        nll = -mixture.gather(1, y_test.unsqueeze(1)).mean()
        accuracy = (mixture.argmax(-1) == y_test).float().mean()
        elbo = elbo_per_datum(model, guide, x_train, y_train, num_particles, batch_size=batch_size)
    return {"accuracy": float(accuracy), "nll": float(nll), "elbo_per_datum": elbo}


@pyro_scope()
@torch.no_grad()
def regression_metrics(
    model: Any, guide: Any, data: Any, *, num_samples: int = 16, device: Any = None, seed: int = 0
) -> dict[str, float]:
    """Held-out RMSE of the posterior-predictive mean and NLL per example of the predictive
    mixture ``(1/S) Σ_s p(y | x, θ_s)`` (the model's own observation distribution), ``θ_s ~ q``.

    Adds ``log_evidence_per_datum`` (training data) when the model has an exact
    ``log_evidence`` (:meth:`~pyro_invariance.models.base.CatalogueModel.log_evidence`). ``data`` is a
    dataset or a pair ``(x, y)``, converted and checked once for the model
    (:func:`~pyro_invariance.data.arrays.test_arrays`); the draws are seeded by ``seed``
    (:func:`~pyro_invariance.tasks.seeded_rng`), the caller's RNG is left as it was.
    """
    check_positive_int("num_samples", num_samples)
    check_seed(seed)
    dev = evaluation_device(device, model)
    x, y = (t.to(dev) for t in test_arrays(data, model))
    log_probs, means = [], []
    with seeded_rng(seed, dev):
        for _ in range(num_samples):
            guide_tr = poutine.trace(guide).get_trace(x[:1], y[:1])
            tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(x, y)
            obs = [s for s in tr.nodes.values() if s["type"] == "sample" and s["is_observed"]]
            if not obs:
                raise ValueError("model has no observed site: no predictive metrics")
            fn, value = obs[0]["fn"], obs[0]["value"]
            log_probs.append(fn.log_prob(value).double())
            means.append(fn.mean.double())
    lp = torch.stack(log_probs)  # (S, N)
    mean = torch.stack(means).mean(0)
    out = {
        "rmse": float((mean - obs[0]["value"].double()).pow(2).mean().sqrt()),
        "nll": float(-(torch.logsumexp(lp, 0) - math.log(num_samples)).mean()),
    }
    xt, yt = (t.to(dev) for t in train_arrays(data, model))
    log_z = exact_log_evidence(model, xt, yt)
    if log_z is not None:
        out["log_evidence_per_datum"] = log_z / xt.shape[0]
    return out


def exact_log_evidence(model: Any, x: Any, y: Any) -> float | None:
    """``model.log_evidence(x, y)`` (total, nats) for a catalogue model that has one in closed form, else ``None``."""
    if not isinstance(model, CatalogueModel):
        return None
    with torch.no_grad():
        value = model.log_evidence(x, y)
    return None if value is None else float(value)


def task_for(model: Any, data: Any = None) -> Task:
    """``model.task`` for a :class:`~pyro_invariance.models.base.CatalogueModel`.

    Fallback for any other model (documented, not probed): classification when the model has an
    integer ``num_classes``, or when ``data``'s training labels are integers; regression otherwise.
    """
    if isinstance(model, CatalogueModel):
        return model.task
    if num_classes_of(model) is not None or data is None:
        return CLASSIFICATION
    _, y = train_arrays(data)
    return REGRESSION if y.dtype.is_floating_point else CLASSIFICATION


#: each task's metric function, by task name: ``f(model, guide, data, *, num_samples, device, seed,
#: **options) -> {metric: value}`` (what :func:`evaluate` calls)
METRICS: dict[str, Callable[..., dict[str, float]]] = {
    "classification": classification_metrics,
    "regression": regression_metrics,
    "dynamics": evaluate_hnn,
}
