"""Tasks: what a catalogue model predicts, how it is scored on held-out data, how tables show it.

Every catalogue model declares its task (``CatalogueModel.task``, :mod:`pyro_invariance.models.base`);
evaluation, the CLI's tables and :func:`~pyro_invariance.diagnostics.compare.compare_guides` ask the
task instead of switching on the kind of data. The tasks sit below the models (which name theirs);
the metric functions, which need the data, the models and the guides, are one layer up, in the
diagnostics, and :func:`pyro_invariance.diagnostics.evaluation.evaluate` is the one call that
computes a task's metrics:

==================  ===============================  ============================================
task                models                           held-out metrics (``evaluate``)
==================  ===============================  ============================================
``classification``  invariant-mlp, ``layerwise-*``,  accuracy and NLL of the posterior predictive,
                    rotation-toy-2d                  ELBO/N on the training data
``regression``      basis-regression                 RMSE of the predictive mean, NLL of the
                                                     predictive mixture, exact log Z/N where known
``dynamics``        symmetrised-hnn                  the talk's HNN columns: MSEs per split, −ELBO/N,
                                                     energy drift of rollouts
==================  ===============================  ============================================

The posterior predictive is one loop for all tasks (:func:`posterior_predictive`,
:meth:`Task.posterior_predictive`):
``S`` joint draws ``θ_s ~ q`` (and the model's own symmetry samples), each applied to every row of ``x``::

    f_s(x) = model(x; θ_s),   s = 1..S        (paper 003, Eq. 9's Monte-Carlo predictive)

returning ``(S, N, *out)`` — logits for classification, means for regression, next states for
dynamics. Every metric function runs under a fixed seed (:func:`seeded_rng`) and accepts a dataset
object or a plain pair ``(x, y)``, as ``fit`` does.

A model that is not a :class:`~pyro_invariance.models.base.CatalogueModel` (a user's own
``PyroModule``) gets a task from :func:`~pyro_invariance.diagnostics.evaluation.task_for`'s
fallback: classification when it has an integer ``num_classes`` or the labels are integers,
regression otherwise.
"""

from __future__ import annotations

import contextlib
from abc import ABC
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pyro import poutine
from torch import Tensor

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.validation import check_device, check_positive_int, check_seed

__all__ = [
    "CLASSIFICATION",
    "Classification",
    "Column",
    "DYNAMICS",
    "Dynamics",
    "REGRESSION",
    "Regression",
    "TASKS",
    "Task",
    "evaluation_device",
    "get",
    "model_device",
    "posterior_predictive",
    "seeded_rng",
]


@dataclass(frozen=True)
class Column:
    """One metric column of a table: the metric's ``key``, the column ``title``, a ``format`` spec.

    ``bound``: the column is an evidence bound per datum (ELBO/N, −ELBO/N, exact log Z/N); tables
    that report bounds of their own (``compare_guides``) leave these out.
    """

    key: str
    title: str
    format: str
    bound: bool = False

    def render(self, value: Any) -> str:
        """``value`` in this column's format (``-`` when missing)."""
        return "-" if value is None else format(value, self.format)


class Task(ABC):
    """What a model predicts and how it is scored (see the module docstring).

    Attributes:
        name: ``"classification"``, ``"regression"`` or ``"dynamics"`` (saved in summaries and tables).
        columns: the metric columns of the CLI's tables, in order (:class:`Column`).
        predictive_batch_size: rows per forward pass of :meth:`posterior_predictive`.
    """

    name: ClassVar[str]
    columns: ClassVar[tuple[Column, ...]]
    predictive_batch_size: ClassVar[int] = 1024

    def posterior_predictive(
        self, model: Any, guide: Any, x: Tensor, num_samples: int = 16, batch_size: int | None = None
    ) -> Tensor:
        """:func:`posterior_predictive` with this task's batch size: the model's output under
        ``num_samples`` guide draws, ``(S, N, *out)``."""
        return posterior_predictive(model, guide, x, num_samples, batch_size or self.predictive_batch_size)

    def table_columns(self, metrics: Mapping[str, Any], bounds: bool = True) -> list[Column]:
        """The columns of :attr:`columns` whose key ``metrics`` holds (without bound columns
        unless ``bounds``)."""
        return [c for c in self.columns if c.key in metrics and (bounds or not c.bound)]

    def __repr__(self) -> str:
        return f"<task {self.name}>"


