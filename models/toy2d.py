"""Rotation-invariant Bayesian classifier on 2-D inputs: the toy of paper 003, Figure 1.

The invariant model of paper 003 (Eqs. 1–3, 6) in the plane, small enough for NUTS: random
Fourier features of the 2-D input averaged over rotations by angles ε·η, and a Bayesian linear
read-out. Data: :func:`pyro_invariance.data.toy2d.make_rotation_toy` (registered ``"rotation-toy-2d"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam, PyroSample
from torch import Tensor, nn

from pyro_invariance.data import toy2d  # noqa: F401  (registers the "rotation-toy-2d" dataset)
from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry.priors import BOUNDED_PRIORS, bounded_prior
from pyro_invariance.tasks import CLASSIFICATION
from pyro_invariance.validation import check_label_shape, check_positive_int, check_seed, check_trailing_shape
from pyro_invariance.weight_priors import add_prior_scale, normal_prior

from ._particles import drop_data_dim, num_particles, plate_particle_shape, site_particle_shape
from .base import CatalogueModel

__all__ = ["RotationToy2D", "rotation_grid"]

SAMPLINGS = ("deterministic", "stochastic")


def rotation_grid(num_transforms: int, dtype: torch.dtype = torch.float32, device: Any = None) -> Tensor:
    """Midpoints ε_s = −1 + (2s − 1)/S, s = 1..S, of S equal cells of [−1, 1], shape ``(S,)``.

    At η = π the angles ηε_s are S equally spaced angles around the circle (no angle counted twice,
    unlike a linspace with both end points), so the averaged features are exactly invariant to
    rotations by multiples of 2π/S and, for smooth features, invariant to any rotation up to the
    quadrature error of an S-point trapezoid rule on a periodic function.
    """
    check_positive_int("num_transforms", num_transforms)
    return -1.0 + (2.0 * torch.arange(num_transforms, dtype=dtype, device=device) + 1.0) / num_transforms


def uniform_epsilon(num: int, dtype: torch.dtype = torch.float32, device: Any = None) -> Tensor:
    """``num`` i.i.d. ε ~ U[−1, 1], shape ``(num,)`` (``sampling="stochastic"``)."""
    return 2.0 * torch.rand(num, dtype=dtype, device=device) - 1.0


@MODELS.register(
    "rotation-toy-2d",
    summary="2-D RFF classifier averaged over rotations by ε·η (paper 003 Fig. 1 toy; small enough for NUTS)",
)
class RotationToy2D(CatalogueModel):
    r"""Bayesian RFF classifier on 2-D inputs with learnable rotational invariance (paper 003, Fig. 1).

    Generative story (paper 003, Eqs. 1–3 and 6, with the rotation generator of docs/methods.md §1)::

        η ∈ [0, π]                                  amount of rotational invariance (point estimate,
                                                    learned or fixed; η = π is full SO(2) invariance;
                                                    with ``symmetry_prior`` the latent site "eta")
        θ_s = η ε_s,  s = 1..S                      ε_s on a midpoint grid of [−1, 1] ("deterministic")
                                                    or ε_s ~ U[−1, 1] per forward pass ("stochastic")
        h(x) = (1/S) Σ_s √(2/H) cos(W1 R(θ_s) x + b1)      invariant features, (H,)  (Eq. 6)
        W1 ∈ R^{H×2}, W1_hj ~ N(0, ℓ⁻²), b1_h ~ U[0, 2π)    fixed random Fourier features (RBF kernel, ℓ)
        W ~ N(0, σ_p² I)   ((C−1) × H)               site "out_weight"
        b ~ N(0, σ_p² I)   (C−1,)                    site "out_bias"
        logits(x) = [0, W h(x) + b]                  class 0 is the reference class
        y_n ~ Categorical(logits(x_n))               site "obs" in plate "data" (subsampled)

    ``R(θ)`` is the 2×2 rotation by θ; rotating the rows of ``W1`` ("transform on the weights",
    as paper 003) is the same as rotating the input, ``(W1 R(θ)) x = W1 (R(θ) x)``. The average over
    transforms is taken over the hidden features, and the likelihood is evaluated on the averaged
    logits (second line of paper 003's Eq. 9), as in :class:`~models.invariant_mlp.InvariantMLP`.
    Class 0's logit is fixed at 0 so that the read-out is identifiable: for C = 2 the model is a
    Bayesian logistic regression on ``h(x)`` with ``H + 1`` latent coordinates (33 at the default
    ``hidden=32``), which NUTS samples in seconds (:mod:`pyro_invariance.diagnostics.reference`).

    In the continuum limit (η = π, S → ∞) the averaged feature is a function of the radius only,
    ``h_j(x) = √(2/H) J₀(‖W1_j‖ ‖x‖) cos(b1_j)``. With the default ``sampling="deterministic"`` the
    model is a deterministic function of its latents (what NUTS and exact ELBO comparisons need) and
    at η = π exactly invariant to rotations by multiples of 2π/S (:func:`rotation_grid`); for
    ``‖W1_j‖‖x‖ ≪ S`` the S-point average equals the integral to many digits, so it is
    invariant to every rotation in practice.

    Args:
        num_classes: C ≥ 2.
        hidden: H, number of random Fourier features.
        lengthscale: ℓ of the RBF kernel that the features approximate.
        num_transforms: S, rotations averaged per forward pass.
        sampling: ``"deterministic"`` (midpoint grid, default) or ``"stochastic"`` (ε ~ U[−1, 1]).
        learn_symmetry: learn η (``fit`` uses its ``eta_lr``) or keep it fixed at ``eta_init``.
        symmetry_prior: ``None`` (η a point estimate) or ``"uniform"`` / ``"logit-normal"`` on
            ``[0, π]`` (:mod:`pyro_invariance.symmetry.priors`): η is the latent scalar site ``"eta"``.
        eta_init: initial / fixed η in radians, in ``[0, π]`` (``(0, π)`` when learned: η = 0 is
            a stationary point of the gradient, docs/methods.md §1).
        prior_scale: σ_p, standard deviation of the read-out weights and biases (``prior="fixed"``,
            the only prior this model takes).
        init_seed: seed of the fixed ``W1``, ``b1``.

    Shapes: ``forward(x (B, 2), y (B,) int64 or None, num_data=None)`` → logits ``(B, C)``.
    ``forward`` checks shapes and dtypes only; values (non-finite ``x``, labels outside
    ``[0, C)``) are checked once by :meth:`prepare_inputs`, which ``fit`` / ``evaluate`` call.
    """

    def __init__(
        self,
        num_classes: int = 2,
        hidden: int = 32,
        lengthscale: float = 0.75,
        num_transforms: int = 32,
        sampling: str = "deterministic",
        learn_symmetry: bool = True,
        eta_init: float = 0.1,
        prior: str = "fixed",
        prior_scale: float = 3.0,
        init_seed: int = 0,
        symmetry_prior: str | None = None,
    ) -> None:
        super().__init__()
        self.symmetry_prior = self.check_symmetry_prior(symmetry_prior, learn_symmetry)
        self.num_classes = check_positive_int("num_classes", num_classes, minimum=2)
        self.hidden = check_positive_int("hidden", hidden)
        self.num_transforms = check_positive_int("num_transforms", num_transforms)
        self.prior = self.check_prior(prior)
        if sampling not in SAMPLINGS:
            raise ValueError(f"unknown sampling {sampling!r}; use one of {SAMPLINGS}")
        self.sampling = sampling
        for name, value in (("lengthscale", lengthscale), ("prior_scale", prior_scale)):
            bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
            if bad_type or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        self.lengthscale = float(lengthscale)
        self.learn_symmetry = bool(learn_symmetry)
        try:
            eta0 = float(eta_init)
        except (TypeError, ValueError):
            raise ValueError(f"eta_init must be a number in [0, π], got {eta_init!r}") from None
        # Accept π given in float32 (3.1415927 > math.pi by 9e-8).
        if not (0.0 <= eta0 <= math.pi + 1e-6):
            raise ValueError(f"eta_init must lie in [0, π], got {eta_init!r}")
        eta0 = min(eta0, math.pi)
        if self.symmetry_prior is not None:
            self.register_buffer("eta_upper", torch.tensor(math.pi))
            self.eta = PyroSample(lambda m: bounded_prior(m.symmetry_prior, m.eta_upper))
        elif self.learn_symmetry:
            if not 0.0 < eta0 < math.pi:
                raise ValueError(
                    f"a learned eta_init must lie strictly inside (0, π) (η = 0 cannot learn), got {eta_init!r}"
                )
            # η = π·u with u ∈ (0, 1), as InvariantMLP; symmetry_parameters() gives u to fit's eta_lr.
            self.eta_unit = PyroParam(torch.tensor(eta0 / math.pi), constraint=constraints.interval(0.0, 1.0))
        else:
            self.register_buffer("eta_fixed", torch.tensor(eta0))

        gen = torch.Generator().manual_seed(check_seed(init_seed, "init_seed"))
        self.register_buffer("w1", torch.randn(self.hidden, 2, generator=gen) / self.lengthscale)
        self.register_buffer("b1", 2 * math.pi * torch.rand(self.hidden, generator=gen))
        add_prior_scale(self, "prior_scale", self.prior, prior_scale)  # "fixed": the buffer σ_p
        k, h = self.num_classes - 1, self.hidden
        self.out_weight = PyroSample(lambda m: normal_prior(m.prior_scale, [k, h]))
        self.out_bias = PyroSample(lambda m: normal_prior(m.prior_scale, [k]))

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, hidden={self.hidden}, lengthscale={self.lengthscale}, "
            f"num_transforms={self.num_transforms}, sampling={self.sampling!r}, learn_symmetry={self.learn_symmetry}"
        )

    task = CLASSIFICATION
    priors = ("fixed",)
    symmetry_priors = BOUNDED_PRIORS
    #: ``forward`` evaluates vectorised ELBO particles in one pass (``_particle_features``).
    vectorizable_particles = True

    # ------------------------------------------------------------------------------------------
    @property
    def eta(self) -> Tensor:
        """η in radians, a scalar tensor in ``[0, π]`` (a latent η: its value in the current trace)."""
        if self.symmetry_prior is not None:
            return self.latent_symmetry("eta")
        return self.eta_unit * math.pi if self.learn_symmetry else self.eta_fixed

    def symmetry_parameters(self) -> list[nn.Parameter]:
        """``[u]`` with η = π·u (the unconstrained parameter behind ``eta_unit``) when η is learned as a
        point estimate; ``[]`` when fixed or latent."""
        return [self.eta_unit_unconstrained] if self.learn_symmetry and self.symmetry_prior is None else []

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``{"rot": η}`` (detached), for logging; a latent η from ``sites["eta"]`` (``{}`` without)."""
        if self.symmetry_prior is not None:
            return {} if sites is None else {"rot": sites["eta"].detach().clone()}
        return {"rot": self.eta.detach().clone()}

    def symmetry_sites(self) -> list[str]:
        """``["eta"]`` when η is latent."""
        return ["eta"] if self.symmetry_prior is not None else []

    def guide_defaults(self, guide_name: str) -> dict[str, Any]:
        """Every guide but ``map`` starts at ``init_scale=1.0`` (the guides' start before they took
        Pyro's 0.1). Measured on the ``rotation-toy-2d`` data (``pi.fit`` defaults, fit seeds 0-3): from
        0.1 the ELBO/N ended lower for matrix-normal on 4 of 4 seeds (by 0.009 on average) and for
        full-rank on 3 of 4 (0.004), and full-rank's held-out accuracy fell from 0.98 to 0.81 on seed 3."""
        return {} if guide_name == "map" else {"init_scale": 1.0}

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims
        (:func:`pyro_invariance.diagnostics.inference_data.to_inference_data`)."""
        return {"out_weight": ["logit", "hidden"], "out_bias": ["logit"], "obs": ["obs_dim_0"], "eta": []}

    def angles(self) -> Tensor:
        """The S rotation angles θ_s = η ε_s of this forward pass, shape ``(S,)``."""
        eta = self.eta
        if self.sampling == "deterministic":
            eps = rotation_grid(self.num_transforms, dtype=eta.dtype, device=eta.device)
        else:
            eps = uniform_epsilon(self.num_transforms, dtype=eta.dtype, device=eta.device)
        return eta * eps

    def features(self, x: Tensor) -> Tensor:
        """Invariant features ``h(x) = (1/S) Σ_s √(2/H) cos(W1 R(θ_s) x + b1)``, shape ``(B, H)``."""
        theta = self.angles()
        cos, sin = theta.cos(), theta.sin()
        rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (S, 2, 2)
        rows = torch.einsum("hi,sij->shj", self.w1, rot.to(self.w1.dtype))  # rows of W1 R(θ_s)
        pre = torch.einsum("bj,shj->bsh", x.to(rows.dtype), rows) + self.b1
        return (math.sqrt(2.0 / self.hidden) * torch.cos(pre)).mean(dim=1)

    def logits_from(self, h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``[0, W h + b]`` for features ``h`` ``(B, H)`` and read-out draws ``weight`` ``(..., C−1, H)``,
        ``bias`` ``(..., C−1)``; returns ``(..., B, C)``."""
        rest = h @ weight.transpose(-1, -2) + bias.unsqueeze(-2)
        return torch.cat([torch.zeros_like(rest[..., :1]), rest], dim=-1)

    def input_shapes(self) -> list[tuple[int, ...]]:
        """``x`` rows are points ``(2,)`` in the plane."""
        return [(2,)]

    def _check_x(self, x: Any) -> Tensor:
        x = torch.as_tensor(x)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        check_trailing_shape("x", x, self.input_shapes())
        if x.shape[0] < 1:
            raise ValueError("x is empty")
        return x

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Pyro model: logits ``(B, C)``; observes ``y`` in plate "data" scaled to ``num_data``."""
        x = self._check_x(x)
        batch = x.shape[0]
        if y is not None:
            check_label_shape(y, batch)
        particles = plate_particle_shape()
        if self.symmetry_prior is not None:  # the first site, as in `features`
            particles = torch.broadcast_shapes(particles, site_particle_shape(self.eta, 0))
        h = self._particle_features(x, particles) if particles else self.features(x)
        # vectorised particles: (*P, 1, C−1, H), (*P, 1, C−1) → logits (*P, B, C)
        logits = self.logits_from(h, drop_data_dim(self.out_weight, 2), drop_data_dim(self.out_bias, 1))
        self.observe(dist.Categorical(logits=logits), y, x, num_data)
        return logits

    def _particle_features(self, x: Tensor, particles: torch.Size) -> Tensor:
        """h(x) per particle, ``(*particles, B, H)``, for vectorised particles (:attr:`vectorizable_particles`):
        each particle rotates by its own angles η ε_s (its own ε when ``sampling="stochastic"``, its own
        η when latent). With the midpoint grid and a point-estimate η every particle has the same
        features: then the shared ``features(x)`` ``(B, H)`` is returned."""
        eta = self.eta  # () or latent (*P, 1)
        if eta.dim() == 0 and self.sampling == "deterministic":
            return self.features(x)
        n, s = num_particles(particles), self.num_transforms
        if self.sampling == "deterministic":
            eps = rotation_grid(s, dtype=eta.dtype, device=eta.device).expand(n, s)
        else:  # particle-major: particle i gets the draws a sequential particle would make i-th
            eps = uniform_epsilon(n * s, dtype=eta.dtype, device=eta.device).reshape(n, s)
        theta = drop_data_dim(eta, 0).expand(particles).reshape(n, 1) * eps  # (n, S)
        cos, sin = theta.cos(), theta.sin()
        rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (n, S, 2, 2)
        rows = torch.einsum("hi,nsij->nshj", self.w1, rot.to(self.w1.dtype))
        pre = torch.einsum("bj,nshj->nbsh", x.to(rows.dtype), rows) + self.b1
        h = (math.sqrt(2.0 / self.hidden) * torch.cos(pre)).mean(dim=2)  # (n, B, H)
        return h.reshape(*particles, x.shape[0], self.hidden)
