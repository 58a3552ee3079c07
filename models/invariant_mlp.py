"""Invariant shallow Bayesian neural network (paper 003, "Learning Invariant Weights in NNs").

Generative story (paper 003, Eqs. 1–3, 6; docs/methods.md §1)::

    η ∈ [0, η_max]^k                      invariance parameters (point estimate, learned or fixed;
                                           or, with ``symmetry_prior``, a latent site "eta" with
                                           η ~ U(0, η_max) or a scaled logit-normal: full Bayes)
    T_s = expm(Σ_i ε_si η_i G_i),  ε_s ~ U[-1, 1]^k,  s = 1..S          (Eq. 3, shared by a batch)
    h(x) = (1/S) Σ_s φ(W1^(s) x + b1),    W1^(s) = W1 ∘ T_s (rows warped as images)    (Eq. 6)
         = (1/S) Σ_s φ(|det T_s|⁻¹ W1 (x ∘ T_s⁻¹) + b1)   up to interpolation       (Sec. 3.2)
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
than the last line). Fixed η (``learn_symmetry=False``) gives Table 1's fixed-invariance
baselines; ``symmetry="none"`` is the plain MLP.

Warping weights or inputs (``transform_on``; paper 003, Sec. 3.2). With ``(f ∘ T)(p) = f(T p)``
(the :func:`~pyro_invariance.symmetry.affine.transform_images` convention, p in normalised
coordinates) and the pixel sum read as an integral, the substitution q = T p gives, per row w of W1::

    ⟨x, w ∘ T⟩ = Σ_p x(p) w(T p) ≈ |det T|⁻¹ Σ_q x(T⁻¹ q) w(q) = |det T|⁻¹ ⟨x ∘ T⁻¹, w⟩,

with the same zero-padded support on both sides (p and T p both inside the image). So

* ``"weights"`` (default; paper 003, Eq. 6): warp the S·H rows of W1 by T_s, then one ``(H·S, D) × (D, B)``
  matmul; about S·H·D bilinear interpolations;
* ``"inputs"``: warp the S·B images by T_s⁻¹, scale by ``|det T_s|⁻¹ = exp(−Σᵢ ε_si η_i tr Gᵢ)``
  (1 unless the subgroup has ``sx``/``sy``), then one ``(B·S, D) × (D, H)`` matmul; about S·B·D
  interpolations;
* ``"auto"`` (opt-in, for speed): ``"inputs"`` when the batch is smaller than the hidden width
  (B < H), ``"weights"`` otherwise, decided at every call from the shapes.

The two paths use the same draws ε_s and agree transform by transform up to interpolation error
(not only in distribution: an earlier inputs path warped by T_s, pairing ε_s with −ε_s,
and had no Jacobian, a different model for ``sx``/``sy``). The interpolation error is O(h²) for
smooth images (smooth x and W1; tests/models/test_invariant_mlp.py), but bilinear warping low-passes the
white-noise rows of the RFF W1 while the smooth inputs are warped almost exactly, so for RFF models
the two paths' pre-activations differ by ≈10% of their scale at a generic angle. With ``"auto"``
a fit with B < H (inputs) evaluated in chunks of ≥ H rows (weights) therefore scores a slightly
different feature map — and on rotated digits the learned invariance moved (±90° data: q(η) mean
0.95 instead of 0.66 at seed 0; fully rotated: type-II η 1.53 instead of 2.32). That is why the
default stays ``"weights"``, the paper's model: ``"auto"`` / ``"inputs"`` are speed options whose
results are not interchangeable with it for RFF models. The matmul FLOPs (2·S·B·H·D
forward) are the same; the warps differ. Benchmarks: ``benchmarks/results/transform_path.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.nn import PyroParam, PyroSample
from torch import Tensor, nn

from pyro_invariance.registry import MODELS
from pyro_invariance.symmetry.affine import (
    GENERATOR_NAMES,
    SUBGROUPS,
    affine_det,
    affine_generators,
    eta_upper_bounds,
    generator_indices,
    invert_affine,
    lie_exp,
    resolve_subgroup,
    sample_epsilon,
    transform_weight_rows,
    warp_stack,
)
from pyro_invariance.symmetry.priors import BOUNDED_PRIORS, bounded_prior
from pyro_invariance.tasks import CLASSIFICATION
from pyro_invariance.validation import check_label_shape, check_positive_int, check_seed, check_trailing_shape
from pyro_invariance.weight_priors import add_prior_scale, normal_prior

from ._particles import drop_data_dim, num_particles, plate_particle_shape, site_particle_shape
from .base import CatalogueModel

ACTIVATIONS = ("rff", "relu")
#: Values of ``InvariantMLP(transform_on=...)``.
TRANSFORM_PATHS = ("auto", "weights", "inputs")


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
            :data:`pyro_invariance.symmetry.affine.DEFAULT_ETA_MAX`; rotation capped at π). In both
            mappings every key must be a generator of ``symmetry`` (an unknown name is refused, not
            ignored).
        num_transforms: S transform samples per forward pass.
        sampling: ``"stochastic"`` (ε ~ U) or ``"deterministic"`` (linspace grid; Section 3.4).
        transform_on: ``"weights"`` (default: warp W1's rows by T_s, paper 003 Eq. 6), ``"inputs"``
            (warp x by T_s⁻¹ with the Jacobian ``|det T_s|⁻¹``) or ``"auto"`` (warp the inputs when
            the batch B is smaller than ``hidden``, else the weight rows; chosen per call).
            The same function up to interpolation (module docstring, paper 003 Sec. 3.2).
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
        check_seed(init_seed, "init_seed")
        _check_symmetry_spec(symmetry)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; use one of {ACTIVATIONS}")
        self.check_prior(prior)
        if sampling not in ("stochastic", "deterministic"):
            raise ValueError(f"unknown sampling {sampling!r}; use 'stochastic' or 'deterministic'")
        if transform_on not in TRANSFORM_PATHS:
            raise ValueError(f"unknown transform_on {transform_on!r}; use one of {TRANSFORM_PATHS}")
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

        self._set_up_symmetry(symmetry, eta_init, eta_max)
        self._set_up_first_layer(lengthscale, init_seed)

        # --- read-out prior -----------------------------------------------------------
        # σ_p: a buffer, a PyroParam or the site "prior_scale" ~ LogNormal(log prior_scale, 1), whose
        # location is the double-precision log and whose scale 1 is a constant (not a buffer)
        add_prior_scale(
            self, "prior_scale", prior, prior_scale, log_init=math.log(prior_scale), hyperprior_buffer=False
        )
        c, h = self.num_classes, self.hidden
        # normal_prior: a hierarchical σ_p is batched over vectorised particles, (P, 1)
        self.out_weight = PyroSample(lambda m: normal_prior(m.prior_scale, [c, h]))
        self.out_bias = PyroSample(lambda m: normal_prior(m.prior_scale, [c]))

    def _set_up_symmetry(
        self, symmetry: str | Sequence[str], eta_init: float | Mapping[str, float], eta_max: Mapping[str, float] | None
    ) -> None:
        """The symmetry's K affine generators and η ∈ [0, η_max]^K: a latent site under ``symmetry_prior``, a
        parameter η = η_max · u with u ∈ (0, 1) when learned, else a buffer."""
        self.generator_names = resolve_subgroup(symmetry)
        k = len(self.generator_names)
        self.register_buffer("generators", affine_generators()[generator_indices(self.generator_names)])
        # Does T_s change areas (a generator with non-zero trace: sx, sy)? Then the inputs path
        # needs the Jacobian |det T_s|⁻¹.
        self._area_changing = bool((self.generators.diagonal(dim1=-2, dim2=-1).sum(-1) != 0).any())
        upper = eta_upper_bounds(self.generator_names, _eta_max_overrides(eta_max, self.generator_names))
        self.register_buffer("eta_upper", upper)
        init = _eta_init_tensor(eta_init, self.generator_names)
        if torch.any(init < 0) or torch.any(init > upper):
            raise ValueError(
                f"eta_init {_per_generator(init, self.generator_names)} outside [0, eta_max] with eta_max "
                f"{_per_generator(upper, self.generator_names)}"
            )
        if self.symmetry_prior is not None and k > 0:
            self.eta = PyroSample(lambda m: bounded_prior(m.symmetry_prior, m.eta_upper))
        elif self.learn_symmetry and k > 0:
            if torch.any(init <= 0) or torch.any(init >= upper):
                raise ValueError("a learned eta_init must lie strictly inside (0, eta_max): η = 0 cannot learn")
            # η = η_max · u with u ∈ (0, 1): constant bounds keep the constraint device-agnostic.
            self.eta_unit = PyroParam(init / upper, constraint=constraints.interval(0.0, 1.0))
        else:
            self.register_buffer("eta_fixed", init)

    def _set_up_first_layer(self, lengthscale: float, init_seed: int) -> None:
        """The first layer (H, D): fixed random Fourier features (w ~ N(0, I / lengthscale²), b ~ U[0, 2π)), or
        Glorot-uniform point-estimated weights with zero biases; seeded by ``init_seed``."""
        hidden = self.hidden
        gen = torch.Generator().manual_seed(int(init_seed))  # checked above (check_seed)
        if self.activation == "rff":
            self.register_buffer("w1", torch.randn(hidden, self.input_dim, generator=gen) / lengthscale)
            self.register_buffer("b1", 2 * math.pi * torch.rand(hidden, generator=gen))
        else:
            bound = math.sqrt(6.0 / (hidden + self.input_dim))
            self.w1 = nn.Parameter((2 * torch.rand(hidden, self.input_dim, generator=gen) - 1) * bound)
            self.b1 = nn.Parameter(torch.zeros(hidden))

    task = CLASSIFICATION
    priors = ("fixed", "learned", "hierarchical")
    symmetry_priors = BOUNDED_PRIORS
    #: ``forward`` evaluates vectorised ELBO particles in one pass, each with its own transforms
    #: (``_particle_features``).
    vectorizable_particles = True

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

    def guide_defaults(self, guide_name: str) -> dict[str, Any]:
        """Every guide but ``map`` starts at ``init_scale=1.0`` (as wide as the unit prior scale, the
        start its defaults were tuned with, docs/methods.md §6), not at the guides' 0.1. Measured on
        the demo (block-Cholesky, rotated digits, seed 0): from 0.1 the learned-rotation run reached
        η 0.60 rad, accuracy 0.80 after 300 steps (0.71, 0.85 from 1.0) and ended its 1000 steps at
        ELBO/N −0.909, NLL 0.513 (−0.893, 0.503 from 1.0; η 3.015 either way)."""
        return {} if guide_name == "map" else {"init_scale": 1.0}

    def arviz_coords(self) -> dict[str, list[Any]]:
        """A latent η's ``generator`` dim is labelled by the generator names (``["rot"]``, ...)."""
        return {"generator": list(self.generator_names)} if self.eta_is_latent else {}

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dim names of the sample sites' own dims
        (:func:`pyro_invariance.diagnostics.inference_data.to_inference_data`)."""
        return {
            "out_weight": ["class", "hidden"],
            "out_bias": ["class"],
            "prior_scale": [],
            "obs": ["obs_dim_0"],
            "eta": ["generator"],
        }

    def sample_transforms(self, num_transforms: int | None = None, eta: Tensor | None = None) -> Tensor:
        """S affine matrices T_s = expm(Σ ε_si η_i G_i), shape ``(S, 3, 3)`` (Eq. 3); ``eta`` ``(k,)`` in place of
        the model's η (e.g. a value of a latent η outside a model call)."""
        s = num_transforms or self.num_transforms
        if eta is None:
            eta = self.eta
        elif eta.shape != (len(self.generator_names),):
            raise ValueError(
                f"eta must have shape ({len(self.generator_names)},), one value per generator, got {tuple(eta.shape)}"
            )
        eps = sample_epsilon(s, len(self.generator_names), self.sampling, dtype=eta.dtype, device=eta.device)
        return lie_exp(eta, eps, self.generators)

    def _phi(self, pre: Tensor) -> Tensor:
        if self.activation == "rff":
            return math.sqrt(2.0 / self.hidden) * torch.cos(pre)
        return F.relu(pre)

    def transform_path(self, batch_size: int) -> str:
        """``"inputs"`` or ``"weights"``: the path :meth:`features` takes for a batch of ``batch_size``.

        ``"auto"`` warps whichever is smaller: the S·B input images or the S·H weight rows (about
        S·B·D vs S·H·D bilinear interpolations, forward and backward; the matmul FLOPs 2·S·B·H·D are
        the same), i.e. inputs when B < H. Measured (``benchmarks/results/transform_path.md``: 28×28,
        S = 8, H = 256 and 1024, one CPU thread): warping the inputs is 1.3–4× faster for B ≤ H/2, the
        two break even between B = H and B = 2H (the inputs path's matmuls have the larger inner
        dimensions and run faster), and warping the weights is 1.3–1.6× faster at B = 4H; so the
        switch at B = H errs slightly towards the weights path.
        """
        if self.transform_on != "auto":
            return self.transform_on
        return "inputs" if batch_size < self.hidden else "weights"

    def features(self, x: Tensor, eta: Tensor | None = None) -> Tensor:
        """Invariant hidden features h(x) = (1/S) Σ_s φ(W1^(s) x + b1), shape ``(B, H)`` for ``x (B, D)``.

        Warps the weight rows (W1^(s) = W1 ∘ T_s) or the inputs (x ∘ T_s⁻¹, times ``|det T_s|⁻¹``)
        as :meth:`transform_path` decides; see the module docstring for why the two agree. ``eta``
        ``(k,)``: the features at that η instead of the model's (a latent η's value at a fixed point).
        """
        w1, b1 = self.w1, self.b1
        if not self.generator_names:
            return self._phi(x @ w1.T + b1)
        transforms = self.sample_transforms(eta=eta)  # (S, 3, 3), one set shared by the batch
        s, (b, d) = transforms.shape[0], x.shape
        if self.transform_path(b) == "weights":
            rows = transform_weight_rows(w1, transforms, self.image_shape, layout="hsd")  # (H, S, D)
            # one (H·S, D) @ (D, B) matmul: the fastest of einsum / bmm / F.linear (transform_path.md)
            pre = (rows.reshape(-1, d) @ x.T).view(self.hidden, s, b) + b1[:, None, None]  # (H, S, B)
            return self._phi(pre).mean(dim=1).T.contiguous()
        inverse = invert_affine(transforms)
        warped = warp_stack(x.reshape(b, *self.image_shape), inverse).reshape(b, s, d)  # (B, S, D): x ∘ T_s⁻¹
        if self._area_changing:
            warped = warped * affine_det(inverse).unsqueeze(-1)  # |det T_s⁻¹| = |det T_s|⁻¹ (det > 0)
        pre = F.linear(warped, w1, b1)  # (B, S, H)
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
        """Pyro model: logits ``(B, C)``; observes ``y`` in plate "data" scaled to ``num_data``.

        Vectorised particles (:attr:`vectorizable_particles`): under a particle plate of shape ``P``
        left of the data plate (``vectorize_particles=True``), the global sites have shape
        ``(*P, 1, *event)`` and the logits ``(*P, B, C)``; every particle draws its own S transforms
        (:meth:`_particle_features`), as a sequential particle does. Sites and random draws come in
        the sequential order (η, ε, σ_p, W2, b2)."""
        x = self._flatten(x)
        if y is not None:
            check_label_shape(y, x.shape[0])
        particles = plate_particle_shape()
        if self.eta_is_latent:  # the first site, as in `features`
            particles = torch.broadcast_shapes(particles, site_particle_shape(self.eta, 1))
        h = self._particle_features(x, particles) if particles else self.features(x)
        weight, bias = self.out_weight, self.out_bias
        if weight.dim() == 2 and bias.dim() == 1:
            logits = h @ weight.T + bias  # (..., B, C)
        else:  # (*P, 1, C, H), (*P, 1, C): drop the data plate's 1; rows of h take its place
            weight, bias = drop_data_dim(weight, 2), drop_data_dim(bias, 1)
            logits = h @ weight.transpose(-1, -2) + bias.unsqueeze(-2)
        self.observe(dist.Categorical(logits=logits), y, x, num_data)
        return logits

    def _particle_epsilon(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """ε of ``n`` particles, ``(n, S', k)``: ``n·S`` i.i.d. rows in one draw (particle-major, so
        particle i gets the rows a sequential particle would draw i-th), or the deterministic grid
        shared by every particle."""
        k, s = len(self.generator_names), self.num_transforms
        if self.sampling == "deterministic":
            eps = sample_epsilon(s, k, self.sampling, dtype=dtype, device=device)
            return eps.expand(n, *eps.shape)
        return sample_epsilon(n * s, k, self.sampling, dtype=dtype, device=device).reshape(n, s, k)

    #: Largest ``(B, particles, S, H)`` intermediate (elements) that :meth:`_particle_features` makes
    #: at once, per device type (a type not listed: all particles in one block). More particles
    #: than fit run in chunks, still in one model call. On a CPU (one thread) the chunks keep the
    #: blocks in cache: 20 particles, B = 128, H = 256, S = 16 (524k elements per particle) ran
    #: ×0.78 the speed of sequential particles in one block, ×1.4 in blocks of two; with 16k
    #: elements per particle (B = 32, H = 64, S = 8) one block of 20 ran ×6.5, and B = 128,
    #: H = 1024, S = 32 on 28×28 (4M per particle) gains nothing either way.
    particle_chunk_elements: Mapping[str, int] = MappingProxyType({"cpu": 1 << 20})

    def _particle_features(self, x: Tensor, particles: torch.Size) -> Tensor:
        """h(x) per particle, ``(*particles, B, H)``, for vectorised particles: each particle averages
        over its own S transforms ``T = expm(Σ ε_i η_i G_i)`` (its own ε; its own η when η is latent).

        The n·S transforms of the n particles go through :meth:`features`' computation together (one
        warp and one matmul per chunk of :attr:`particle_chunk_elements`; the same path,
        :meth:`transform_path`, for the same batch), and the mean over transforms is taken per
        particle. Deterministic ε with a point-estimate η are the same for every particle: then the
        shared ``features(x)`` ``(B, H)`` is returned. Keep in step with :meth:`features`
        (``tests/models/test_vectorized_particles.py`` compares the two).
        """
        w1, b1 = self.w1, self.b1
        if not self.generator_names:
            return self._phi(x @ w1.T + b1)
        eta = self.eta  # (k,) or latent (*P, 1, k)
        if eta.dim() == 1 and self.sampling == "deterministic":
            return self.features(x)
        n, k = num_particles(particles), len(self.generator_names)
        eta_n = drop_data_dim(eta, 1).expand(*particles, k).reshape(n, 1, k)
        eps = self._particle_epsilon(n, eta.dtype, eta.device)  # (n, S', k)
        s, b = eps.shape[1], x.shape[0]
        # lie_exp's ε·η per row, with η folded into ε (lie_exp multiplies by ones: the same numbers)
        transforms = lie_exp(torch.ones_like(eta_n[0, 0]), (eps * eta_n).reshape(n * s, k), self.generators)
        path = self.transform_path(b)
        budget = self.particle_chunk_elements.get(x.device.type)
        chunk = n if budget is None else max(1, budget // (b * s * self.hidden))
        parts = [self._particle_block(x, t, s, path) for t in transforms.split(chunk * s)]
        return torch.cat(parts).reshape(*particles, b, self.hidden)

    def _particle_block(self, x: Tensor, transforms: Tensor, s: int, path: str) -> Tensor:
        """:meth:`features` of ``c`` particles, ``transforms`` ``(c·S, 3, 3)`` particle-major → ``(c, B, H)``."""
        w1, b1 = self.w1, self.b1
        (b, d), c = x.shape, transforms.shape[0] // s
        if path == "weights":
            rows = transform_weight_rows(w1, transforms, self.image_shape, layout="hsd")  # (H, c·S, D)
            pre = F.linear(x, rows.reshape(-1, d)).view(b, self.hidden, c, s) + b1[:, None, None]
            return self._phi(pre).mean(dim=-1).permute(2, 0, 1)
        inverse = invert_affine(transforms)
        warped = warp_stack(x.reshape(b, *self.image_shape), inverse).reshape(b, c * s, d)
        if self._area_changing:
            warped = warped * affine_det(inverse).unsqueeze(-1)  # |det T_s|⁻¹
        pre = F.linear(warped, w1, b1).view(b, c, s, self.hidden)
        return self._phi(pre).mean(dim=2).transpose(0, 1)


def _check_symmetry_spec(symmetry: Any) -> None:
    """``symmetry`` must be a subgroup name or a sequence of names (``"none"``: no symmetry)."""
    names_ok = isinstance(symmetry, (list, tuple)) and all(isinstance(s, str) for s in symmetry)
    if not (isinstance(symmetry, str) or names_ok):
        raise ValueError(
            f"symmetry must be a subgroup name such as 'rotation' or 'tx+rot', or a list of names "
            f"('none' for no symmetry; subgroups: {', '.join(SUBGROUPS)}), got {symmetry!r}"
        )


def _per_generator_mapping(arg: str, value: Any, names: Sequence[str]) -> dict[str, float]:
    """A mapping generator -> number, every key one of ``names`` (the model's generators) and every
    value a finite number; else a one-line ``ValueError`` naming ``arg``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{arg} must be a mapping generator -> number, got {value!r}")
    unknown = sorted(map(str, set(value) - set(names)))
    if unknown:
        raise ValueError(
            f"{arg} names {unknown}, which are not in the subgroup {list(names)} of the model's symmetry "
            f"(generators: {', '.join(GENERATOR_NAMES)})"
        )
    return {key: _finite_number(f"{arg}[{key!r}]", v) for key, v in value.items()}


def _finite_number(arg: str, value: Any) -> float:
    """``value`` as a finite float (numbers, numpy and 0-d torch scalars; not text or bools)."""
    try:
        v = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError):
        v = None
    if v is None or not math.isfinite(v):
        raise ValueError(f"{arg} must be a finite number, got {value!r}")
    return v


def _eta_max_overrides(eta_max: Mapping[str, float] | None, names: Sequence[str]) -> dict[str, float]:
    """``eta_max`` checked: known generators, positive finite bounds."""
    if eta_max is None:
        return {}
    caps = _per_generator_mapping("eta_max", eta_max, names)
    for key, v in caps.items():
        if v <= 0:
            raise ValueError(f"eta_max[{key!r}] must be a positive number (the upper bound of η), got {eta_max[key]!r}")
    return caps


def _per_generator(values: Tensor, names: Sequence[str]) -> dict[str, float]:
    return {n: round(float(v), 6) for n, v in zip(names, values)}


def _eta_init_tensor(eta_init: float | Mapping[str, float], names: Sequence[str]) -> Tensor:
    if isinstance(eta_init, Mapping):
        given = _per_generator_mapping("eta_init", eta_init, names)
        values = [given.get(n, 0.1) for n in names]
    else:
        values = [_finite_number("eta_init", eta_init)] * len(names)
    return torch.tensor(values, dtype=torch.float32)
