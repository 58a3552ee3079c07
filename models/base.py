"""The catalogue's model protocol: :class:`CatalogueModel`, and the shared constructor vocabulary.

Every catalogue model (``models/*.py``) inherits :class:`CatalogueModel`, so training, evaluation,
the guides, ArviZ export and the CLI call the same methods on every model instead of probing for
attributes:

* ``forward(x, y=None, num_data=None)`` — the Pyro model; its likelihood goes through
  :meth:`CatalogueModel.observe`, the one place that owns the data plate and its N/B scaling;
* ``symmetry_parameters()`` — the ``nn.Parameter`` objects ``fit`` trains with ``eta_lr``
  (grouped by identity); ``symmetry_summary()`` — readable values for logs and tables;
  ``symmetry_sites()`` — the latent sample sites of η when ``symmetry_prior`` makes η a latent
  variable (full Bayes, :mod:`pyro_invariance.symmetry.priors`) instead of a point estimate;
* ``task`` — a :class:`~pyro_invariance.tasks.Task` (held-out metrics, table columns, predictive);
* ``fit_defaults``, ``guide_defaults(name)``, ``arviz_dims()``, ``arviz_coords()``,
  ``log_evidence(x, y)`` — recommendations and capabilities with defaults;
* ``vectorizable_particles`` — whether ``forward`` evaluates a batch of weight samples (ELBO
  particles) in one pass (``vectorize_particles=True``); see :class:`CatalogueModel`;
* ``capturable`` — whether ``fit``'s default ``compile="auto"`` may replay the model's loss from a
  captured graph (:mod:`pyro_invariance.infer.auto_compile`);
* ``input_shapes()``, ``target_shapes()``, ``prepare_inputs(x, y)`` — the data boundary.

Constructor vocabulary (``docs/catalogue.md``, "Model arguments"): ``symmetry`` is always the group / family of
symmetries; ``learn_symmetry`` learns its parameters η (else they stay at ``eta_init``);
``symmetry_prior`` (``None``: η is a point estimate; a prior name of
:data:`~pyro_invariance.symmetry.priors.SYMMETRY_PRIORS`: η is a latent site with that prior);
``init_seed`` seeds all construction-time randomness; ``prior`` is one of :data:`PRIORS`;
``prior_scale`` and ``noise_scale`` are standard deviations; ``num_transforms`` counts the
symmetry samples of a forward pass (``num_samples`` is reserved for posterior draws).

A model that is not a ``CatalogueModel`` (a user's own ``PyroModule``) can still be fitted and
evaluated: the helper functions below give the documented fallbacks (no symmetry parameters, no
recommendations), and :func:`pyro_invariance.diagnostics.evaluation.task_for` picks its task.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyro
import torch
from pyro.distributions import Distribution
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyro_invariance._pyro_scope import own_params_in_store, pyro_scope
from pyro_invariance.data.arrays import PreparesInputs
from pyro_invariance.symmetry.priors import check_symmetry_prior
from pyro_invariance.validation import (
    as_real_tensor,
    check_trailing_shape,
    coerce_pair,
    model_dtype,
    num_classes_of,
)

if TYPE_CHECKING:
    from pyro_invariance.tasks import Task

__all__ = [
    "PRIORS",
    "CatalogueModel",
    "PrecisionGroup",
    "capturable",
    "check_prior",
    "symmetry_parameters",
    "symmetry_sites",
    "symmetry_summary",
    "vectorizable_particles",
]

#: Every prior mode of the catalogue (each model takes the subset in its ``priors``):
#: ``"fixed"`` — the prior scale is a constant (a buffer);
#: ``"learned"`` — a point estimate trained by the bound (type-II maximum likelihood);
#: ``"closed-form"`` — a buffer set by a closed-form type-II update (:mod:`pyro_invariance.infer.prior_update`);
#: ``"hierarchical"`` — a latent variable with a LogNormal hyperprior.
PRIORS: tuple[str, ...] = ("fixed", "learned", "closed-form", "hierarchical")


class _CatalogueMeta(ABCMeta, type(PyroModule)):  # type: ignore[misc]
    """PyroModule's metaclass with :class:`abc.ABCMeta` (abstract methods are enforced)."""


