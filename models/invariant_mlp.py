"""Invariant shallow Bayesian neural network (paper 003, "Learning Invariant Weights in NNs").

Generative story (paper 003, Eqs. 1–3, 6; docs/methods.md §1)::

    η ∈ [0, η_max]^k                      invariance parameters (point estimate, learned or fixed;
                                           or, with ``symmetry_prior``, a latent site "eta" with
                                           η ~ U(0, η_max) or a scaled logit-normal: full Bayes)
    T_s = expm(Σ_i ε_si η_i G_i),  ε_s ~ U[-1, 1]^k,  s = 1..S          (Eq. 3, shared by a batch)
    h(x) = (1/S) Σ_s φ(W1^(s) x + b1),    W1^(s) = W1 ∘ T_s (rows warped as images)    (Eq. 6)
    σ_p ~ LogNormal(0, 1)                  prior scale of the read-out ("hierarchical", default;
                                           "learned" makes σ_p a point estimate, "fixed" a constant)
    W2 ~ N(0, σ_p² I)   (C × H),   b2 ~ N(0, σ_p² I)   (C,)
    y_n ~ Categorical(logits = W2 h(x_n) + b2)         in a subsampled plate "data"

φ and W1:

- ``activation="rff"``: random Fourier features, W1 fixed with entries N(0, 1/ℓ²), b1 ~ U[0, 2π),
  φ(a) = √(2/H)·cos(a) — a weight-space RBF-kernel GP with lengthscale ℓ (Rahimi & Recht).
- ``activation="relu"``: W1 and b1 learned as point estimates (Xavier init), φ(a) = ReLU(a)/√H.

The average over transforms is taken over hidden features (equivalently over logits, since the
read-out is linear), i.e. the invariant function of Eq. 1 without the soft-max inside g; the
log-likelihood is then evaluated on the averaged logits (second line of Eq. 9, a tighter bound
than the last line). ``transform_on="inputs"`` warps the images instead of the weight rows
(identical up to interpolation; Section 3.2). Fixed η (``learn_symmetry=False``) gives Table 1's
fixed-invariance baselines; ``symmetry="none"`` is the plain MLP.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.nn import PyroParam, PyroSample
from torch import Tensor, nn

from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry.priors import BOUNDED_PRIORS, bounded_prior
from pyro_invariance.symmetry.affine import (
    affine_generators,
    eta_upper_bounds,
    generator_indices,
    lie_exp,
    resolve_subgroup,
    sample_epsilon,
    transform_images,
    transform_weight_rows,
)
from pyro_invariance.tasks import CLASSIFICATION
from pyro_invariance.validation import check_label_shape, check_positive_int, check_trailing_shape

from .base import CatalogueModel

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ACTIVATIONS = ("rff", "relu")


@MODELS.register("invariant-mlp", summary="Invariant shallow BNN learning affine invariance (paper 003)")
class InvariantMLP(CatalogueModel):
    """Shallow BNN whose first layer is averaged over sampled affine transforms.

    Args:
        image_shape: ``(C, h, w)`` of the inputs.
        num_classes: number of classes C.
        hidden: hidden units H.
        activation: ``"rff"`` (fixed random Fourier features, cos) or ``"relu"`` (learned W1).
        symmetry: subgroup name(s) for :func:`pyro_invariance.symmetry.affine.resolve_subgroup`
            (``"rotation"``, ``"translation"``, ``"scale"``, ``"affine"``, ``"none"``, ``"tx+rot"``...).
        learn_symmetry: learn η (by the bound, with ``fit``'s ``eta_lr``) or keep it fixed at ``eta_init``.
        symmetry_prior: ``None`` (η a point estimate, type-II maximum likelihood) or ``"uniform"`` /
            ``"logit-normal"`` (:mod:`pyro_invariance.symmetry.priors`): η becomes the latent site
            ``"eta"`` (shape ``(k,)``, support ``[0, η_max]``), sampled once per forward pass; the
            guide carries ``q(η)`` and ``eta_init`` is unused.
        eta_init: initial η, a float for all generators or a mapping generator -> value. Must be
            > 0 to learn: η = 0 is a stationary point of the expected gradient (docs/methods.md §1).
        eta_max: optional mapping generator -> upper bound (default
            :data:`pyro_invariance.symmetry.affine.DEFAULT_ETA_MAX`; rotation capped at π).
        num_transforms: S transform samples per forward pass.
        sampling: ``"stochastic"`` (ε ~ U) or ``"deterministic"`` (linspace grid; Section 3.4).
        transform_on: ``"weights"`` (default, paper 003) or ``"inputs"``.
        lengthscale: RFF lengthscale ℓ (ignored for ReLU); default √(C·h·w)/8 for inputs in [0, 1]
            (1.0 on 8×8 digits, 3.5 on 28×28 images), where the rotation-averaged RFF model fits
            well (a lengthscale of 3 on digits gave ELBO/N ≈ −2.1 instead of −0.9 at η = π).
        prior: ``"hierarchical"`` (σ_p ~ LogNormal(log prior_scale, 1)), ``"learned"`` (σ_p point
            estimate) or ``"fixed"`` (:data:`~pyro_invariance.models.base.PRIORS`).
        prior_scale: initial / fixed σ_p.
        init_seed: seed for the fixed RFF weights (or the ReLU init), independent of training.

    Shapes: ``forward(x (B, C, h, w) or (B, C·h·w), y (B,))`` → logits ``(B, C)``.

    Inputs: ``forward`` checks shapes and the labels' dtype only (no value is read, so a CUDA
    step never synchronises); :meth:`prepare_inputs` (called by ``fit`` / ``evaluate`` on the
    whole data set, before the first step) converts dtypes and checks values: non-finite ``x``,
    labels outside ``[0, num_classes)``.
    """

    def __init__(
        self,
        image_shape: Sequence[int] = (1, 8, 8),
        num_classes: int = 10,
        hidden: int = 256,
        activation: str = "rff",
        symmetry: str | Sequence[str] = "rotation",
        learn_symmetry: bool = True,
        eta_init: float | Mapping[str, float] = 0.1,
        eta_max: Mapping[str, float] | None = None,
        num_transforms: int = 16,
        sampling: str = "stochastic",
        transform_on: str = "weights",
        lengthscale: float | None = None,
        prior: str = "hierarchical",
        prior_scale: float = 1.0,
        init_seed: int = 0,
        symmetry_prior: str | None = None,
    ) -> None:
        super().__init__()
        self.symmetry_prior = self.check_symmetry_prior(symmetry_prior, learn_symmetry)
        image_shape = tuple(int(v) for v in image_shape)
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ValueError(f"image_shape must be (C, h, w) with positive entries, got {image_shape}")
        check_positive_int("num_classes", num_classes, minimum=2)
        check_positive_int("hidden", hidden)
        check_positive_int("num_transforms", num_transforms)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; use one of {ACTIVATIONS}")
        self.check_prior(prior)
        if sampling not in ("stochastic", "deterministic"):
            raise ValueError(f"unknown sampling {sampling!r}; use 'stochastic' or 'deterministic'")
        if transform_on not in ("weights", "inputs"):
            raise ValueError(f"unknown transform_on {transform_on!r}; use 'weights' or 'inputs'")
        if lengthscale is None:
            lengthscale = math.sqrt(image_shape[0] * image_shape[1] * image_shape[2]) / 8.0
        for name, value in (("lengthscale", lengthscale), ("prior_scale", prior_scale)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")

        self.image_shape = image_shape
        self.input_dim = image_shape[0] * image_shape[1] * image_shape[2]
        self.num_classes = int(num_classes)
        self.hidden = int(hidden)
        self.activation = activation
        self.num_transforms = int(num_transforms)
        self.sampling = sampling
        self.transform_on = transform_on
        self.prior = prior
        self.learn_symmetry = bool(learn_symmetry)

        # --- symmetry parameters η -------------------------------------------------------
        self.generator_names = resolve_subgroup(symmetry)
        k = len(self.generator_names)
        self.register_buffer("generators", affine_generators()[generator_indices(self.generator_names)])
        upper = eta_upper_bounds(self.generator_names, dict(eta_max or {}))
        self.register_buffer("eta_upper", upper)
        init = _eta_init_tensor(eta_init, self.generator_names)
        if torch.any(init < 0) or torch.any(init > upper):
            raise ValueError(f"eta_init {init.tolist()} outside [0, {upper.tolist()}]")
        if self.symmetry_prior is not None and k > 0:
            self.eta = PyroSample(lambda m: bounded_prior(m.symmetry_prior, m.eta_upper))
        elif self.learn_symmetry and k > 0:
            if torch.any(init <= 0) or torch.any(init >= upper):
                raise ValueError("a learned eta_init must lie strictly inside (0, eta_max): η = 0 cannot learn")
            # η = η_max · u with u ∈ (0, 1): constant bounds keep the constraint device-agnostic.
            self.eta_unit = PyroParam(init / upper, constraint=constraints.interval(0.0, 1.0))
        else:
            self.register_buffer("eta_fixed", init)

        # --- first layer ---------------------------------------------------------------
        gen = torch.Generator().manual_seed(int(init_seed))
        if activation == "rff":
            self.register_buffer("w1", torch.randn(hidden, self.input_dim, generator=gen) / lengthscale)
            self.register_buffer("b1", 2 * math.pi * torch.rand(hidden, generator=gen))
        else:
            bound = math.sqrt(6.0 / (hidden + self.input_dim))
            self.w1 = nn.Parameter((2 * torch.rand(hidden, self.input_dim, generator=gen) - 1) * bound)
            self.b1 = nn.Parameter(torch.zeros(hidden))

        # --- read-out prior -----------------------------------------------------------
        if prior == "hierarchical":
            self.register_buffer("prior_scale_loc", torch.tensor(math.log(prior_scale)))
            self.prior_scale = PyroSample(lambda m: dist.LogNormal(m.prior_scale_loc, 1.0))
        elif prior == "learned":
            self.prior_scale = PyroParam(torch.tensor(float(prior_scale)), constraint=constraints.positive)
        else:
            self.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
        c, h = self.num_classes, self.hidden
        self.out_weight = PyroSample(lambda m: dist.Normal(0.0, m.prior_scale).expand([c, h]).to_event(2))
        self.out_bias = PyroSample(lambda m: dist.Normal(0.0, m.prior_scale).expand([c]).to_event(1))

    task = CLASSIFICATION
    priors = ("fixed", "learned", "hierarchical")
    symmetry_priors = BOUNDED_PRIORS

    # ------------------------------------------------------------------------------------
    @property
    def eta_is_latent(self) -> bool:
        """Whether η is the latent site ``"eta"`` (``symmetry_prior`` set, at least one generator)."""
        return self.symmetry_prior is not None and len(self.generator_names) > 0

    @property
    def eta(self) -> Tensor:
        """η, shape ``(k,)`` (constrained to ``[0, η_max]``). A latent η is the site ``"eta"``: its
        value in the current trace (replayed from the guide), a prior draw outside one."""
        if self.eta_is_latent:
            return self.latent_symmetry("eta")
        if self.learn_symmetry and len(self.generator_names):
            return self.eta_unit * self.eta_upper
        return self.eta_fixed

    def symmetry_parameters(self) -> list[nn.Parameter]:
        """``[u]`` with η = η_max·u (the unconstrained parameter behind ``eta_unit``) when η is learned
        as a point estimate; ``[]`` when fixed or latent (then ``q(η)`` lives in the guide)."""
        learned = self.learn_symmetry and len(self.generator_names) and not self.eta_is_latent
        return [self.eta_unit_unconstrained] if learned else []

    def symmetry_summary(self, sites: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Current η per generator name (constrained values, detached); a latent η from ``sites["eta"]``
        (``{}`` without)."""
        if self.eta_is_latent:
            if sites is None:
                return {}
            eta = sites["eta"].detach()
        else:
            eta = self.eta.detach() if len(self.generator_names) else torch.zeros(0)
        return {name: eta[i] for i, name in enumerate(self.generator_names)}

    def symmetry_sites(self) -> list[str]:
        """``["eta"]`` when η is latent."""
        return ["eta"] if self.eta_is_latent else []

    def arviz_coords(self) -> dict[str, list[Any]]:
        """A latent η's ``generator`` dim is labelled by the generator names (``["rot"]``, ...)."""
        return {"generator": list(self.generator_names)} if self.eta_is_latent else {}

    def figures(self, data: Any = None) -> dict[str, Figure]:
        """``"filters"``: the filter bank (paper 003, Fig. 3); ``"orbits"``: the first 5 training
        images of ``data`` moved along the learned orbit. An RFF model's fixed random filters show
        the transforms, not what η learned, so without ``data`` it has no orbit figure; a ReLU model
        shows its first learned filters. A latent η has no single value: no figures (plot ``q(η)``
        with ``az.plot_posterior(pi.to_inference_data(...), var_names=["eta"])``)."""
        if self.eta_is_latent:
            return {}
        from pyro_invariance.data.arrays import train_arrays
        from pyro_invariance.diagnostics.plots import plot_filter_bank, plot_orbits

        out = {"filters": plot_filter_bank(self)}
        if self.activation != "rff":
            out["orbits"] = plot_orbits(self)
        elif data is not None:
            out["orbits"] = plot_orbits(self, train_arrays(data, self)[0][:5])
        return out

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims (:func:`pyro_invariance.diagnostics.inference_data.to_inference_data`)."""
        return {"out_weight": ["class", "hidden"], "out_bias": ["class"], "prior_scale": [], "obs": ["obs_dim_0"],
                "eta": ["generator"]}

    def sample_transforms(self, num_transforms: int | None = None) -> Tensor:
        """S affine matrices T_s = expm(Σ ε_si η_i G_i), shape ``(S, 3, 3)`` (Eq. 3)."""
        s = num_transforms or self.num_transforms
        eta = self.eta
        eps = sample_epsilon(s, len(self.generator_names), self.sampling, dtype=eta.dtype, device=eta.device)
        return lie_exp(eta, eps, self.generators)

    def _phi(self, pre: Tensor) -> Tensor:
        if self.activation == "rff":
            return math.sqrt(2.0 / self.hidden) * torch.cos(pre)
        return F.relu(pre)

    def features(self, x: Tensor) -> Tensor:
        """Invariant hidden features h(x) = (1/S) Σ_s φ(W1^(s) x + b1), shape ``(B, H)``."""
        w1, b1 = self.w1, self.b1
        if not self.generator_names:
            return self._phi(x @ w1.T + b1)
        transforms = self.sample_transforms()
        if self.transform_on == "weights":
            rows = transform_weight_rows(w1, transforms, self.image_shape)  # (S, H, D)
            pre = torch.einsum("bd,shd->bsh", x, rows) + b1
        else:
            s, b = transforms.shape[0], x.shape[0]
            images = x.reshape(1, b, *self.image_shape).expand(s, b, *self.image_shape)
            warped = transform_images(
                images.reshape(s * b, *self.image_shape), transforms.repeat_interleave(b, dim=0)
            )
            pre = (warped.reshape(s, b, -1) @ w1.T + b1).transpose(0, 1)  # (B, S, H)
        return self._phi(pre).mean(dim=1)

    def filter_bank(self, rows: Sequence[int], num: int = 7) -> Tensor:
        """Rows of W1 warped on a linspace of ε ∈ [-1, 1] (paper 003, Fig. 3).

        Returns ``(len(rows), num, C, h, w)``. Uses every generator of the subgroup jointly.
        """
        k = len(self.generator_names)
        eps = torch.linspace(-1, 1, num).unsqueeze(-1).expand(num, k)
        with torch.no_grad():
            w = self.w1[list(rows)]
            if k == 0:
                return w.reshape(len(rows), 1, *self.image_shape).expand(len(rows), num, *self.image_shape)
            transforms = lie_exp(self.eta.detach(), eps.to(w), self.generators)
            out = transform_weight_rows(w, transforms, self.image_shape)  # (num, R, D)
        return out.transpose(0, 1).reshape(len(rows), num, *self.image_shape)

    def input_shapes(self) -> list[tuple[int, ...]]:
        """``x`` rows as images ``(C, h, w)`` or flattened ``(C·h·w,)``."""
        return [self.image_shape, (self.input_dim,)]

    def _flatten(self, x: Tensor) -> Tensor:
        check_trailing_shape("x", x, self.input_shapes())
        return x.reshape(x.shape[0], -1)

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Pyro model: logits ``(B, C)``; observes ``y`` in plate "data" scaled to ``num_data``."""
        x = self._flatten(x)
        if y is not None:
            check_label_shape(y, x.shape[0])
        logits = self.features(x) @ self.out_weight.T + self.out_bias
        self.observe(dist.Categorical(logits=logits), y, x, num_data)
        return logits


def _eta_init_tensor(eta_init: float | Mapping[str, float], names: Sequence[str]) -> Tensor:
    if isinstance(eta_init, Mapping):
        unknown = set(eta_init) - set(names)
        if unknown:
            raise ValueError(f"eta_init names {sorted(unknown)} are not in the subgroup {list(names)}")
        values = [float(eta_init.get(n, 0.1)) for n in names]
    else:
        values = [float(eta_init)] * len(names)
    out = torch.tensor(values, dtype=torch.float32)
    if not torch.isfinite(out).all():
        raise ValueError(f"eta_init must be finite, got {values}")
    return out
