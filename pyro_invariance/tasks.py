"""Tasks: what a catalogue model predicts, how it is scored on held-out data, how tables show it.

Every catalogue model declares its task (``CatalogueModel.task``, :mod:`pyro_invariance.models.base`);
evaluation, the CLI's tables and :func:`~pyro_invariance.diagnostics.compare.compare_guides` ask the
task instead of switching on the kind of data:

==================  ===============================  ============================================
task                models                           held-out metrics (:meth:`Task.metrics`)
==================  ===============================  ============================================
``classification``  invariant-mlp, ``layerwise-*``,  accuracy and NLL of the posterior predictive,
                    rotation-toy-2d                  ELBO/N on the training data
``regression``      basis-regression                 RMSE of the predictive mean, NLL of the
                                                     predictive mixture, exact log Z/N where known
``dynamics``        symmetrised-hnn                  the talk's HNN columns: MSEs per split, −ELBO/N,
                                                     energy drift of rollouts
==================  ===============================  ============================================

The posterior predictive is one loop for all tasks
(:func:`pyro_invariance.diagnostics.evaluation.posterior_predictive`, :meth:`Task.posterior_predictive`):
``S`` joint draws ``θ_s ~ q`` (and the model's own symmetry samples), each applied to every row of ``x``,

    f_s(x) = model(x; θ_s),   s = 1..S        (paper 003, Eq. 9's Monte-Carlo predictive)

returning ``(S, N, *out)`` — logits for classification, means for regression, next states for
dynamics. Every metric function accepts a dataset object or a plain pair ``(x, y)``, as ``fit`` does.

A model that is not a :class:`~pyro_invariance.models.base.CatalogueModel` (a user's own
``PyroModule``) gets a task from :func:`task_for`'s fallback: classification when it has an integer
``num_classes`` or the labels are integers, regression otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from torch import Tensor

from pyro_invariance.validation import num_classes_of

__all__ = [
    "CLASSIFICATION", "Classification", "Column", "DYNAMICS", "Dynamics", "REGRESSION", "Regression", "TASKS", "Task",
    "get", "task_for",
]  # fmt: skip


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

    @abstractmethod
    def metric_function(self) -> Callable[..., dict[str, float]]:
        """The function ``f(model, guide, data, *, num_samples, device, seed, **options)`` that computes
        this task's metrics (imported on first use: the diagnostics import the tasks)."""

    def metrics(self, model: Any, guide: Any, data: Any, *, num_samples: int = 16, device: Any = None,
                seed: int = 0, **options: Any) -> dict[str, float]:  # fmt: skip
        """Held-out metrics of ``(model, guide)`` on ``data`` (a dataset object or a pair ``(x, y)``),
        seeded by ``seed`` (two calls give the same numbers; the caller's RNG is left as it was).
        ``options`` are the task's own settings (e.g. ``num_particles``)."""
        return self.metric_function()(model, guide, data, num_samples=num_samples, device=device, seed=seed,
                                      **options)  # fmt: skip

    def posterior_predictive(self, model: Any, guide: Any, x: Tensor, num_samples: int = 16,
                             batch_size: int | None = None) -> Tensor:  # fmt: skip
        """:func:`~pyro_invariance.diagnostics.evaluation.posterior_predictive` with this task's batch
        size: the model's output under ``num_samples`` guide draws, ``(S, N, *out)``."""
        from pyro_invariance.diagnostics.evaluation import posterior_predictive

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
    columns = (Column("accuracy", "test acc", ".3f"), Column("nll", "test NLL", ".3f"),
               Column("elbo_per_datum", "ELBO/N", ".3f", bound=True))  # fmt: skip

    def metric_function(self) -> Callable[..., dict[str, float]]:
        from pyro_invariance.diagnostics.evaluation import classification_metrics

        return classification_metrics


class Regression(Task):
    """Real targets ``y (B, D_out)``; the model's forward returns the predictive mean, its observation
    site the likelihood.

    Metrics (:func:`~pyro_invariance.diagnostics.evaluation.regression_metrics`): held-out RMSE of the
    posterior-predictive mean, NLL of the predictive mixture ``(1/S) Σ_s p(y | x, θ_s)``, and the
    exact log evidence per training datum where the model has one (``log_evidence``).
    """

    name = "regression"
    columns = (Column("rmse", "test RMSE", ".3f"), Column("nll", "test NLL", ".3f"),
               Column("log_evidence_per_datum", "log Z/N", ".3f", bound=True))  # fmt: skip

    def metric_function(self) -> Callable[..., dict[str, float]]:
        from pyro_invariance.diagnostics.evaluation import regression_metrics

        return regression_metrics


class Dynamics(Task):
    """States ``x (B, M)`` and next states ``y (B, M)``; the model's forward returns the predicted
    next states.

    Metrics (:func:`~pyro_invariance.diagnostics.hnn_metrics.evaluate_hnn`): the talk's table
    columns — predictive-mean MSE per split, −ELBO/N, energy drift of rollouts (physics datasets).
    Options: ``num_particles``, ``rollout_steps``, ``max_test``.
    """

    name = "dynamics"
    columns = (Column("train_mse", "train MSE", ".3g"), Column("neg_elbo", "-ELBO/N", ".4g", bound=True),
               Column("test_mse", "test MSE", ".3g"), Column("wider_mse", "wider MSE", ".3g"),
               Column("moved_mse", "moved MSE", ".3g"), Column("energy_drift", "energy drift", ".3g"))  # fmt: skip
    predictive_batch_size = 4096

    def metric_function(self) -> Callable[..., dict[str, float]]:
        from pyro_invariance.diagnostics.hnn_metrics import evaluate_hnn

        return evaluate_hnn


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


def task_for(model: Any, data: Any = None) -> Task:
    """``model.task`` for a :class:`~pyro_invariance.models.base.CatalogueModel`.

    Fallback for any other model (documented, not probed): classification when the model has an
    integer ``num_classes``, or when ``data``'s training labels are integers; regression otherwise.
    """
    from pyro_invariance.models.base import CatalogueModel

    if isinstance(model, CatalogueModel):
        return model.task
    if num_classes_of(model) is not None or data is None:
        return CLASSIFICATION
    from pyro_invariance.data.arrays import train_arrays

    _, y = train_arrays(data)
    return REGRESSION if y.dtype.is_floating_point else CLASSIFICATION