class CatalogueModel(PyroModule, PreparesInputs, metaclass=_CatalogueMeta):
    """Base class of every catalogue model (see the module docstring).

    Class attributes:
        task: the model's :class:`~pyro_invariance.tasks.Task` (classification, regression, dynamics).
        fit_defaults: recommended :func:`pyro_invariance.fit` settings (e.g. ``{"lr": 1e-2,
            "eta_lr": 1e-3}``); the CLI applies them unless given.
        priors: the prior modes (of :data:`PRIORS`) the model takes.
        symmetry_priors: the priors over η (of :data:`~pyro_invariance.symmetry.priors.SYMMETRY_PRIORS`)
            the model takes for ``symmetry_prior``; empty: η is always a point estimate.
        vectorizable_particles: ``forward`` broadcasts over a batch of latent draws, so
            ``Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)`` (and
            ``Predictive(parallel=True)``, the bounds' ``vectorize=True``) evaluate the P weight
            samples in one batched pass. Contract: a particle plate left of the data plate gives
            every global site (weights, prior scales, a latent η) the shape ``(*P, 1, *event)`` —
            the ``1`` is the data plate's dim, the rightmost batch dim — and ``forward`` returns
            ``(*P, B, ...)``, scoring ``"obs"`` with batch shape ``(*P, B)``. Each particle is the
            model of one sequential particle: its own latents and its own symmetry samples
            (ε, flow weights), so the estimator is the same as ``vectorize_particles=False``
            (``tests/models/test_vectorized_particles.py`` checks that identical draws give identical
            losses and gradients). Default ``False``: the model runs one particle at a time.
        capturable: ``forward``'s Python control flow depends only on shapes and constructor
            settings, never on tensor values or on Python attributes changed during a run, and its
            state lives in parameters and buffers; so ``fit``'s default ``compile="auto"`` may replay
            its loss from a captured graph, which computes the same numbers (checked to the bit
            before it is used; :mod:`pyro_invariance.infer.auto_compile`). Default ``True``; a
            subclass that breaks the contract sets ``False``.

    Instance attributes:
        prior: the prior mode this model was built with (one of :attr:`priors`).
        num_classes: the number of classes of a classification model; ``None`` otherwise.
        symmetry_prior: ``None`` (η a point estimate) or the prior of a latent η.
    """

    task: ClassVar[Task]
    fit_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    priors: ClassVar[tuple[str, ...]] = ()
    symmetry_priors: ClassVar[tuple[str, ...]] = ()
    vectorizable_particles: ClassVar[bool] = False
    capturable: ClassVar[bool] = True
    prior: str
    symmetry_prior: str | None = None
    num_classes: int | None = None

    # -- the Pyro model -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``PyroModule.__call__`` that, in Pyro's global param mode (outside the package's calls), reads
        and trains this model's own parameters, never another catalogue model's of the same name
        (:func:`~pyro_invariance._pyro_scope.own_params_in_store`)."""
        with own_params_in_store(self):
            return super().__call__(*args, **kwargs)

    @abstractmethod
    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Sample the latents, observe ``y`` (``None``: sample it) through :meth:`observe`; return the
        prediction for ``x`` (logits, mean or next states; leading dim B)."""

    def observe(
        self, fn: Distribution, y: Tensor | None, x: Tensor, num_data: int | None = None, name: str = "obs"
    ) -> Tensor:
        """Score ``y ~ fn`` for the B rows of the minibatch ``x`` inside ``pyro.plate("data", N,
        subsample=arange(B))`` with ``N = num_data or B``.

        The plate scales the log likelihood by N/B, so the minibatch ELBO is an unbiased estimate of
        the full-data ELBO (paper 003, Eq. 10: (N/B) Σ_{n∈batch} E_q log p(y_n | x_n, θ, η) − KL).
        ``fn`` has batch shape ``(..., B)`` (the plate is the rightmost batch dim). Returns the
        sample site's value (``y`` when observed).

        Raises:
            ValueError: ``num_data`` is not an integer ≥ B (one line naming it).
        """
        batch = x.shape[0]
        if num_data is not None and (
            isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or num_data < batch
        ):
            raise ValueError(f"num_data must be an integer >= batch size {batch}, got {num_data!r}")
        with pyro.plate("data", size=int(num_data or batch), subsample=torch.arange(batch, device=x.device)):
            return pyro.sample(name, fn, obs=y)

    # -- symmetry -----------------------------------------------------------------------------
    def symmetry_parameters(self) -> list[nn.Parameter]:
        """The parameter objects of the learned symmetry (η, λ, learned precisions δ), which
        :func:`pyro_invariance.fit` trains with ``eta_lr``; the optimiser groups them by identity.
        Constrained parameters appear as their unconstrained ``nn.Parameter``. Default: none."""
        return []

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Readable symmetry values for logs and tables (detached): η per generator, λ, δ per block,
        generator norms. A point estimate is read from the model. A latent η has no value outside a
        trace: pass ``sites``, values of :meth:`symmetry_sites` (e.g. the guide's median, as
        :func:`symmetry_summary` does), else the summary is empty. Default: none."""
        return {}

    def symmetry_sites(self) -> list[str]:
        """Names of the latent sample sites that hold η (``symmetry_prior`` set), in the order of
        :meth:`symmetry_summary`'s quantities; ``[]`` when η is a point estimate or fixed. Guides
        carry ``q(η)`` for these sites; ArviZ puts them in the ``posterior`` group."""
        return []

    def latent_symmetry(self, name: str) -> Tensor:
        """The value of the ``PyroSample`` attribute ``name`` in this trace (sampled once per model
        call, then cached by the ``PyroModule`` context), also where a class property of the same
        name (the point-estimate accessor, e.g. ``eta``) hides the attribute."""
        return PyroModule.__getattr__(self, name)

    @classmethod
    def check_symmetry_prior(cls, symmetry_prior: str | None, learn_symmetry: bool = True) -> str | None:
        """``symmetry_prior`` if this model takes it (``None`` or one of :attr:`symmetry_priors`) and it
        is not combined with ``learn_symmetry=False``; else a one-line ``ValueError``."""
        check_symmetry_prior(symmetry_prior, cls.symmetry_priors, cls.__name__)
        if symmetry_prior is not None and not learn_symmetry:
            raise ValueError(
                f"symmetry_prior={symmetry_prior!r} makes η a latent variable; learn_symmetry=False fixes it "
                "at eta_init: choose one"
            )
        return symmetry_prior

    # -- recommendations and capabilities --------------------------------------------------------
    def guide_defaults(self, guide_name: str) -> dict[str, Any]:
        """Keyword arguments :func:`pyro_invariance.guides.get` adds for guide ``guide_name`` (explicit
        arguments win). Default: none."""
        return {}

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims, site -> names
        (:func:`~pyro_invariance.diagnostics.inference_data.to_inference_data`). Default: generic names."""
        return {}

    def arviz_coords(self) -> dict[str, list[Any]]:
        """ArviZ coordinates, dim -> labels. Default: none (a ``class`` dim gets the dataset's names)."""
        return {}

    def log_evidence(self, x: Tensor, y: Tensor) -> Tensor | None:
        """Exact ``log p(y | x, η)`` (a scalar) where the model has it in closed form; default ``None``."""
        return None

    # -- the data boundary ---------------------------------------------------------------------
    @abstractmethod
    def input_shapes(self) -> list[tuple[int, ...]]:
        """Trailing shapes of ``x`` that ``forward`` takes (after the batch dimension)."""

    def target_shapes(self) -> list[tuple[int, ...]]:
        """Trailing shapes of ``y`` (default: one class label per row, ``[()]``)."""
        return [()]

    def prepare_inputs(self, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Checked ``(x, y)`` for this model, once per ``fit`` / ``evaluate`` call (before any compute),
        so that ``forward`` checks shapes only.

        ``x`` ``(N, *input_shape)`` in the model's floating dtype; ``y`` ``(N,)`` int64 labels for
        classification (every label checked against ``[0, num_classes)``), ``(N, *target_shape)``
        floats otherwise (``None`` stays ``None``). Tensors stay on their device.

        Raises:
            ValueError: one line naming ``x`` or ``y``: wrong shape, no rows, complex / bool /
                non-numeric values, non-finite values, labels that are not whole numbers or lie
                outside ``[0, num_classes)``.
        """
        x = as_real_tensor("x", x)
        check_trailing_shape("x", x, self.input_shapes())
        if x.shape[0] == 0:
            raise ValueError(f"x is empty, shape {tuple(x.shape)}")
        if y is not None:
            y = as_real_tensor("y", y)
            if y.dim() < 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"x and y must have the same number of rows, got {tuple(x.shape)} and {tuple(y.shape)}"
                )
            check_trailing_shape("y", y, self.target_shapes())
            if num_classes_of(self) is None and not y.is_floating_point():
                y = y.to(model_dtype(self))  # integer regression targets are numbers too
        return coerce_pair(self, x, y)

    @classmethod
    def check_prior(cls, prior: str) -> str:
        """``prior`` if this model takes it (one of :attr:`priors`); else a one-line ``ValueError``."""
        return check_prior(prior, cls.priors, cls.__name__)


def check_prior(prior: str, allowed: tuple[str, ...], owner: str = "the model") -> str:
    """``prior`` if it is one of ``allowed`` (a subset of :data:`PRIORS`); else ``ValueError``."""
    if prior not in allowed:
        raise ValueError(f"unknown prior {prior!r} for {owner}; use one of {allowed}")
    return prior


def symmetry_parameters(model: Any) -> list[nn.Parameter]:
    """``model.symmetry_parameters()`` for a :class:`CatalogueModel`; ``[]`` for any other model
    (its parameters all train at ``model_lr``)."""
    return list(model.symmetry_parameters()) if isinstance(model, CatalogueModel) else []


def vectorizable_particles(model: Any) -> bool:
    """``model.vectorizable_particles`` for a :class:`CatalogueModel`; ``False`` for any other model
    (its ELBO particles run one after another)."""
    return isinstance(model, CatalogueModel) and bool(model.vectorizable_particles)


def capturable(model: Any) -> bool:
    """``model.capturable`` for a :class:`CatalogueModel`, or for any ``nn.Module`` that declares it;
    ``False`` for any other model (a plain function, a ``PyroModule`` that does not say)."""
    return bool(getattr(model, "capturable", False)) and isinstance(model, nn.Module)


def symmetry_sites(model: Any) -> list[str]:
    """``model.symmetry_sites()`` for a :class:`CatalogueModel`; ``[]`` for any other model."""
    return list(model.symmetry_sites()) if isinstance(model, CatalogueModel) else []


def symmetry_summary(model: Any, guide: Any = None) -> dict[str, Tensor]:
    """``model.symmetry_summary()`` for a :class:`CatalogueModel`; ``{}`` for any other model. A latent
    η (``model.symmetry_sites()``) is summarised by the ``guide``'s median (``{}`` without a guide)."""
    if not isinstance(model, CatalogueModel):
        return {}
    sites = model.symmetry_sites()
    if not sites:
        return dict(model.symmetry_summary())
    if guide is None or not hasattr(guide, "median"):
        return {}
    with pyro_scope(), torch.no_grad():
        median = guide.median()
    return dict(model.symmetry_summary({s: median[s].detach() for s in sites}))


@dataclass
class PrecisionGroup:
    """Sample sites sharing one prior precision ``getattr(module, attr)`` (a 0-d buffer).

    What a model's ``precision_groups()`` returns for the Laplace evidence and the closed-form prior
    updates (:mod:`pyro_invariance.infer.laplace`): defined with the models, which build them.
    """

    name: str
    module: nn.Module
    attr: str
    sites: list[str]

    @property
    def value(self) -> Tensor:
        return getattr(self.module, self.attr)