class Classification(Task):
    """Class labels ``y ∈ {0..C−1}``; the model's forward returns logits ``(B, C)``.

    Metrics (:func:`~pyro_invariance.diagnostics.evaluation.classification_metrics`): accuracy and NLL
    of the predictive mixture ``p(y|x) ≈ (1/S) Σ_s softmax(f_s(x))_y`` on the held-out split, ELBO/N
    on the training split. Options: ``num_particles``, ``batch_size``.
    """

    name = "classification"
    columns = (
        Column("accuracy", "test acc", ".3f"),
        Column("nll", "test NLL", ".3f"),
        Column("elbo_per_datum", "ELBO/N", ".3f", bound=True),
    )


class Regression(Task):
    """Real targets ``y (B, D_out)``; the model's forward returns the predictive mean, its observation
    site the likelihood.

    Metrics (:func:`~pyro_invariance.diagnostics.evaluation.regression_metrics`): held-out RMSE of the
    posterior-predictive mean, NLL of the predictive mixture ``(1/S) Σ_s p(y | x, θ_s)``, and the
    exact log evidence per training datum where the model has one (``log_evidence``).
    """

    name = "regression"
    columns = (
        Column("rmse", "test RMSE", ".3f"),
        Column("nll", "test NLL", ".3f"),
        Column("log_evidence_per_datum", "log Z/N", ".3f", bound=True),
    )


class Dynamics(Task):
    """States ``x (B, M)`` and next states ``y (B, M)``; the model's forward returns the predicted
    next states.

    Metrics (:func:`~pyro_invariance.diagnostics.hnn_metrics.evaluate_hnn`): the talk's table
    columns — predictive-mean MSE per split, −ELBO/N, energy drift of rollouts (physics datasets).
    Options: ``num_particles``, ``rollout_steps``, ``max_test``.
    """

    name = "dynamics"
    columns = (
        Column("train_mse", "train MSE", ".3g"),
        Column("neg_elbo", "-ELBO/N", ".4g", bound=True),
        Column("test_mse", "test MSE", ".3g"),
        Column("wider_mse", "wider MSE", ".3g"),
        Column("moved_mse", "moved MSE", ".3g"),
        Column("energy_drift", "energy drift", ".3g"),
    )
    predictive_batch_size = 4096


CLASSIFICATION = Classification()
REGRESSION = Regression()
DYNAMICS = Dynamics()
#: every task by name
TASKS: dict[str, Task] = {t.name: t for t in (CLASSIFICATION, REGRESSION, DYNAMICS)}


def get(name: str) -> Task:
    """The task called ``name`` (one of :data:`TASKS`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; use one of {sorted(TASKS)}")
    return TASKS[name]


# ------------------------------------------------------------------------------------------------
# what every task's metrics share: the seeded RNG, the device, the posterior predictive


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device | str | None = None) -> Iterator[None]:
    """Run the block with torch's RNG seeded by ``seed`` (the CPU generator, and ``device``'s if
    it is a GPU); the caller's RNG states are restored afterwards."""
    seed = check_seed(seed)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        for index in devices:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


def model_device(model: Any) -> torch.device:
    """The device of a module's first buffer or parameter (CPU when it has none)."""
    if not isinstance(model, torch.nn.Module):
        return torch.device("cpu")
    return next(iter(model.buffers()), next(iter(model.parameters()), torch.zeros(0))).device


def evaluation_device(device: str | torch.device | None, model: Any) -> torch.device:
    """``device`` checked (:func:`~pyro_invariance.validation.check_device`: it must exist here), or
    the model's device when ``None``."""
    return torch.device(check_device(device)) if device is not None else model_device(model)


@pyro_scope()
@torch.no_grad()
def posterior_predictive(model: Any, guide: Any, x: Tensor, num_samples: int = 16, batch_size: int = 1024) -> Tensor:
    """The model's output under ``num_samples`` joint draws from the guide: ``(S, N, *out)``.

    ``f_s(x) = model(x; θ_s)``, ``θ_s ~ q`` (paper 003, Eq. 9's Monte-Carlo predictive): each draw
    replays one guide sample into the model for all of ``x`` (in chunks of ``batch_size`` rows),
    with fresh symmetry samples (transforms, flows) per chunk. Outputs are logits ``(S, N, C)`` for
    classification, means ``(S, N, D_out)`` for regression, next states ``(S, N, M)`` for dynamics.
    The RNG is not seeded here (the metric functions seed it, :func:`seeded_rng`).
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("batch_size", batch_size)
    out = []
    for _ in range(num_samples):
        guide_trace = poutine.trace(guide).get_trace(x[:1])
        conditioned = poutine.replay(model, trace=guide_trace)
        chunks = [poutine.block(conditioned)(x[i : i + batch_size]) for i in range(0, x.shape[0], batch_size)]
        out.append(torch.cat(chunks))
    return torch.stack(out)
