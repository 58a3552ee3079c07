"""Held-out metrics of a fitted model: accuracy, test NLL and ELBO per datum."""

from __future__ import annotations

import math
from typing import Any

import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import Tensor

from pyro_invariance.data_utils import test_arrays, train_arrays
from pyro_invariance.validation import check_positive_int


@torch.no_grad()
def predictive_logits(model: Any, guide: Any, x: Tensor, num_samples: int = 16, batch_size: int = 1024) -> Tensor:
    """Logits under ``num_samples`` joint draws from the guide (and the model's transforms).

    Returns ``(num_samples, N, C)``; each draw uses one guide sample for all of ``x`` (in chunks
    of ``batch_size`` rows) and fresh symmetry samples per chunk.
    """
    check_positive_int("num_samples", num_samples)
    out = []
    for _ in range(num_samples):
        guide_trace = poutine.trace(guide).get_trace(x[:1])
        conditioned = poutine.replay(model, trace=guide_trace)
        chunks = [poutine.block(conditioned)(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]
        out.append(torch.cat(chunks))
    return torch.stack(out)


@torch.no_grad()
def elbo_per_datum(
    model: Any, guide: Any, x: Tensor, y: Tensor, num_particles: int = 8, meanfield: bool = True,
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
    total = 0.0
    for i in range(0, n, batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        total += xb.shape[0] / n * float(elbo.loss(model, guide, xb, yb, num_data=n))
    return -total / n


def evaluate(
    result: Any,
    data: Any,
    *,
    num_samples: int = 16,
    num_particles: int = 8,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """Accuracy and NLL of the posterior predictive on the held-out split, ELBO/N on training data.

    Args:
        result: a :class:`~pyro_invariance.training.FitResult` or a pair ``(model, guide)``.
        data: a dataset (held-out split = ``x_test``/``y_test``; ELBO on ``x_train``) or a pair
            ``(x, y)`` used for all three numbers.
        num_samples: guide draws averaged in the posterior predictive p(y|x) ≈ (1/K) Σ_k p(y|x, θ_k).
        num_particles: particles of the ELBO estimate.

    Returns:
        ``{"accuracy", "nll", "elbo_per_datum"}``; NLL in nats per test example.
    """
    model, guide = (result.model, result.guide) if hasattr(result, "model") else result
    dev = torch.device(device) if device is not None else next(iter(model.buffers()), torch.zeros(0)).device
    x_test, y_test = (t.to(dev) for t in test_arrays(data))
    x_train, y_train = (t.to(dev) for t in train_arrays(data))
    was_training = model.training
    model.eval()
    try:
        logits = predictive_logits(model, guide, x_test, num_samples, batch_size)
        log_probs = torch.log_softmax(logits, dim=-1)  # (K, N, C)
        mixture = torch.logsumexp(log_probs, dim=0) - math.log(num_samples)  # (N, C)
        nll = -mixture.gather(1, y_test.long().unsqueeze(1)).mean()
        accuracy = (mixture.argmax(-1) == y_test).float().mean()
        elbo = elbo_per_datum(model, guide, x_train, y_train, num_particles, batch_size=batch_size)
    finally:
        model.train(was_training)
    return {"accuracy": float(accuracy), "nll": float(nll), "elbo_per_datum": elbo}
